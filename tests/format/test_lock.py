"""The lock (build, serialise, parse) and diff: pure values in and out, no model, no network."""

from __future__ import annotations

import json

import pytest

from cubepack import FormatError, UnsafeInputError
from cubepack._util import constants
from cubepack.format import _lock as lockfile
from cubepack.format._diff import diff_locks

from envs import once

pytestmark = once

SHA = "ab" * 32


IDENTITY = {"weights_digest": "sha256:" + "1" * 64, "tokenizer_digest": None,
            "geometry": {"num_layers": 2}, "compute_config": {"rope_theta": 10000.0},
            "dtype": "float32", "kv_dtype": "float32", "quantization": None, "adapters": None}


def make_lock(**changes):
    files = {"config.json": {"sha256": SHA, "size": 10},
             "activations/a.kv.safetensors": {"sha256": "cd" * 32, "size": 99}}
    models = {"act_mem": {"repo_id": "org/m", "revision": "0" * 40, "strict": True,
                          "name": "org/m", "identity": IDENTITY}}
    activations = {"a": {"file": "activations/a.kv.safetensors", "model_role": "act_mem",
                         "token_count": 3, "kv_dtype": "float32", "num_layers": 2,
                         "sha256": "cd" * 32,
                         "provenance": {"kind": "recorded", "detail": "the KV header"}}}
    values = {"cube_id": "u/c", "files": files, "models": models, "activations": activations,
              "cubepack_version": "0.1.0"}
    values.update(changes)
    return lockfile.build_lock(**values)


def test_lock_round_trips_canonically():
    lock = make_lock()
    text = lockfile.dumps(lock)
    assert lockfile.parse(text.encode()).to_dict() == lock
    assert lockfile.dumps(lockfile.parse(text.encode())) == text  # byte-identical
    assert text.endswith("\n") and json.loads(text) == lock


def test_content_digest_ignores_the_card_but_digest_covers_it():
    plain = make_lock()
    files = dict(plain["files"], **{"README.md": {"sha256": SHA, "size": 1}})
    with_card = make_lock(files=files)
    assert with_card["content_digest"] == plain["content_digest"]
    assert with_card["digest"] != plain["digest"]


@pytest.mark.parametrize("change, message", [
    (lambda l: l.update(lock_version=8), "version 8"),
    (lambda l: l.update(lock_version=1), "cubepack upgrade CUBE_DIR --model MODEL"),
    (lambda l: l.update(extra=1), "unexpected keys"),
    (lambda l: l["files"]["config.json"].update(size=-1), "must be {sha256"),
    (lambda l: l["models"]["act_mem"].update(revision="main"), "not a 40-hex commit"),
    (lambda l: l["models"]["act_mem"].update(revision="0" * 40 + "\n"), "not a 40-hex commit"),
    (lambda l: l["activations"]["a"].update(file="missing.kv.safetensors"), "does not hold"),
    (lambda l: l["activations"]["a"].update(sha256="ef" * 32), "disagree on the sha256"),
    (lambda l: l["activations"]["a"].update(model_role="nobody"), "no pinned identity"),
    # Python compares 2.0 == 2 and True == 1: a version must be an int, not equal to one.
    (lambda l: l.update(lock_version=2.0), r"lock_version must be an integer, found 2\.0"),
    (lambda l: l.update(lock_version=True), "lock_version must be an integer, found True"),
    (lambda l: l["activations"]["a"].update(token_count=2**53),
     r"integer at /activations/a/token_count \(9007199254740992\) lies outside \+-2\*\*53"),
    (lambda l: l["models"]["act_mem"].update(identity={
        **IDENTITY, "compute_config": {"rope_theta": -2**53}}),
     r"/models/act_mem/identity/compute_config/rope_theta"),
])
def test_resealed_but_invalid_locks_are_refused(change, message):
    from cubepack._util import canonical

    lock = make_lock()
    change(lock)  # then reseal both digests, as an attacker with write access would
    lock["content_digest"] = lockfile.content_digest(lock)
    lock.pop("digest")
    lock["digest"] = canonical.digest(lock)
    with pytest.raises(FormatError, match=message):
        lockfile.parse(json.dumps(lock).encode())


def test_a_5000_digit_integer_in_a_lock_is_refused_before_it_is_converted():
    text = lockfile.dumps(make_lock()).replace('"size": 10', '"size": 1' + "0" * 4999, 1)
    with pytest.raises(FormatError, match="number literal 10+... has 5000 characters"):
        lockfile.parse(text.encode())


