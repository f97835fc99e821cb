"""``cubepack upgrade`` of a cube: verified first (a version-1 lock as far as version 1 allows),
staged from the lock's regular files only, a current cube left untouched."""

from __future__ import annotations

import json
import os

import pytest

import cubepack
from cubepack import VerificationFailed
from cubepack._util import canonical, constants
from cubepack.cli import main
from cubepack.format import _lock as lockfile
from cubepack.ops._verify import verify_for_upgrade

from adversarial import ITEM, flip
from helpers import as_lock_version_1, copy_of

ACTIVATIONS = ["activations/item-1.kv.safetensors", "activations/item-2.kv.safetensors"]


def snapshot(folder):
    """Every entry below ``folder`` without following links: (path, kind, bytes or target)."""
    found = []
    for directory, subdirs, files in os.walk(folder, followlinks=False):
        for name in sorted(subdirs + files):
            path = os.path.join(directory, name)
            if os.path.islink(path):
                found.append((path, "link", os.readlink(path)))
            elif os.path.isfile(path):
                with open(path, "rb") as handle:
                    found.append((path, "file", handle.read()))
    return sorted(found)


@pytest.fixture
def cube(packed_cube_factory, tmp_path):
    return copy_of(packed_cube_factory(), tmp_path)


@pytest.fixture
def v1_cube(cube, zoo):
    return as_lock_version_1(cube, zoo["a"] / "tokenizer.json")


def reseal_version_1(cube, change):
    path = cube / constants.LOCK_FILENAME
    lock = json.loads(path.read_text())
    change(lock)
    lock.pop("digest")
    lock["content_digest"] = lockfile.content_digest(lock)
    lock["digest"] = canonical.digest(lock)
    path.write_text(canonical.dumps(lock))


def test_an_honest_version_1_cube_verifies_as_far_as_version_1_allows_then_upgrades(
        v1_cube, zoo, capsys):
    with pytest.raises(VerificationFailed, match=r"cubepack upgrade CUBE_DIR --model"):
        cubepack.verify(v1_cube)
    report = verify_for_upgrade(v1_cube)
    assert report.ok and report.lock.version == 1
    ran = {c.name: c for c in report.checks}
    assert all(ran[name].ok for name in ("lock", "path", "file set", "size", "sha256", "content",
                                         "kv header", "cube config"))
    assert ran["model identity"].ok is None and "version-1 pin" in ran["model identity"].detail
    assert main(["upgrade", str(v1_cube), "--model", str(zoo["a"])]) == 0
    assert "upgraded 2 file(s), 0 already current" in capsys.readouterr().out
    assert json.loads((v1_cube / constants.LOCK_FILENAME).read_text())["lock_version"] == constants.LOCK_VERSION
    assert cubepack.verify(v1_cube, model=str(zoo["a"])).ok


def _edit_config(cube):
    path = cube / "config.json"
    path.write_text(path.read_text().replace('"u1"', '"u2"', 1))
    return r"sha256 config\.json: content differs"


def _add_unlisted(cube):
    (cube / "notes.txt").write_text("added after packing\n")
    return r"file set notes\.txt: not listed in the lock"


def _flip_activation(cube):
    flip(cube / ITEM)
    return r"sha256 activations/item-1\.kv\.safetensors: content differs"


def _unportable_name_resealed(cube):
    (cube / "aux.txt").write_text("x\n")
    if json.loads((cube / constants.LOCK_FILENAME).read_text())["lock_version"] == 1:
        reseal_version_1(cube, lambda lock: lock["files"].update(
            {"aux.txt": {"sha256": "ab" * 32, "size": 2}}))
    else:
        from adversarial import relock_file

        relock_file(cube, "aux.txt")
    return r"lock cubepack\.lock: Path 'aux\.txt' is a device name"


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("edit", [_edit_config, _add_unlisted, _flip_activation,
                                  _unportable_name_resealed])
def test_a_cube_edited_after_packing_is_refused_and_unchanged(cube, zoo, edit, version):
    if version == 1:
        as_lock_version_1(cube, zoo["a"] / "tokenizer.json")
    expected = edit(cube)
    before = snapshot(cube.parent)
    with pytest.raises(VerificationFailed, match=expected):
        cubepack.upgrade(cube, zoo["a"])
    assert snapshot(cube.parent) == before  # no staging folder left beside it either
    assert main(["upgrade", str(cube), "--model", str(zoo["a"])]) == 1


