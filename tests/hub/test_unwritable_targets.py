"""Targets the commands cannot write, made for real where this machine can (a read-only tmpfs,
``chattr +i``, an empty mount point, a full tmpfs; these need root and a kernel that lets us
mount: each skips, saying why, elsewhere), and every errno injected into every command that
places a folder (pull, pack, migrate, upgrade, sign, pack_cube) and into the single-file writers:
each is a UsageError naming the user's folder and a fix, never a staging folder, and leaves
nothing behind (the target as it was, no folder beside it)."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import cubepack
from cubepack import UsageError
from cubepack._util import atomic
from cubepack.hub import pull, push
from cubepack.testing.hub import InstrumentedHub

from helpers import make_key, tree_bytes

TARGET_ERRNOS = sorted(atomic.TARGET_ERRNOS)


@pytest.fixture(scope="module")
def hub(tmp_path_factory, packed_cube_factory):
    with InstrumentedHub(tmp_path_factory.mktemp("hub")) as server:
        server.sha = push(packed_cube_factory(), "ns/cube", endpoint=server.url,
                          allow_local_paths=True).commit_sha
        yield server


@pytest.fixture(scope="module")
def signing_key(tmp_path_factory):
    pytest.importorskip("model_signing", reason="signing needs cubepack[sign]")
    return make_key(tmp_path_factory.mktemp("keys"), "alice")[0]


def do_pull(hub, target, tmp_path):
    return pull(f"ns/cube@{hub.sha}", endpoint=hub.url, local_dir=target,
                cache_dir=tmp_path / "hf-cache")


def snapshot(folder: Path) -> tuple[list[str], dict]:
    """The names in ``folder``'s parent (a staging folder left would show) and its bytes."""
    names = sorted(p.name for p in folder.parent.iterdir()) if folder.parent.exists() else []
    return names, (tree_bytes(folder) if folder.exists() else {})


def refused(run, target: Path, *, named: Path | None = None, says: str) -> str:
    before = snapshot(target)
    with pytest.raises(UsageError) as caught:
        run()
    message = str(caught.value)
    assert message.startswith(f"Cannot write {named or target}: "), message
    assert says in message, message
    assert ".pull." not in message and ".pack." not in message and ".tmp" not in message
    assert snapshot(target) == before, "something was left behind"
    return message


# --- the conditions, made for real -------------------------------------------------------------

def _mount(folder: Path, options: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)],
                          capture_output=True, text=True, check=False)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or done.returncode}): "
                    "needs root and a kernel that allows it")


@pytest.fixture
def mount(tmp_path):
    """``mount(folder, options)``: a tmpfs there, unmounted after the test."""
    mounted: list[Path] = []
    if sys.platform != "linux" or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs Linux's mount")

    def make(folder: Path, options: str) -> Path:
        _mount(folder, options)
        mounted.append(folder)
        return folder

    yield make
    for folder in reversed(mounted):
        subprocess.run(["umount", "-l", str(folder)], check=False)


@pytest.fixture
def immutable():
    """``immutable(path)``: ``chattr +i`` on it, lifted after the test."""
    flagged: list[Path] = []

    def make(path: Path) -> Path:
        done = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True,
                              check=False) if shutil.which("chattr") else None
        if done is None or done.returncode:
            pytest.skip("chattr +i is unavailable here (needs root and a file system with "
                        f"attributes: {done.stderr.strip() if done else 'no chattr'})")
        flagged.append(path)
        return path

    yield make
    for path in flagged:
        subprocess.run(["chattr", "-i", str(path)], check=False)


def test_a_pull_into_a_read_only_file_system(hub, tmp_path, mount):
    parent = mount(tmp_path / "ro", "ro,size=1m")
    target = parent / "cube"
    message = refused(lambda: do_pull(hub, target, tmp_path), target,
                      says="it is on a read-only file system")
    assert "Remount it read-write, or pass another --local-dir" in message


def test_a_pull_into_an_immutable_folder(hub, tmp_path, immutable):
    parent = tmp_path / "frozen"
    parent.mkdir()
    immutable(parent)
    target = parent / "cube"
    message = refused(lambda: do_pull(hub, target, tmp_path), target,
                      says=f"{parent} is immutable or append-only")
    assert f"chattr -i -a {parent}" in message


