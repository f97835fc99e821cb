"""Fault injection on the local endpoint: every outcome is success or a clear error, never a
partial cube in the target folder."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading

import pytest

import cubepack
from cubepack import CubepackError, HubError
from cubepack.hub import pull, push
from cubepack.testing.hub import InstrumentedHub

from helpers import pulled_files, tree_bytes

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
    pulled = pulled_files(target)
    pulled.pop(".gitattributes", None)
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
    # Placed files are copies, not links to the shared cache's blobs: neither pull's record
    # goes stale when the other places its files, and there is nothing to refresh (the race a
    # hard-linked pull had: its refreshed record renamed inside a folder the other replaced).
    assert errors == [] and len(outcomes) == 2
    assert all(result.commit_sha == sha and result.report.ok for result in outcomes)
    assert cubepack.verify(target).ok
    blobs = {os.stat(blob).st_ino for blob in (tmp_path / "shared-cache").rglob("blobs/*")}
    assert not blobs & {path.stat().st_ino for path in target.rglob("*") if path.is_file()}