def test_lock_paths_are_checked_before_anything_else():
    lock = make_lock()
    lock["files"]["../x"] = {"sha256": SHA, "size": 1}
    with pytest.raises(UnsafeInputError, match="'..' segment"):
        lockfile.parse(json.dumps(lock).encode())


def test_diff_names_every_kind_of_change():
    old = make_lock()
    files = dict(old["files"])
    files.pop("config.json")
    files["notes.txt"] = {"sha256": SHA, "size": 2}
    files["activations/a.kv.safetensors"] = {"sha256": "ef" * 32, "size": 99}
    models = json.loads(json.dumps(old["models"]))
    models["act_mem"]["identity"]["dtype"] = "bfloat16"
    activations = {"a": dict(old["activations"]["a"], sha256="ef" * 32)}
    new = make_lock(files=files, models=models, activations=activations)
    result = diff_locks(old, new)["sections"]
    files = result["files"]
    assert (files["added"], files["removed"], list(files["changed"])) == (
        ["notes.txt"], ["config.json"], ["activations/a.kv.safetensors"])
    assert result["models"]["changed"] == {"act_mem": [
        {"field": "identity.dtype", "old": "float32", "new": "bfloat16"}]}
    assert list(result["activations"]["changed"]) == ["a"]
    assert diff_locks(old, new)["same"] is False and diff_locks(old, old)["same"] is True


def _every_leaf(value, path=()):
    if isinstance(value, dict) and value:
        for key, child in value.items():
            yield from _every_leaf(child, path + (key,))
    else:
        yield path


def _changed(value):
    return (value + 1) if type(value) is int else (not value) if isinstance(value, bool) else \
        (value + "x") if isinstance(value, str) else ["changed"] if isinstance(value, list) \
        else {"changed": True}


def test_diff_names_every_leaf_of_every_section_that_moves_a_digest():
    """A sweep: change each leaf of a lock holding every section, one at a time; the digest
    moves, and diff names exactly that leaf, under its section (an optional section added or
    removed, the lineage a pull request brings, a pin's vectors record: all included)."""
    base = make_lock()
    base["adapters"] = {"lora": {"path": "parametric/lora", "rank": 4}}
    base["lineage"] = {"parent": {"lock_digest": "1" * 64, "repo_id": None},
                       "changes": {"reembedded": 0}, "tool": "cubepack migrate"}
    base["models"]["act_mem"]["vectors"] = {"file": "vectors.json", "dimension": 8}
    base["encryption"] = {"version": 1, "ciphertexts": ["a.age"], "counts": {"files": 1},
                          "hidden_names": False}
    base["shards"] = {"shards/activations-00000.kvshard": {
        "index": "shards/activations-00000.index.json", "first": "a", "last": "b",
        "memories": 2}}
    base["preferences"] = {"prefs.json": {"embedder": "pref_mem.embedder", "count": 3,
                                          "collections": {"explicit_preference": 3}}}
    swept = 0
    for key in lockfile.SECTION_KEYS:
        for path in _every_leaf(base[key]):
            changed = json.loads(json.dumps(base))
            node = changed[key]
            for part in path[:-1]:
                node = node[part]
            node[path[-1]] = _changed(node[path[-1]])
            result = diff_locks(base, changed)
            entry = result["sections"][key]
            named = [leaf["field"] for leaves in entry["changed"].values() for leaf in leaves]
            where = ".".join(map(str, path[1:])) if key not in ("lineage", "encryption") \
                else ".".join(map(str, path))
            assert named == [where], (key, path, named)
            swept += 1
    assert swept >= 30
    # a whole section added (a pull request) or removed
    for key in ("adapters", "lineage", "encryption", "shards", "preferences"):
        without = {k: v for k, v in base.items() if k != key}
        assert diff_locks(without, base)["sections"][key]["added"]
        assert diff_locks(base, without)["sections"][key]["removed"]
    assert [c["field"] for c in diff_locks(base, {**base, "cube_id": "x/y"})["lock"]] == ["cube_id"]


def test_every_registered_section_implements_all_its_rules():
    for section in lockfile.SECTIONS:
        for rule in ("validate", "digested", "entries", "describe"):
            assert callable(getattr(section, rule)), (section.key, rule)
        assert section.attest in (None, "producers", "provenance", "lineage")
    assert set(lockfile.SECTION_KEYS) | set(lockfile.FIELDS) == {
        "files", "models", "activations", "adapters", "lineage", "encryption", "shards",
        "preferences", "lock_version",
        "cubepack_version", "cube_id", "content_digest", "digest"}