def test_a_pull_replacing_an_immutable_pull(hub, tmp_path, immutable):
    target = tmp_path / "cube"
    do_pull(hub, target, tmp_path)
    immutable(target)
    refused(lambda: pull(f"ns/cube@{hub.sha}", endpoint=hub.url, local_dir=target,
                         cache_dir=tmp_path / "hf-cache", force=True),
            target, says=f"{target} is immutable or append-only")


def test_a_pull_onto_an_empty_mount_point(hub, tmp_path, mount):
    target = mount(tmp_path / "place" / "mnt", "size=4m")
    message = refused(lambda: do_pull(hub, target, tmp_path), target,
                      says=f"{target} is a mount point")
    assert f"Use a new folder inside it (e.g. {target / 'mnt'})" in message
    do_pull(hub, target / "mnt", tmp_path)  # the fix works
    assert (target / "mnt" / "cubepack.lock").is_file()


def test_a_pull_that_fills_the_disk(hub, tmp_path, mount, packed_cube_factory):
    pages = sum(-(-len(data) // 4096) for data in tree_bytes(packed_cube_factory()).values())
    assert pages > 2, "the cube must not fit in the tmpfs (two pages of 4 KiB)"
    parent = mount(tmp_path / "tiny", "size=8k")
    target = parent / "cube"
    refused(lambda: do_pull(hub, target, tmp_path), target,
            says="the device holding it is full")
    assert list(parent.iterdir()) == []


def test_packing_a_cube_on_a_read_only_file_system(tmp_path, mount, packed_cube_factory):
    folder = mount(tmp_path / "ro", "size=4m")
    cube = folder / "cube"
    shutil.copytree(packed_cube_factory(), cube)
    subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)
    message = refused(lambda: cubepack.pack(cube, pretty_name="renamed"), cube,
                      says="it is on a read-only file system")
    assert "copy the cube to a writable folder and pack the copy" in message


def test_packing_and_signing_an_immutable_cube(tmp_path, immutable, packed_cube_factory,
                                              signing_key):
    cube = tmp_path / "cube"
    shutil.copytree(packed_cube_factory(), cube)
    immutable(cube)
    refused(lambda: cubepack.pack(cube, pretty_name="renamed"), cube,
            says=f"{cube} is immutable or append-only")
    message = refused(lambda: cubepack.sign(cube, signing_key), cube,
                      says=f"{cube} is immutable or append-only")
    assert "sign the copy" in message


def test_a_kv_file_written_to_a_read_only_file_system(tmp_path, mount, models):
    import torch

    from helpers import build_cache

    folder = mount(tmp_path / "ro", "ro,size=1m")
    cache = build_cache(models["a"], torch.tensor([[1, 2, 3]]))
    with pytest.raises(UsageError) as caught:
        cubepack.save_kv_cache(cache, folder / "kv.safetensors", producer=models["a"])
    assert str(caught.value).startswith(f"Cannot write {folder / 'kv.safetensors'}: it is on "
                                        "a read-only file system")


def test_the_cli_prints_one_line_and_exits_2(hub, tmp_path, mount):
    parent = mount(tmp_path / "ro", "ro,size=1m")
    env = dict(os.environ, HF_ENDPOINT=hub.url, HF_HUB_CACHE=str(tmp_path / "hf-cache"))
    done = subprocess.run([sys.executable, "-m", "cubepack", "pull", f"ns/cube@{hub.sha}",
                           "--local-dir", str(parent / "cube")], env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"error: Cannot write {parent / 'cube'}: it is on a read-only file system (Read-only "
        "file system). Remount it read-write, or pass another --local-dir. Nothing was left "
        f"behind: {parent / 'cube'} is as it was."]


def _pull_cli(hub, target: Path, revision: str | None = None,
              **env: str) -> subprocess.CompletedProcess:
    """``cubepack pull`` as a user runs it, with the HF cache settings given (others unset)."""
    environ = {k: v for k, v in os.environ.items() if k not in ("HF_HOME", "HF_HUB_CACHE")}
    environ.update(env, HF_ENDPOINT=hub.url)
    return subprocess.run([sys.executable, "-m", "cubepack", "pull",
                           f"ns/cube@{revision or hub.sha}", "--local-dir", str(target)],
                          env=environ, capture_output=True, text=True, timeout=300, check=False)


def test_a_pull_by_commit_writes_nothing_in_the_hf_cache_so_a_read_only_one_is_no_obstacle(
        hub, tmp_path, mount):
    """One copy on disk (issue #40 item 5): the files go to --local-dir only."""
    cache = mount(tmp_path / "ro-cache", "ro,size=1m")
    home = mount(tmp_path / "ro-home", "ro,size=1m")
    done = _pull_cli(hub, tmp_path / "cube", HF_HUB_CACHE=str(cache), HF_HOME=str(home))
    assert done.returncode == 0, done.stdout + done.stderr
    assert cubepack.verify(tmp_path / "cube").ok


def test_a_pull_by_name_into_a_read_only_hf_cache_names_hf_hub_cache_and_setting_it_works(
        hub, tmp_path, mount):
    """A pull by branch or tag records the name in the HF cache (for an offline pull by that
    name), before placing: a cache that cannot take it fails the pull, placing nothing."""
    cache = mount(tmp_path / "ro-cache", "ro,size=1m")
    home = str(tmp_path / "hf-home")
    done = _pull_cli(hub, tmp_path / "cube", "main", HF_HUB_CACHE=str(cache), HF_HOME=home)
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"error: Cannot write {cache} (the Hugging Face cache, HF_HUB_CACHE): "
                           "it is on a read-only file system"), line
    assert "or set HF_HUB_CACHE to a writable folder." in line and "--local-dir" not in line
    assert not (tmp_path / "cube").exists()
    done = _pull_cli(hub, tmp_path / "cube", "main", HF_HUB_CACHE=str(tmp_path / "writable"),
                     HF_HOME=home)  # as it says
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("moved", ["HF_HOME", "HF_HUB_CACHE"])
def test_a_read_only_hf_home_names_both_settings_and_each_works(hub, tmp_path, mount, moved):
    home = mount(tmp_path / "ro-home", "ro,size=1m")
    done = _pull_cli(hub, tmp_path / "cube", "main", HF_HOME=str(home))
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert "(the Hugging Face cache, HF_HUB_CACHE)" in line or \
        "(the Hugging Face home, HF_HOME)" in line, line
    assert "HF_HOME" in line and "HF_HUB_CACHE" in line and "--local-dir" not in line, line
    writable = tmp_path / "writable"
    fixed = {"HF_HOME": str(writable)} if moved == "HF_HOME" else \
        {"HF_HOME": str(home), "HF_HUB_CACHE": str(writable)}
    done = _pull_cli(hub, tmp_path / "cube", "main", **fixed)  # either way the message gives
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_hub_model_into_a_read_only_hf_cache_names_hf_hub_cache(hub, tmp_path, mount, zoo):
    """Not a pull: a Hub --model is downloaded into the HF cache by every command that pins or
    checks a model (fingerprint, pack, verify, migrate)."""
    from cubepack.testing.hub import upload_folder

    upload_folder(hub.url, "org/model", zoo["a"])
    cache = mount(tmp_path / "ro-cache", "ro,size=1m")
    environ = dict(os.environ, HF_ENDPOINT=hub.url, HF_HOME=str(tmp_path / "hf-home"))

    def fingerprint(cache_dir: Path) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "cubepack", "fingerprint", "org/model"],
                              env=dict(environ, HF_HUB_CACHE=str(cache_dir)),
                              capture_output=True, text=True, timeout=300, check=False)

    done = fingerprint(cache)
    assert done.returncode == 2, done.stdout + done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"error: Cannot write {cache} (the Hugging Face cache, HF_HUB_CACHE): "
                           "it is on a read-only file system"), line
    assert line.endswith("or set HF_HUB_CACHE to a writable folder."), line
    done = fingerprint(tmp_path / "writable")  # as it says
    assert done.returncode == 0, done.stdout + done.stderr


