"""A pull never loses a user's bytes: the folder it replaces must be exactly what an earlier
pull placed there (every file compared with the pull's record), and no pull, forced or not,
replaces or writes into a cache."""

from __future__ import annotations

import json
import os
import threading

import pytest

from cubepack import UsageError
from cubepack.hub import _pull, pull, push
from cubepack.testing.hub import InstrumentedHub

from helpers import tree_bytes

ORIGIN = ".cache/cubepack/origin.json"


@pytest.fixture(scope="module")
def hub(tmp_path_factory, packed_cube_factory):
    with InstrumentedHub(tmp_path_factory.mktemp("hub")) as server:
        server.sha = push(packed_cube_factory(), "ns/cube", endpoint=server.url,
                          allow_local_paths=True).commit_sha
        yield server


@pytest.fixture
def do_pull(hub, tmp_path):
    def run(target, **kwargs):
        kwargs.setdefault("cache_dir", tmp_path / "hf-cache")
        return pull(f"ns/cube@{hub.sha}", endpoint=hub.url, local_dir=target, **kwargs)
    return run


@pytest.fixture
def pulled(do_pull, tmp_path):
    target = tmp_path / "cube"
    do_pull(target)
    return target


def refused(do_pull, target, hub, *names):
    """A pull into ``target`` is refused before any download, naming ``names`` and --force,
    and leaves every byte of ``target`` as it was."""
    before = tree_bytes(target)
    hub.stats.reset()
    with pytest.raises(UsageError) as caught:
        do_pull(target)
    for name in names:
        assert name in str(caught.value)
    assert "--force" in str(caught.value)
    assert not [key for key in hub.stats.requests if "/resolve/" in key]
    assert tree_bytes(target) == before
    return str(caught.value)


def test_the_origin_records_every_placed_file(pulled):
    origin = json.loads((pulled / ORIGIN).read_text())
    placed = set(tree_bytes(pulled)) - {ORIGIN}
    assert set(origin["files"]) == placed
    for name, entry in origin["files"].items():
        st = os.stat(pulled / name)
        assert entry["size"] == st.st_size and entry["stat"][1] == str(st.st_ino)
        assert st.st_nlink == 1  # a file of its own, not a link to the HF cache's blob


def test_an_unchanged_earlier_pull_is_replaced_without_hashing_it_again(do_pull, pulled,
                                                                        monkeypatch):
    calls = []
    original = _pull.hash_files
    monkeypatch.setattr(_pull, "hash_files", lambda paths, **kw: calls.append(list(paths))
                        or original(paths, **kw))
    _pull.check_target(pulled, "ns/cube", "dataset", force=False)
    assert calls == []  # every stat key matched: nothing to read
    assert do_pull(pulled).report.ok


@pytest.mark.parametrize("how", ["in place", "in place, mtime set back", "replaced"])
def test_an_edited_config_json_is_refused_and_kept_byte_for_byte(do_pull, pulled, hub, how):
    config = pulled / "config.json"
    edited = config.read_bytes().replace(b"{", b"{ ", 1)
    if how == "replaced":  # an editor writing a new file and renaming it over the old one
        config.unlink()
        config.write_bytes(edited)
    else:
        st = os.stat(config)
        with open(config, "r+b") as handle:  # same size when the mtime is set back
            handle.write(edited[:st.st_size])
        if how == "in place, mtime set back":
            os.utime(config, ns=(st.st_atime_ns, st.st_mtime_ns))
    kept = config.read_bytes()
    message = refused(do_pull, pulled, hub, "config.json (changed)")
    assert "changed or added since it was pulled" in message
    assert config.read_bytes() == kept


@pytest.mark.parametrize("added", [".cache/huggingface/my-notes.txt", "activations/mine.bin",
                                   "notes.md", "drafts/"])
def test_a_file_added_anywhere_is_refused(do_pull, pulled, hub, added):
    path = pulled / added
    if added.endswith("/"):
        path.mkdir()
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("mine")
    refused(do_pull, pulled, hub, f"{added} (added)")
    assert path.exists()


