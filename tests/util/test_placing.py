"""The one owner of "this target cannot be written" (:func:`cubepack._util.atomic.placing`):
every errno it knows becomes a UsageError naming the user's folder (never the staging folder
beside it) and a fix, whatever raised it; other errors pass through as they were."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest

from cubepack import UsageError
from cubepack._util import atomic

#: Each errno and a word its message must carry (the reason told, then the fix).
REASONS = {errno.EACCES: "not writable", errno.EPERM: "not permitted",
           errno.EROFS: "read-only file system", errno.ENOSPC: "full",
           errno.EDQUOT: "quota", errno.EXDEV: "cannot be renamed",
           errno.EBUSY: "cannot be renamed"}
FIXES = {errno.EACCES: "Make it writable", errno.EPERM: "chattr -i",
         errno.EROFS: "Remount it read-write", errno.ENOSPC: "Free space",
         errno.EDQUOT: "Free space", errno.EXDEV: "same file system",
         errno.EBUSY: "same file system"}


def test_every_target_errno_is_known():
    assert set(REASONS) == set(atomic.TARGET_ERRNOS)


def raised_in(target: Path, exc: BaseException, **options) -> BaseException:
    options.setdefault("elsewhere", "pass another --local-dir")
    with pytest.raises(BaseException) as caught, atomic.placing(target, **options):
        raise exc
    return caught.value


@pytest.mark.parametrize("code", sorted(REASONS), ids=errno.errorcode.get)
@pytest.mark.parametrize("where", ["staging", "temp file", "set aside", "inside", "unnamed"])
def test_each_errno_names_the_users_folder_and_the_fix(tmp_path, code, where):
    target = tmp_path / "cube"
    path = {"staging": tmp_path / ".cube.pull.123.abcd" / "model.safetensors",
            "temp file": tmp_path / ".cube.x1y2.tmp",
            "set aside": tmp_path / ".cube.old.zz",
            "inside": target / "cubepack.lock",
            "unnamed": None}[where]
    error = raised_in(target, OSError(code, os.strerror(code), *([str(path)] if path else [])))
    assert type(error) is UsageError and error.exit_code == 2
    message = str(error)
    assert message.startswith(f"Cannot write {target}: "), message
    assert REASONS[code] in message and FIXES[code] in message, message
    assert "or pass another --local-dir." in message
    assert f"Nothing was left behind: {target} is as it was." in message
    assert ".pull." not in message and ".tmp" not in message and ".old." not in message
    assert isinstance(error.__cause__, OSError) and error.__cause__.errno == code


def test_a_path_outside_the_target_is_named_as_it_is(tmp_path):
    cache = tmp_path / "hf-cache" / "blobs"
    cache.mkdir(parents=True)
    error = raised_in(tmp_path / "cube", OSError(errno.EROFS, "Read-only file system",
                                                 str(cache / "abc.incomplete")))
    assert str(error).startswith(f"Cannot write {cache}: it is on a read-only file system")


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    """huggingface_hub's cache settings pointed at folders of this test: ``set(home, cache)``."""
    from huggingface_hub import constants

    def set_to(home: Path, cache: Path) -> None:
        monkeypatch.setattr(constants, "HF_HOME", str(home))
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))

    return set_to


@pytest.mark.parametrize("code", sorted(REASONS), ids=errno.errorcode.get)
def test_the_hf_cache_is_named_with_the_settings_that_move_it(tmp_path, hf_cache, code):
    """Another --local-dir cannot help when the HF cache cannot be written: the fix names the
    variables that move it. HF_HOME moves it too when HF_HUB_CACHE is its default, HF_HOME/hub."""
    home = tmp_path / "hf-home"
    (home / "hub" / "blobs").mkdir(parents=True)
    for cache, named in ((home / "hub", "set HF_HUB_CACHE (or HF_HOME, which holds it as hub/)"),
                         (tmp_path / "elsewhere", "set HF_HUB_CACHE")):
        (cache / "blobs").mkdir(parents=True, exist_ok=True)
        hf_cache(home, cache)
        error = raised_in(tmp_path / "cube", OSError(code, os.strerror(code),
                                                     str(cache / "blobs" / "x.incomplete")))
        message = str(error)
        assert type(error) is UsageError, message
        assert message.startswith(f"Cannot write {cache / 'blobs'} (the Hugging Face cache, "
                                  "HF_HUB_CACHE): "), message
        assert f"or {named} to a writable folder." in message, message
        assert "--local-dir" not in message, message
        assert f"Nothing was left behind: {tmp_path / 'cube'} is as it was." in message


def test_a_cache_a_call_was_given_is_named_with_that_argument(tmp_path, hf_cache):
    hf_cache(tmp_path / "hf-home", tmp_path / "hf-home" / "hub")
    given = tmp_path / "given"
    given.mkdir()
    message = str(raised_in(tmp_path / "cube", OSError(errno.EROFS, "Read-only file system",
                                                       str(given / "datasets--ns--cube")),
                            cache_dir=given))
    assert message.startswith(f"Cannot write {given} (the Hugging Face cache this call was "
                              "given): "), message
    assert "or pass another cache_dir." in message, message


