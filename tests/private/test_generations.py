"""A private cube's generation (issue #37): its formats (the lock's encryption section, the
manifest's history), the records of what this user has seen, and what a verify says when it
cannot keep one."""

from __future__ import annotations

import json
import shutil

import pytest

import cubepack
from cubepack._util import canonical, constants
from cubepack.errors import FormatError
from cubepack.format import _fileset as fileset
from cubepack.format import _lock as lockfile
from cubepack.ops._encrypt import encrypt, rekey
from cubepack.trust import _age as age
from cubepack.trust import _generation as generations

from helpers import make_key


def _private_lock(**section):
    files = {"a.age": {"sha256": "0" * 64, "size": 1},
             fileset.PRIVATE_MANIFEST: {"sha256": "1" * 64, "size": 1}}
    encryption = {"version": 2, "scheme": lockfile.ENCRYPTION_SCHEME,
                  "manifest": fileset.PRIVATE_MANIFEST, "ciphertexts": ["a.age"],
                  "counts": {"files": 1, "activations": 0, "adapters": 0, "recipients": 1},
                  "hidden_names": False, "series": "0" * 32, "generation": 1, **section}
    return lockfile.dumps(lockfile.build_lock(cube_id="x/y", files=files, models={},
                                              activations={}, cubepack_version="t",
                                              encryption=encryption)).encode()


def test_the_lock_reads_a_generation_from_1_to_2_to_the_53_minus_1_and_nothing_else():
    for good in (1, 2, 2 ** 53 - 1):
        assert lockfile.generation(lockfile.parse(_private_lock(generation=good))) == good
    for bad in (0, -1, 2 ** 53, 1.0, True, "1", None, [1]):
        with pytest.raises(FormatError, match="generation"):
            lockfile.parse(_private_lock(generation=bad))
    for bad in ("0" * 31, "0" * 33, "A" * 32, 7, None):
        with pytest.raises(FormatError, match="series"):
            lockfile.parse(_private_lock(series=bad))
    with pytest.raises(FormatError, match="version 1 must hold exactly"):
        lockfile.parse(_private_lock(version=1))  # a version-1 section has no generation


def _manifest(**changes):
    base = {"format": age.MANIFEST_FORMAT, "version": 2, "lock": "{}", "names": {"a.age": "a"},
            "recipients": ["age1x"], "series": "0" * 32, "generation": 2,
            "history": [{"generation": 1, "added": ["age1x", "age1y"], "removed": []},
                        {"generation": 2, "added": [], "removed": ["age1y"]}]}
    return canonical.dumps({**base, **changes}).encode()


def test_the_manifest_history_runs_in_increasing_generations_up_to_its_own():
    assert age.parse_manifest(_manifest())["generation"] == 2
    for bad in ({"generation": 3}, {"history": []},
                {"history": [{"generation": 2, "added": [], "removed": []},
                             {"generation": 2, "added": [], "removed": []}]},
                {"history": [{"generation": 2, "added": [], "removed": [], "extra": 1}]},
                {"history": [{"generation": 2, "added": "age1x", "removed": []}]},
                {"generation": True}, {"generation": 0,
                                       "history": [{"generation": 0, "added": [],
                                                    "removed": []}]}):
        with pytest.raises(FormatError):
            age.parse_manifest(_manifest(**bad))
    old = json.loads(_manifest())
    del old["series"], old["generation"], old["history"]
    parsed = age.parse_manifest(canonical.dumps({**old, "version": 1}).encode())
    assert parsed["generation"] is None and parsed["series"] is None and parsed["history"] == []


def test_readded_names_who_a_generation_removed_and_none_added_back_since():
    history = [{"generation": 1, "added": ["a", "b", "c"], "removed": []},
               {"generation": 2, "added": [], "removed": ["b", "c"]},
               {"generation": 3, "added": ["c"], "removed": []}]
    assert generations.readded(history, ["a", "b", "c", "d"]) == [
        {"recipient": "b", "removed_at": 2}]


def test_a_record_keeps_the_highest_generation_per_signer(tmp_path, monkeypatch):
    monkeypatch.setenv("CUBEPACK_CACHE", str(tmp_path))
    where = {"cube_id": "x/y"}
    generations.remember(where, "k1", generations.Known(3, "here"))
    generations.remember(where, "k1", generations.Known(2, "there"))
    generations.remember(where, "k2", generations.Known(5, "elsewhere"))
    assert generations.newest_seen(where, {"k1": "key-1"})[1].generation == 3
    assert generations.newest_seen(where, {"k1": "key-1", "k2": "key-2"}) == (
        "key-2", generations.newest_seen(where, {"k2": "key-2"})[1])
    assert generations.newest_seen(where, {"k3": "key-3"}) is None