# --- every errno, injected where each command places its folder --------------------------------

def _fail_placement(monkeypatch, code: int) -> None:
    """The folder swap (every staging command's last step) fails with ``code``, naming the
    staging folder as the operating system would."""
    def refuse(staged, target):
        raise OSError(code, os.strerror(code), str(staged), str(target))

    monkeypatch.setattr(atomic, "replace_dir", refuse)


@pytest.mark.parametrize("code", TARGET_ERRNOS, ids=errno.errorcode.get)
def test_every_errno_in_a_pull(hub, tmp_path, monkeypatch, code):
    _fail_placement(monkeypatch, code)
    target = tmp_path / "new" / "cube"
    message = refused(lambda: do_pull(hub, target, tmp_path), target, says="or pass another "
                      "--local-dir. Nothing was left behind")
    assert not (tmp_path / "new").exists(), message


@pytest.mark.parametrize("code", TARGET_ERRNOS, ids=errno.errorcode.get)
def test_every_errno_in_a_pack(tmp_path, monkeypatch, code, packed_cube_factory):
    cube = tmp_path / "cube"
    shutil.copytree(packed_cube_factory(), cube)
    _fail_placement(monkeypatch, code)
    refused(lambda: cubepack.pack(cube, pretty_name="renamed"), cube,
            says="or copy the cube to a writable folder and pack the copy.")