def test_a_download_with_no_target_names_the_cache_and_a_block_around_it_its_target(
        tmp_path, hf_cache):
    """A Hub model or a lock downloaded to be read has no target of the user's: the cache and
    its setting alone; inside a block (a pull), the block tells it with its target."""
    cache = tmp_path / "hf-home" / "hub"
    cache.mkdir(parents=True)
    hf_cache(tmp_path / "hf-home", cache)
    exc = OSError(errno.EROFS, "Read-only file system", str(cache / "models--org--model"))
    problem = atomic.cache_problem(exc)
    assert str(problem) == (f"Cannot write {cache} (the Hugging Face cache, HF_HUB_CACHE): it "
                            "is on a read-only file system (Read-only file system). Remount it "
                            "read-write, or set HF_HUB_CACHE (or HF_HOME, which holds it as "
                            "hub/) to a writable folder.")
    told = raised_in(tmp_path / "cube", problem)
    assert str(told).endswith(f"Nothing was left behind: {tmp_path / 'cube'} is as it was.")
    elsewhere = OSError(errno.EROFS, "Read-only file system", str(tmp_path / "other" / "x"))
    assert atomic.cache_problem(elsewhere) is None
    assert atomic.cache_problem(OSError(errno.EIO, "Input/output error", str(cache))) is None


def test_the_hf_home_outside_its_cache_is_named_as_hf_home(tmp_path, hf_cache):
    home = tmp_path / "hf-home"
    (home / "xet").mkdir(parents=True)
    hf_cache(home, tmp_path / "cache")
    message = str(raised_in(tmp_path / "cube", OSError(errno.EROFS, "Read-only file system",
                                                       str(home / "xet" / "log"))))
    assert message.startswith(f"Cannot write {home / 'xet'} (the Hugging Face home, HF_HOME): ")
    assert "or set HF_HOME to a writable folder." in message, message


@pytest.mark.parametrize("exc", [OSError(errno.ENOENT, "No such file or directory", "x"),
                                 OSError(errno.EIO, "Input/output error"),
                                 ValueError("not ours")], ids=str)
def test_anything_else_passes_through_as_it_was(tmp_path, exc):
    assert raised_in(tmp_path / "cube", exc) is exc


def test_a_block_that_writes_in_place_does_not_claim_it_left_nothing(tmp_path):
    error = raised_in(tmp_path / "dump", OSError(errno.ENOSPC, "No space left on device"),
                      whole=False, elsewhere="dump to another folder")
    assert "Nothing was left behind" not in str(error)
    assert str(error).endswith("or dump to another folder.")


def test_only_the_outermost_block_names_its_target(tmp_path):
    """upgrade packs its staging folder: the error names the cube the user asked for."""
    cube = tmp_path / "cube"
    staging = tmp_path / ".cube.upgrade.1.ab"
    with pytest.raises(UsageError) as caught, atomic.placing(cube, elsewhere="x"), \
            atomic.placing(staging, elsewhere="y"):
        raise OSError(errno.EROFS, "Read-only file system", str(staging / "cubepack.lock"))
    assert str(caught.value).startswith(f"Cannot write {cube}: ")
    assert str(caught.value).endswith(f"or x. Nothing was left behind: {cube} is as it was.")


def test_an_error_told_in_another_thread_is_told_again_of_the_outer_target(tmp_path):
    """A worker thread's write (its own block, another thread) named its file: the block that
    placed the folder names the folder instead."""
    cube = tmp_path / "cube"
    staging = tmp_path / ".cube.pull.1.ab"
    staging.mkdir()
    told: list[BaseException] = []

    def worker():
        try:
            atomic.write_bytes(staging / "file", b"x")
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread
            told.append(exc)

    original = os.replace

    def refuse(source, destination):
        raise OSError(errno.ENOSPC, "No space left on device")

    os.replace = refuse
    try:
        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
    finally:
        os.replace = original
    assert str(told[0]).startswith(f"Cannot write {staging / 'file'}: ")
    with pytest.raises(UsageError) as caught, atomic.placing(cube, elsewhere="x"):
        raise told[0]
    assert str(caught.value).startswith(f"Cannot write {cube}: the device holding it is full")


def test_folders_the_block_made_are_removed_again(tmp_path):
    target = tmp_path / "a" / "b" / "cube"
    with pytest.raises(UsageError), atomic.placing(target, elsewhere="x"):
        target.mkdir(parents=True)
        raise OSError(errno.ENOSPC, "No space left on device")
    assert list(tmp_path.iterdir()) == []


def test_a_single_file_write_names_the_file(tmp_path, monkeypatch):
    def refuse(source, destination):
        raise OSError(errno.EROFS, "Read-only file system", source, destination)

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(UsageError) as caught:
        atomic.write_text(tmp_path / "notes.txt", "x")
    assert str(caught.value).startswith(f"Cannot write {tmp_path / 'notes.txt'}: it is on a "
                                        "read-only file system")
    assert list(tmp_path.iterdir()) == []