@pytest.fixture
def signed(packed, tmp_path, agekeys, monkeypatch):
    pytest.importorskip("model_signing")
    monkeypatch.setenv("CUBEPACK_CACHE", str(tmp_path / "cache"))
    owner, owner_pub = make_key(tmp_path, "owner")
    cube = tmp_path / "cube"
    shutil.copytree(packed, cube)
    encrypt(cube, [agekeys["alice"][1]], sign_key=owner)
    return cube, owner, owner_pub


def replay_of(report):
    return [c for c in report.checks if c.name == "replay"]


def test_a_record_cubepack_did_not_write_is_refused_naming_it_and_the_fix(signed, tmp_path):
    cube, _, owner_pub = signed
    [record] = (tmp_path / "cache" / "generations").glob("*.json")
    record.write_text('{"format": "something else"}')
    report = cubepack.verify(cube, trusted_keys=[owner_pub], raise_on_failure=False)
    [replay] = replay_of(report)
    assert replay.ok is False and str(record) in replay.detail and "remove it" in replay.detail
    record.unlink()  # the fix, as said
    assert cubepack.verify(cube, trusted_keys=[owner_pub]).ok


def test_a_cache_that_cannot_be_written_refuses_nothing_and_says_so(signed, tmp_path,
                                                                     monkeypatch):
    cube, _, owner_pub = signed
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    monkeypatch.setenv("CUBEPACK_CACHE", str(blocked))
    report = cubepack.verify(cube, trusted_keys=[owner_pub])
    [replay] = replay_of(report)
    assert replay.ok is True and "not recorded" in replay.detail


def test_encrypt_starts_a_series_or_continues_one(signed, packed, tmp_path, agekeys):
    """Another encryption of the same clear cube (to other readers) is another private cube:
    its own series at generation 1, compared with nothing of the first. --continue carries a
    series on, above every generation of it this user has seen."""
    cube, owner, owner_pub = signed
    rekey(cube, agekeys["alice"][0], add=[agekeys["bob"][1]], sign_key=owner)  # generation 2
    other = tmp_path / "other"
    shutil.copytree(packed, other)
    first = encrypt(other, [agekeys["bob"][1]], sign_key=owner)
    assert first.generation == 1 and first.series != lockfile.series(_lock(cube))
    assert cubepack.verify(cube, trusted_keys=[owner_pub]).ok  # neither refuses the other
    assert cubepack.verify(other, trusted_keys=[owner_pub]).ok
    again = tmp_path / "again"
    shutil.copytree(packed, again)
    result = encrypt(again, [agekeys["alice"][1]], sign_key=owner, continue_from=cube)
    assert (result.series, result.generation) == (lockfile.series(_lock(cube)), 3)
    clear = tmp_path / "clear"
    shutil.copytree(packed, clear)
    with pytest.raises(cubepack.UsageError, match="not a private cube with a generation"):
        encrypt(clear, [agekeys["alice"][1]], continue_from=packed)
    assert not (clear / fileset.PRIVATE_MANIFEST).exists()  # refused before anything


def _lock(cube):
    return json.loads((cube / constants.LOCK_FILENAME).read_text())


def test_a_history_that_cannot_be_walked_is_refused_not_passed(signed, tmp_path):
    """verify --remote of a folder whose origin names a repo the endpoint does not hold (pulled
    from another endpoint): the walk fails, naming why and the fix; it never passes."""
    from cubepack.hub._remote import verify_remote
    from cubepack.testing.hub import InstrumentedHub

    from data import HUB_TOKEN

    cube, _, owner_pub = signed
    with InstrumentedHub(tmp_path / "hub-root", tokens=[HUB_TOKEN]) as hub:
        cubepack.push(cube, "team/notes", endpoint=hub.url, token=HUB_TOKEN,
                      allow_local_paths=True)
        pulled = tmp_path / "pulled"
        cubepack.pull("team/notes@main", local_dir=pulled, endpoint=hub.url, token=HUB_TOKEN,
                      cache_dir=tmp_path / "hf", trusted_keys=[owner_pub])
    with InstrumentedHub(tmp_path / "other-root", tokens=[HUB_TOKEN]) as other:
        report = verify_remote(pulled, endpoint=other.url, token=HUB_TOKEN,
                               trusted_keys=[owner_pub], raise_on_failure=False)
    [walk] = [c for c in report.checks if c.name == "replay" and "history" in c.subject]
    assert walk.ok is False and "HF_ENDPOINT" in walk.detail, walk
