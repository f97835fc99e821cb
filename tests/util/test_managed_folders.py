"""cubepack's own folders below $CUBEPACK_CACHE (the MemOS hook's pulled and cloned cubes), with
real symlinks: a symlink in the configured root's path is followed once when you (or root) own
it; below the root, a symlink or someone else's folder is refused, naming it, before anything
is placed or removed. Ownership cases need root (chown); they are skipped otherwise."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess

import pytest

from cubepack import UnsafeInputError
from cubepack._util.paths import managed_cube_folder, managed_folder, resolve_owned_root
from cubepack.testing.hub import InstrumentedHub

from helpers import tree_bytes

SHA = "c" * 40
OTHER_UID = 54321
as_root = pytest.mark.skipif(getattr(os, "getuid", lambda: -1)() != 0,
                             reason="giving a file to another user needs root")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """CUBEPACK_CACHE at a fresh folder, and a victim folder an attacker would aim at."""
    root = tmp_path / "cache"
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep me")
    monkeypatch.setenv("CUBEPACK_CACHE", str(root))
    return root, victim


def test_the_managed_folders_are_made_as_real_folders_of_yours(cache):
    root, _ = cache
    folder = managed_cube_folder("datasets--ns--cube", SHA, create_last=False)
    assert folder == root.resolve() / "cubes" / "datasets--ns--cube" / SHA
    assert not folder.exists() and folder.parent.is_dir() and not folder.parent.is_symlink()
    assert managed_cube_folder("git", "d" * 16).is_dir()


@pytest.mark.parametrize("component", ["cubes", "cubes/datasets--ns--cube",
                                       f"cubes/datasets--ns--cube/{SHA}"])
def test_a_symlink_below_the_root_is_refused_naming_it(cache, component):
    root, victim = cache
    link = root / component
    link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(victim, link)
    with pytest.raises(UnsafeInputError) as refused:
        managed_cube_folder("datasets--ns--cube", SHA, create_last=False)
    message = str(refused.value)
    assert f"{link} is a symlink (to {victim})" in message and "Remove the link" in message
    assert tree_bytes(victim) == {"precious.txt": b"keep me"}


def test_a_symlink_in_the_configured_root_you_own_is_followed_once(tmp_path, monkeypatch):
    real = tmp_path / "real-cache"
    real.mkdir()
    os.symlink(real, tmp_path / "cache-link")  # e.g. ~/.cache -> /data/cache, yours
    os.symlink("cache-link", tmp_path / "relative-link")  # a chain, relative
    monkeypatch.setenv("CUBEPACK_CACHE", str(tmp_path / "relative-link" / "cubepack"))
    folder = managed_cube_folder("git", "d" * 16)
    assert folder == real.resolve() / "cubepack" / "cubes" / "git" / ("d" * 16)
    assert folder.is_dir()


def test_a_symlink_loop_in_the_root_is_refused(tmp_path):
    os.symlink(tmp_path / "b", tmp_path / "a")
    os.symlink(tmp_path / "a", tmp_path / "b")
    with pytest.raises(UnsafeInputError, match="more than 40 symlinks"):
        resolve_owned_root(tmp_path / "a" / "cache", "CUBEPACK_CACHE")


@as_root
def test_a_symlink_in_the_root_owned_by_someone_else_is_refused(tmp_path, monkeypatch):
    """A shared /tmp: someone made /tmp/shared/cubepack a link to a folder of their choice."""
    shared = tmp_path / "shared"
    shared.mkdir()
    elsewhere = tmp_path / "theirs"
    elsewhere.mkdir()
    link = shared / "cubepack"
    os.symlink(elsewhere, link)
    os.lchown(link, OTHER_UID, OTHER_UID)
    monkeypatch.setenv("CUBEPACK_CACHE", str(link))
    with pytest.raises(UnsafeInputError) as refused:
        managed_cube_folder("git", "d" * 16)
    assert f"{link}, on the path of CUBEPACK_CACHE" in str(refused.value)
    assert f"uid {OTHER_UID}" in str(refused.value)
    assert list(elsewhere.iterdir()) == []


@as_root
def test_someone_elses_folder_below_the_root_is_refused(cache):
    root, _ = cache
    theirs = root / "cubes" / "git"
    theirs.mkdir(parents=True)
    os.chown(theirs, OTHER_UID, OTHER_UID)
    with pytest.raises(UnsafeInputError, match=rf"{theirs} belongs to uid {OTHER_UID}, not to you"):
        managed_cube_folder("git", "d" * 16)


def test_a_root_others_can_write_must_be_sticky(tmp_path):
    root = tmp_path / "open"
    root.mkdir()
    os.chmod(root, 0o777)
    with pytest.raises(UnsafeInputError, match="can be written by others"):
        managed_folder(root, ("cubes",), what="CUBEPACK_CACHE")
    os.chmod(root, 0o777 | stat.S_ISVTX)  # like /tmp: nobody renames what is not theirs
    assert managed_folder(root, ("cubes",), what="CUBEPACK_CACHE").is_dir()


# --- through the MemOS hook's own loaders ----------------------------------------------------

def test_init_from_remote_repo_refuses_a_symlinked_cubes_folder_before_pulling(
        cache, packed_cube_factory, tmp_path):
    import cubepack.memos

    root, victim = cache
    with InstrumentedHub(tmp_path / "hub", tokens=["t"]) as hub:
        pushed = cubepack.push(packed_cube_factory(), "ns/cube", endpoint=hub.url, token="t",
                               allow_local_paths=True)
        root.mkdir(exist_ok=True)  # the push made it (its hash cache)
        os.symlink(victim, root / "cubes")
        hub.stats.reset()
        with pytest.raises(UnsafeInputError, match=f"{root / 'cubes'} is a symlink"):
            cubepack.memos.init_from_remote_repo(f"ns/cube@{pushed.commit_sha}",
                                                 endpoint=hub.url, token="t")
        assert not any("/resolve/" in key for key in hub.stats.requests)  # nothing downloaded
    assert tree_bytes(victim) == {"precious.txt": b"keep me"}


def test_a_git_clone_refuses_a_symlinked_commit_folder_and_leaves_its_target(cache, tmp_path):
    from cubepack.memos._hook import git_checkout

    _, victim = cache
    remote = tmp_path / "remote"
    remote.mkdir()
    (remote / "a.txt").write_text("a")
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "cube"]):
        subprocess.run(["git", "-C", str(remote), *args], check=True, env=env)
    head = subprocess.run(["git", "-C", str(remote), "rev-parse", "HEAD"], check=True,
                          capture_output=True, text=True).stdout.strip()
    url = f"file://{remote}"
    placed = git_checkout(url, head)  # a first load places it
    assert (placed / "a.txt").read_text() == "a"
    shutil.rmtree(placed)
    os.symlink(victim, placed)  # someone turns the commit folder into a link
    with pytest.raises(UnsafeInputError, match=f"{placed} is a symlink"):
        git_checkout(url, head)
    assert tree_bytes(victim) == {"precious.txt": b"keep me"}