@pytest.mark.parametrize("version", [1, 2])
def test_a_symlinked_folder_is_refused_and_nothing_outside_is_linked(cube, zoo, tmp_path,
                                                                     version):
    """A folder copy follows a symlinked folder and hard-links the files it finds into the
    cube, which a push then uploads."""
    if version == 1:
        as_lock_version_1(cube, zoo["a"] / "tokenizer.json")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "notes.txt").write_text("the user's private notes\n")
    os.symlink(outside, cube / "linked")
    before = snapshot(cube.parent)
    with pytest.raises(VerificationFailed, match=r"path linked: is a symlink"):
        cubepack.upgrade(cube, zoo["a"])
    assert snapshot(cube.parent) == before
    assert os.stat(outside / "notes.txt").st_nlink == 1  # never hard-linked anywhere


def test_a_current_cube_is_left_untouched(cube, zoo, capsys):
    before, inode = snapshot(cube), os.stat(cube).st_ino
    result = cubepack.upgrade(cube, zoo["a"])
    assert result.upgraded == [] and result.current == ACTIVATIONS
    assert snapshot(cube) == before and os.stat(cube).st_ino == inode
    assert main(["upgrade", str(cube), "--model", str(zoo["a"])]) == 0
    assert "upgraded 0 file(s), 2 already current" in capsys.readouterr().out


def test_a_version_1_cube_of_another_model_is_refused_and_unchanged(v1_cube, zoo):
    before = snapshot(v1_cube.parent)
    with pytest.raises(cubepack.IdentityMismatch, match="weights_digest"):
        cubepack.upgrade(v1_cube, zoo["b"])
    assert snapshot(v1_cube.parent) == before


@pytest.fixture
def plain_bundle(models, zoo, tmp_path):
    """A plain cache bundle (no config.json), packed with --cube-id, a note beside its
    caches."""
    import torch

    from helpers import build_cache

    bundle = tmp_path / "docs"
    (bundle / "activations").mkdir(parents=True)
    for name, ids in {"intro": [1, 17, 42, 7], "faq": [3, 4, 5, 6, 200]}.items():
        cubepack.save_kv_cache(build_cache(models["a"], torch.tensor([ids])),
                               bundle / "activations" / f"{name}.kv.safetensors",
                               producer=models["a"], token_ids=ids)
    (bundle / "notes.txt").write_text("the intro and the faq\n")
    cubepack.pack(bundle, cube_id="me/docs", model=zoo["a"])
    return bundle


@pytest.mark.parametrize("version", [1, 2])
def test_a_plain_bundle_upgrades_keeping_its_cube_id(plain_bundle, zoo, version, capsys):
    """A bundle has no config.json: its cube id is the lock's. The upgrade re-packed its
    staging folder without one, and failed naming that folder (removed as it failed)."""
    from adversarial import relock_file
    from helpers import as_format_2

    if version == 1:
        as_lock_version_1(plain_bundle, zoo["a"] / "tokenizer.json")
    else:
        for path in sorted((plain_bundle / "activations").iterdir()):
            as_format_2(path, path)
            relock_file(plain_bundle, path.relative_to(plain_bundle).as_posix())
    assert main(["upgrade", str(plain_bundle), "--model", str(zoo["a"])]) == 0
    out = capsys.readouterr()
    assert ".upgrade" not in out.out + out.err and "staging" not in out.out + out.err
    assert "upgraded 2 file(s)" in out.out
    lock = json.loads((plain_bundle / constants.LOCK_FILENAME).read_text())
    assert lock["cube_id"] == "me/docs" and lock["lock_version"] == constants.LOCK_VERSION
    assert not (plain_bundle / "config.json").exists()  # a bundle stays one
    assert "notes.txt" in lock["files"]
    for path in (plain_bundle / "activations").iterdir():
        assert cubepack.read_kv_header(path).version == constants.KV_FORMAT_VERSION
    assert cubepack.verify(plain_bundle, model=str(zoo["a"])).ok
    assert sorted(p.name for p in plain_bundle.parent.iterdir()) == ["docs"]  # nothing beside
