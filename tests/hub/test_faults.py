"""Fault injection on the local endpoint: every outcome is success or a clear error, never a
partial cube in the target folder."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import types
from pathlib import Path

import pytest

import cubepack
from cubepack import CubepackError, HubError
from cubepack._util import atomic
from cubepack.cube._verify import ORIGIN_FILE
from cubepack.hub import pull, push
from cubepack.testing.hub import InstrumentedHub

from helpers import tree_bytes

KEPT = {"kept.txt": b"the folder as it was"}


@pytest.fixture(scope="module")
def big_cube(packed_cube_factory):
    """A cube with one ~4 MB activation, so a throttled download takes a while."""
    return packed_cube_factory({"big": list(range(4, 402)), "small": [5, 6, 7]})


@pytest.fixture
def target(tmp_path):
    folder = tmp_path / "target"
    folder.mkdir()
    (folder / "kept.txt").write_bytes(KEPT["kept.txt"])
    return folder


def outcome_is_clean(run, target, cube) -> str:
    """Run a pull; require success with the whole cube, or a one-sentence error with the
    target untouched. Return which happened."""
    try:
        run()
    except CubepackError as error:
        assert "\n" not in str(error).strip() or isinstance(error, cubepack.VerificationFailed)
        assert tree_bytes(target) == KEPT
        return "error"
    pulled = tree_bytes(target)
    pulled.pop(".gitattributes", None)
    pulled.pop(".cache/cubepack/origin.json", None)
    assert pulled == tree_bytes(cube)
    return "success"


def test_slow_responses_past_the_client_timeout(big_cube, tmp_path, target, monkeypatch):
    from huggingface_hub import constants as hub_constants

    monkeypatch.setattr(hub_constants, "HF_HUB_DOWNLOAD_TIMEOUT", 0.5)
    monkeypatch.setattr(hub_constants, "HF_HUB_ETAG_TIMEOUT", 0.5)
    with InstrumentedHub(tmp_path / "hub") as hub:
        sha = push(big_cube, "ns/slow", endpoint=hub.url, allow_local_paths=True).commit_sha
        hub.add_fault("delay", path=r"/resolve/.*big\.kv", method="GET", times=2, seconds=1.5)
        def run():
            return pull(f"ns/slow@{sha}", endpoint=hub.url, local_dir=target, force=True,
                        cache_dir=tmp_path / "c")

        assert outcome_is_clean(run, target, big_cube) in ("success", "error")
        assert outcome_is_clean(run, target, big_cube) == "success"


def test_failing_push_leaves_no_commit_and_a_retry_succeeds(big_cube, tmp_path):
    with InstrumentedHub(tmp_path / "hub") as hub:
        hub.add_fault("500", path=r"/commit/", method="POST", times=1000)
        with pytest.raises(HubError) as caught:
            push(big_cube, "ns/flaky", endpoint=hub.url, allow_local_paths=True)
        assert "\n" not in str(caught.value)
        assert hub.stats.commits == 0
        hub.faults.clear()
        assert push(big_cube, "ns/flaky", endpoint=hub.url, allow_local_paths=True).changed


def test_a_pull_killed_with_sigkill_then_rerun(big_cube, tmp_path, target):
    with InstrumentedHub(tmp_path / "hub", max_rate=1_000_000) as hub:  # 1 MB/s: the pull takes seconds
        sha = push(big_cube, "ns/killed", endpoint=hub.url, allow_local_paths=True).commit_sha
        env = dict(os.environ, HF_ENDPOINT=hub.url, HF_HUB_CACHE=str(tmp_path / "cache"),
                   HF_HUB_DISABLE_PROGRESS_BARS="1")
        client = subprocess.Popen([sys.executable, "-m", "cubepack", "pull", f"ns/killed@{sha}",
                                   "--local-dir", str(target), "--force"], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            assert hub.wait_for_request(r"^GET .*/resolve/.*big\.kv\.safetensors", timeout=120)
        finally:
            client.send_signal(signal.SIGKILL)
            client.wait()
        assert client.returncode == -signal.SIGKILL
        assert tree_bytes(target) == KEPT
        leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".target.pull.")]
        hub.link = None  # full speed for the re-run
        result = pull(f"ns/killed@{sha}", endpoint=hub.url, local_dir=target,
                      force=True,
                      cache_dir=tmp_path / "cache")
        assert result.report.ok
        after = [p.name for p in tmp_path.iterdir() if p.name.startswith(".target.pull.")]
        assert after == [] and len(leftovers) <= 1  # the dead run's staging folder is removed


@pytest.mark.parametrize("folder_exists", [True, False])
def test_two_pulls_into_the_same_cache_and_folder_at_once(big_cube, tmp_path, target,
                                                          folder_exists):
    if not folder_exists:
        shutil.rmtree(target)
    with InstrumentedHub(tmp_path / "hub", max_rate=20_000_000) as hub:
        sha = push(big_cube, "ns/twice", endpoint=hub.url, allow_local_paths=True).commit_sha
        outcomes, errors = [], []

        def run():
            try:
                outcomes.append(pull(f"ns/twice@{sha}", endpoint=hub.url, local_dir=target,
                                     force=True,
                                     cache_dir=tmp_path / "shared-cache"))
            except Exception as exc:  # noqa: BLE001 - collected and asserted below
                errors.append(exc)

        threads = [threading.Thread(target=run) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    raced = [error for error in errors if refresh_race(error, target)]
    assert [error for error in errors if error not in raced] == []
    assert len(outcomes) + len(raced) == 2
    assert all(result.commit_sha == sha and result.report.ok for result in outcomes)
    assert cubepack.verify(target).ok
    shutil.rmtree(target)
    if raced:  # everything else held: only the known race, forced in the test below
        pytest.xfail(f"the pull-record race (see {RACE_TEST}) hit: {raced[0]}")


#: The test that forces the race some runs of the test above hit by chance.
RACE_TEST = "test_a_pull_whose_folder_is_swapped_out_while_it_refreshes_its_record_succeeds"


def refresh_race(error: BaseException, target) -> bool:
    """Is ``error`` the known race (see :data:`RACE_TEST`): the refreshed record's temp file
    gone from ``target/.cache/cubepack/`` because another pull swapped its folder in?"""
    if not isinstance(error, FileNotFoundError) or not error.filename:
        return False
    temp = Path(error.filename)
    return temp.parent == (target / ORIGIN_FILE).parent and \
        temp.name.startswith(".origin.json.") and temp.name.endswith(".tmp")


class Interleaving:
    """Two pulls into one folder, forced through one order of their steps (events, not
    timing). Pull A is the first to link a blob into its staging folder; pull B the other.
    Each hook waits, at most ``HANG`` seconds, for the other pull to reach a step."""

    HANG = 120

    def __init__(self, monkeypatch, target):
        self.target = target
        self._first: list[int] = []
        self._reached: set[tuple[str, bool]] = set()
        self._changed = threading.Condition()
        link, place, real_os = atomic.link_or_copy, atomic.replace_dir, atomic.os

        def link_or_copy(source, destination):
            if not self.is_a():  # B links the blobs once A placed its folder (keys recorded)
                self.after("placed", by_a=True)
            link(source, destination)

        def replace_dir(staged, where):
            if not self.is_a():  # B swaps its folder in while A's refreshed record is written
                self.after("refreshing", by_a=True)
            place(staged, where)
            self.reach("placed")
            if self.is_a():  # A refreshes its record once B's new links changed the ctimes
                self.after("recorded", by_a=False)

        def replace(source, destination):
            placed_record = os.fspath(destination) == os.fspath(self.target / ORIGIN_FILE)
            if placed_record and self.is_a():  # A's refreshed record: written, not renamed yet
                self.reach("refreshing")
                self.after("placed", by_a=False)
            result = real_os.replace(source, destination)
            if os.path.basename(destination) == "origin.json" and not placed_record:
                self.reach("recorded")  # a record written in a staging folder
            return result

        monkeypatch.setattr(atomic, "link_or_copy", link_or_copy)
        monkeypatch.setattr(atomic, "replace_dir", replace_dir)
        monkeypatch.setattr(atomic, "os", types.SimpleNamespace(**{**vars(real_os),
                                                                    "replace": replace}))

    def is_a(self) -> bool:
        with self._changed:
            self._first[:] = self._first or [threading.get_ident()]
            return self._first[0] == threading.get_ident()

    def reach(self, step: str) -> None:
        with self._changed:
            self._reached.add((step, self.is_a()))
            self._changed.notify_all()

    def after(self, step: str, *, by_a: bool) -> None:
        with self._changed:
            assert self._changed.wait_for(lambda: (step, by_a) in self._reached, self.HANG), \
                f"pull {'A' if by_a else 'B'} never reached {step!r}"


@pytest.mark.xfail(strict=True, raises=FileNotFoundError, reason=(
    "race in cubepack.hub._pull._refresh_origin: it rewrites the record through the path "
    "<target>, which a concurrent pull's replace_dir swaps (see the docstring); due to go when "
    "pull copies files instead of hard-linking HF-cache blobs"))
@pytest.mark.parametrize("folder_exists", [True, False])
def test_a_pull_whose_folder_is_swapped_out_while_it_refreshes_its_record_succeeds(
        big_cube, tmp_path, target, folder_exists, monkeypatch):
    """The interleaving behind the flaky test above, forced:

    1. A places its folder (replace_dir), its record holding each file's stat key;
    2. B hard-links the same blobs into its staging folder: their ctime changes, so A's keys
       are stale, and B writes its own record;
    3. A's _refresh_origin sees the new ctimes and writes a refreshed record into
       ``target/.cache/cubepack/``: temp file made and written, not yet renamed over;
    4. B's replace_dir swaps its folder in at ``target`` (A's folder is now B's staging
       folder, deleted);
    5. A renames ``target/.cache/cubepack/.origin.json.*.tmp``: that path is now in B's folder,
       where no such file is: FileNotFoundError out of pull(), though the cube is placed.
    """
    if not folder_exists:
        shutil.rmtree(target)
    with InstrumentedHub(tmp_path / "hub") as hub:
        sha = push(big_cube, "ns/twice", endpoint=hub.url, allow_local_paths=True).commit_sha
        Interleaving(monkeypatch, target)  # the two pulls' steps only
        outcomes, errors = [], []

        def run():
            try:
                outcomes.append(pull(f"ns/twice@{sha}", endpoint=hub.url, local_dir=target,
                                     force=True, cache_dir=tmp_path / "shared-cache"))
            except Exception as exc:  # noqa: BLE001 - raised below
                errors.append(exc)

        threads = [threading.Thread(target=run) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    if errors:
        raise errors[0]
    assert all(result.commit_sha == sha and result.report.ok for result in outcomes)
    assert cubepack.verify(target).ok