def test_upgrade_mode_reads_the_version_1_layout_and_checks_the_rest():
    """Version 1 (cubepack 0.1): pins without compute config, activations without provenance."""
    from cubepack._util import canonical

    def version_1(**changes):
        lock = make_lock(**changes)
        lock.update(lock_version=1)
        identity = {k: v for k, v in IDENTITY.items() if k != "compute_config"}
        lock["models"]["act_mem"]["identity"] = identity
        lock["activations"]["a"].pop("provenance")
        lock["content_digest"] = lockfile.content_digest(lock)
        lock.pop("digest")
        lock["digest"] = canonical.digest(lock)
        return json.dumps(lock).encode()

    assert lockfile.parse(version_1(), accept_version_1=True).version == 1
    with pytest.raises(FormatError, match="cubepack upgrade CUBE_DIR --model MODEL"):
        lockfile.parse(version_1())
    bad_path = make_lock()["files"] | {"a/../../x": {"sha256": SHA, "size": 1}}
    with pytest.raises(UnsafeInputError, match="'..' segment"):
        lockfile.parse(version_1(files=bad_path), accept_version_1=True)
    with pytest.raises(FormatError, match="version 8"):
        lockfile.parse(lockfile.dumps(make_lock() | {"lock_version": 8}).encode(),
                       accept_version_1=True)


def test_version_2_locks_are_still_read_and_hold_no_version_3_sections():
    """Version 3 adds optional ``adapters`` and ``lineage``; a version-2 lock (cubepack 0.3)
    reads as before, and may not hold them."""
    from cubepack._util import canonical

    def as_version(version, **extra):
        lock = make_lock()
        lock.update(lock_version=version, **extra)
        lock["content_digest"] = lockfile.content_digest(lock)
        lock.pop("digest")
        lock["digest"] = canonical.digest(lock)
        return json.dumps(lock).encode()

    assert lockfile.parse(as_version(2)).version == 2
    assert make_lock()["lock_version"] == constants.LOCK_VERSION == 4
    with pytest.raises(FormatError, match=r"unexpected keys \['lineage'\]"):
        lockfile.parse(as_version(2, lineage={"parent": None}))
    # an edited section is caught by the content digest even when the outer digest is redone
    lineage = {"parent": {"lock_digest": "a" * 64, "content_digest": "b" * 64, "cube_id": None,
                          "repo_id": None, "revision": None},
               "changes": {"models": {}, "retokenized": [], "reembedded": 0,
                           "adapters_dropped": []},
               "tool": "cubepack migrate", "cubepack_version": "0.1.0"}
    lock = json.loads(as_version(3, lineage=lineage))
    assert lockfile.parse(json.dumps(lock).encode()).lineage.to_dict() == lineage
    lock["lineage"]["changes"]["reembedded"] = 1
    lock.pop("digest")
    lock["digest"] = canonical.digest(lock)
    with pytest.raises(FormatError, match="content_digest mismatch"):
        lockfile.parse(json.dumps(lock).encode())


def test_version_6_holds_preferences_and_shards_either_or_both():
    """Lock version 6 added two optional sections (issue #39's preferences, issue #40's
    shards): a lock holding either, or both, is version 6 and reads each typed."""
    shard, index = "shards/activations-00000.kvshard", "shards/activations-00000.index.json"
    files = {"preferences": {"prefs.json": {"sha256": SHA, "size": 10}},
             "shards": {shard: {"sha256": SHA, "size": 4096}, index: {"sha256": SHA, "size": 500}}}
    models = make_lock()["models"] | {"pref_mem.embedder": {
        "name": "e", "strict": False, "repo_id": None, "revision": None, "identity": None,
        "reason": "none"}}
    sections = {
        "preferences": {"prefs.json": {"embedder": "pref_mem.embedder", "count": 1,
                                       "collections": {"explicit_preference": 1},
                                       "dimension": 4, "sample": ["explicit_preference/x"]}},
        "shards": {shard: {"index": index, "first": "b", "last": "c", "memories": 2}}}
    for held in (["preferences"], ["shards"], ["preferences", "shards"]):
        listed = make_lock()["files"] | {n: e for key in held for n, e in files[key].items()}
        lock = lockfile.parse(lockfile.dumps(make_lock(
            files=listed, models=models, **{key: sections[key] for key in held})).encode())
        assert lock.version == 6
        assert [key for key in ("preferences", "shards") if lock.holds(key)] == held
    assert lock.preferences["prefs.json"].count == 1
    assert lock.shards[shard].memories == 2