def test_a_link_in_place_of_a_pulled_file_is_refused(do_pull, pulled, hub, tmp_path):
    (tmp_path / "elsewhere.md").write_text("mine")
    (pulled / "README.md").unlink()
    (pulled / "README.md").symlink_to(tmp_path / "elsewhere.md")
    refused(do_pull, pulled, hub, "README.md (changed)")


def test_a_removed_file_loses_nothing_and_is_pulled_again(do_pull, pulled):
    """Chosen: removing a pulled file is allowed (its bytes are the pull's, in the HF cache and
    at that commit); the pull puts it back."""
    before = tree_bytes(pulled)
    removed = next(name for name in before if name.startswith("activations/"))
    (pulled / removed).unlink()
    assert do_pull(pulled).report.ok
    assert (pulled / removed).read_bytes() == before[removed]


def test_an_origin_from_an_older_cubepack_cannot_prove_anything(do_pull, pulled, hub):
    origin = json.loads((pulled / ORIGIN).read_text())
    del origin["files"]
    (pulled / ORIGIN).write_text(json.dumps(origin))
    message = refused(do_pull, pulled, hub, ".gitattributes, README.md")
    assert "older cubepack, whose record cannot prove its files unchanged" in message
    assert do_pull(pulled, force=True).report.ok
    assert "files" in json.loads((pulled / ORIGIN).read_text())


def test_an_edit_made_while_the_pull_downloads_is_refused_too(do_pull, hub, tmp_path):
    first = tmp_path / "first"
    do_pull(first)
    hold = hub.add_fault("hold", path=r"/tree/", method="GET")
    outcome = {}

    def run():
        try:
            do_pull(first, cache_dir=tmp_path / "other-cache")
        except Exception as exc:  # noqa: BLE001 - asserted below
            outcome["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    try:
        assert hub.wait_for_request(r"^GET .*/tree/")  # checked, now held before downloading
        (first / "notes.md").write_text("written during the pull")
    finally:
        hold.release()
        thread.join()
    assert isinstance(outcome.get("error"), UsageError) and "notes.md" in str(outcome["error"])
    assert (first / "notes.md").read_text() == "written during the pull"


@pytest.mark.parametrize("cache", ["HF_HUB_CACHE", "cache_dir", "HF_HOME", "CUBEPACK_CACHE"])
@pytest.mark.parametrize("where", ["is inside", "is", "holds", "would be inside"])
@pytest.mark.parametrize("force", [True, False])
def test_no_pull_goes_into_replaces_or_holds_a_cache(do_pull, hub, tmp_path, monkeypatch, cache,
                                                     where, force):
    from huggingface_hub import constants as hub_constants

    root = tmp_path / "the-cache"
    (root / "datasets--x--y" / "blobs").mkdir(parents=True)
    (root / "datasets--x--y" / "blobs" / "abc").write_text("someone's blob")
    kwargs = {}
    if cache in ("HF_HUB_CACHE", "HF_HOME"):
        monkeypatch.setattr(hub_constants, cache, str(root))
    elif cache == "cache_dir":
        kwargs["cache_dir"] = root
    else:
        monkeypatch.setenv("CUBEPACK_CACHE", str(root))
    target = {"is inside": root / "datasets--x--y", "is": root, "holds": tmp_path,
              "would be inside": root / "new-folder"}[where]
    before = tree_bytes(tmp_path)
    hub.stats.reset()
    with pytest.raises(UsageError, match=f"it {where.replace('would be', 'is')} "):
        do_pull(target, force=force, **kwargs)
    assert tree_bytes(tmp_path) == before and sum(hub.stats.requests.values()) == 0
    assert not target.exists() if where == "would be inside" else target.is_dir()


def test_force_never_replaces_a_folder_holding_the_home_folder(do_pull, hub, tmp_path,
                                                                 monkeypatch):
    home = tmp_path / "users" / "me"
    home.mkdir(parents=True)
    (home / "thesis.txt").write_text("four years of work")
    monkeypatch.setenv("HOME", str(home))
    for target in (home, home.parent):
        with pytest.raises(UsageError, match="it holds your home folder"):
            do_pull(target, force=True)
    assert (home / "thesis.txt").read_text() == "four years of work"