@pytest.mark.parametrize("code", TARGET_ERRNOS, ids=errno.errorcode.get)
def test_every_errno_in_a_sign(tmp_path, monkeypatch, code, packed_cube_factory, signing_key):
    cube = tmp_path / "cube"
    shutil.copytree(packed_cube_factory(), cube)
    original = os.replace

    def refuse(source, destination, **kwargs):
        if Path(destination).name == "cubepack.sig":
            raise OSError(code, os.strerror(code), str(source), str(destination))
        return original(source, destination, **kwargs)

    monkeypatch.setattr(os, "replace", refuse)
    refused(lambda: cubepack.sign(cube, signing_key), cube,
            says="or copy the cube to a writable folder and sign the copy.")


@pytest.mark.parametrize("code", TARGET_ERRNOS, ids=errno.errorcode.get)
def test_every_errno_in_a_migrate(tmp_path, monkeypatch, code, packed_cube_factory, zoo):
    _fail_placement(monkeypatch, code)
    out = tmp_path / "out" / "migrated"
    refused(lambda: cubepack.migrate(packed_cube_factory(), out=out, model=str(zoo["a"])),
            out, says="or pass another --out. Nothing was left behind")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("code", TARGET_ERRNOS, ids=errno.errorcode.get)
def test_every_errno_in_a_single_file_write(tmp_path, monkeypatch, code, models):
    import torch

    from helpers import build_cache

    cache = build_cache(models["a"], torch.tensor([[1, 2, 3]]))
    original = os.replace

    def refuse(source, destination, **kwargs):
        raise OSError(code, os.strerror(code), str(source), str(destination))

    monkeypatch.setattr(os, "replace", refuse)
    target = tmp_path / "kv.safetensors"
    refused(lambda: cubepack.save_kv_cache(cache, target, producer=models["a"]), target,
            says="or write to another path. Nothing was left behind")
    monkeypatch.setattr(os, "replace", original)
    assert list(tmp_path.iterdir()) == []


def test_a_pin_read_from_the_hubs_metadata_into_a_read_only_cache_names_it(monkeypatch):
    """The small files a pin from the Hub's metadata reads (config.json, the tokenizer's) go
    through the HF cache too: a refused write there names the cache and its setting."""
    import huggingface_hub
    from huggingface_hub import constants

    from cubepack.identity import _hub

    cache = Path(constants.HF_HUB_CACHE)

    def refuse(repo_id, filename, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(cache / "models--org--model"))

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", refuse)
    api = type("Api", (), {"endpoint": "http://127.0.0.1:9", "token": None})()
    with pytest.raises(UsageError) as caught:
        _hub._download_inputs(api, "org/model", "0" * 40, ["config.json"])
    assert "(the Hugging Face cache, HF_HUB_CACHE)" in str(caught.value)
    assert "to a writable folder." in str(caught.value)
