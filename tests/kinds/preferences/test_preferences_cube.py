"""A preference cube through every verb, on cubes MemOS's own dump wrote (memos environment):
pack pins the vectors to their embedder (and refuses the file shared with the text memory,
and a sparse vector), verify checks the file and re-embeds, migrate re-embeds, diff names the
change, encrypt keeps the section in the manifest, and the hook loads the items itself."""

from __future__ import annotations

import json

import pytest

import cubepack
from cubepack._util import constants, hashing
from cubepack.errors import FormatError, IdentityMismatch, UsageError
from cubepack.format import _lock as lockfile

from helpers import reseal_lock
from preferences_memos import PREFERENCES, cube_config, dump_cube, naive_text_mem, read_dump

FILE = "textual_memory.json"  # MemOS's default name for a preference memory


def _lock(cube):
    return lockfile.parse((cube / constants.LOCK_FILENAME).read_bytes())


def _checks(report, name, ok=None):
    return [c for c in report.checks if c.name == name and (ok is None or c.ok is ok)]


def _rewrite(cube, data, name=FILE, change=None):
    """Replace the preference file and re-seal the lock over it (an attacker with write access:
    a signature is what stops one)."""
    path = cube / name
    path.write_text(json.dumps(data))
    digest, size = hashing.sha256_file(path), path.stat().st_size

    def edit(lock):
        lock["files"][name] = {"sha256": digest, "size": size}
        if change is not None:
            change(lock)
    reseal_lock(cube, edit)


# --- pack -----------------------------------------------------------------------------------------

def test_pack_pins_memos_default_dump_in_a_version_6_lock(default_dump):
    cubepack.pack(default_dump)
    lock = _lock(default_dump)
    entry = lock.preferences[FILE]
    assert lock.version == 6
    assert (entry.count, entry.dimension, dict(entry.collections), entry.embedder) == (
        4, 32, {"explicit_preference": 2, "implicit_preference": 2}, "pref_mem.embedder")
    assert entry.probes is None and "pref_mem.embedder" in lock.models
    report = cubepack.verify(default_dump)
    assert [c.ok for c in _checks(report, "preferences")] == [True]


def test_pack_with_the_embedder_records_its_probes_and_refuses_another(default_dump,
                                                                       pref_server,
                                                                       other_server):
    with pytest.raises(IdentityMismatch, match="did not make these vectors"):
        cubepack.pack(default_dump, embedder=other_server.spec)
    assert not (default_dump / constants.LOCK_FILENAME).exists()  # nothing written
    cubepack.pack(default_dump, embedder=pref_server.spec)
    assert len(_lock(default_dump).preferences[FILE].probes) == 4


def test_pack_refuses_the_file_shared_with_the_text_memory_naming_the_fix(tmp_path,
                                                                          pref_server):
    folder = dump_cube(tmp_path / "both", pref_server, text_mem=naive_text_mem())
    with pytest.raises(UsageError) as caught:
        cubepack.pack(folder)
    assert '"memory_filename": "preference_memory.json" in pref_mem.config' in str(caught.value)
    assert not (folder / constants.LOCK_FILENAME).exists()
    # The fix it names works: dumped again with the preference memory's own file name.
    fixed = dump_cube(tmp_path / "fixed", pref_server, text_mem=naive_text_mem(),
                      memory_filename="preference_memory.json")
    cubepack.pack(fixed)
    assert set(_lock(fixed).preferences) == {"preference_memory.json"}
    assert isinstance(read_dump(fixed), list)  # the text memory's own file survived


def test_pack_refuses_an_item_carrying_a_sparse_vector(default_dump):
    data = read_dump(default_dump)
    data["explicit_preference"][0]["sparse_vector"] = {"3": 0.5}
    (default_dump / FILE).write_text(json.dumps(data))
    with pytest.raises(FormatError, match="sparse vector .*dense vectors only"):
        cubepack.pack(default_dump)


# --- verify ---------------------------------------------------------------------------------------

def test_verify_with_the_embedder_re_embeds_the_preferences(default_dump, pref_server,
                                                            other_server):
    cubepack.pack(default_dump)
    report = cubepack.verify(default_dump, embedder=pref_server.spec, embedder_sample=0)
    passed = [c for c in _checks(report, "embedder", True) if FILE in c.subject]
    assert len(passed) == 4 and all(c.role == "pref_mem.embedder" for c in passed)
    report = cubepack.verify(default_dump, embedder=other_server.spec, raise_on_failure=False)
    failed = _checks(report, "embedder", False)
    assert failed and all("cosine" in c.detail and FILE in c.subject for c in failed)


@pytest.mark.parametrize("attack", ["drop an item", "add a sparse vector", "remove the record",
                                    "change the dimension"])
def test_a_resealed_cube_whose_preferences_differ_is_refused(default_dump, attack):
    cubepack.pack(default_dump)
    data = read_dump(default_dump)
    change = None
    if attack == "drop an item":
        data["implicit_preference"].pop()
    elif attack == "add a sparse vector":
        data["implicit_preference"][0]["sparse_vector"] = {"1": 1.0}
    elif attack == "change the dimension":
        for items in data.values():
            for item in items:
                item["vector"] = item["vector"] + [0.0]
    else:
        def change(lock):
            del lock["preferences"]
    _rewrite(default_dump, data, change=change)
    report = cubepack.verify(default_dump, raise_on_failure=False)
    assert not report.ok and _checks(report, "preferences", False)


# --- migrate and diff -----------------------------------------------------------------------------

def test_migrate_re_embeds_every_preference_and_diff_names_the_change(default_dump, tmp_path,
                                                                      pref_server,
                                                                      other_server):
    cubepack.pack(default_dump, embedder=pref_server.spec)
    result = cubepack.migrate(default_dump, out=tmp_path / "moved", embedder=other_server.spec)
    moved = tmp_path / "moved"
    assert result.reembedded >= 4 and _lock(moved).lineage.to_dict()["changes"]["reembedded"] >= 4
    cubepack.verify(moved, embedder=other_server.spec, embedder_sample=0)
    with pytest.raises(cubepack.VerificationFailed):
        cubepack.verify(moved, embedder=pref_server.spec)
    kept = {item["id"]: item["memory"] for items in read_dump(moved).values() for item in items}
    assert sorted(kept.values()) == sorted(p[1] for p in PREFERENCES)
    changes = cubepack.diff(default_dump, moved)
    section = changes["sections"]["preferences"]
    assert FILE in section["changed"]
    assert any(leaf["field"].startswith("probes") for leaf in section["changed"][FILE])


# --- encrypt ----------------------------------------------------------------------------------------

@pytest.fixture
def agekey(tmp_path):
    import os

    pyrage = pytest.importorskip("pyrage", reason="private cubes need cubepack[private]")
    identity = pyrage.x25519.Identity.generate()
    path = tmp_path / "alice.key"
    path.write_text(f"{identity}\n")
    os.chmod(path, 0o600)
    return path, str(identity.to_public())


def test_a_private_cube_keeps_the_section_in_its_manifest(default_dump, agekey, tmp_path,
                                                          pref_server):
    import cubepack.memos as hook

    cubepack.pack(default_dump)
    cubepack.encrypt(default_dump, [agekey[1]])
    public = _lock(default_dump)
    assert public.private and not public.holds("preferences")
    report = cubepack.verify(default_dump, decrypt_with=agekey[0])
    assert [c.ok for c in _checks(report, "preferences")] == [True]
    store = tmp_path / "p.db"  # Milvus Lite persists: a private cube's store must be named
    with pytest.raises(UsageError, match="persists them beyond this process"):
        hook.init_from_dir(default_dump, memory_types=["pref_mem"], decrypt_with=agekey[0],
                           default_config=cube_config(store, pref_server))
    cube = hook.init_from_dir(default_dump, memory_types=["pref_mem"], decrypt_with=agekey[0],
                              default_config=cube_config(store, pref_server),
                              stores=[f"milvus:{store}"])
    assert sum(len(cube.pref_mem.vector_db.get_all(c)) for c in
               ("explicit_preference", "implicit_preference")) == 4


# --- the MemOS hook ---------------------------------------------------------------------------------

def _held(memory):
    return sorted(item.memory for name in ("explicit_preference", "implicit_preference")
                  for item in memory.vector_db.get_all(name))


def test_the_hook_loads_every_preference_memos_own_load_drops(default_dump, tmp_path,
                                                              pref_server):
    import cubepack.memos as hook

    cubepack.pack(default_dump)
    cube = hook.init_from_dir(default_dump)
    assert _held(cube.pref_mem) == sorted(p[1] for p in PREFERENCES)
    assert any("4 preferences" in line for line in cube.cubepack.loaded)


def test_a_hooked_preference_load_of_a_packed_folder_loads_the_items(default_dump, tmp_path,
                                                                     pref_server, installed):
    from memos.mem_cube.general import GeneralMemCube

    cubepack.pack(default_dump)
    cube = GeneralMemCube(cube_config(tmp_path / "fresh.db", pref_server))
    cube.pref_mem.load(str(default_dump))
    assert _held(cube.pref_mem) == sorted(p[1] for p in PREFERENCES)


@pytest.mark.parametrize("policy", ["error", "drop", "rebuild"])
def test_the_hook_checks_the_loaded_embedder_and_applies_the_policy(default_dump, tmp_path,
                                                                    other_server, policy):
    import cubepack.memos as hook

    cubepack.pack(default_dump)
    swapped = cube_config(tmp_path / "swapped.db", other_server)
    if policy == "error":
        with pytest.raises(IdentityMismatch, match=r"vectors\[.*\]\.cosine"):
            hook.init_from_dir(default_dump, default_config=swapped)
        return
    cube = hook.init_from_dir(default_dump, default_config=swapped, on_mismatch=policy)
    if policy == "drop":
        assert _held(cube.pref_mem) == [] and "pref_mem.embedder" in cube.cubepack.dropped
        return
    assert _held(cube.pref_mem) == sorted(p[1] for p in PREFERENCES)
    from cubepack.kinds.vectors._vectors import cosine

    stored = {item.memory: item.vector for name in ("explicit_preference", "implicit_preference")
              for item in cube.pref_mem.vector_db.get_all(name)}
    [live] = cube.pref_mem.embedder.embed([PREFERENCES[0][1]])
    assert cosine(stored[PREFERENCES[0][1]], live) > 0.999  # re-embedded in the live space


def test_the_hook_refuses_a_store_that_does_not_hold_every_item(default_dump, tmp_path,
                                                                pref_server, monkeypatch):
    """The count is checked in the store after loading: a store that kept fewer items (here,
    one whose add drops the last of each batch) is refused, never a silently short memory."""
    import cubepack.memos as hook
    from memos.vec_dbs.milvus import MilvusVecDB

    cubepack.pack(default_dump)
    add = MilvusVecDB.add
    monkeypatch.setattr(MilvusVecDB, "add", lambda self, name, data: add(self, name, data[:-1]))
    with pytest.raises(cubepack.IntegrityError, match="holds 2 of the 4 preferences"):
        hook.init_from_dir(default_dump, default_config=cube_config(tmp_path / "s.db",
                                                                    pref_server))


def test_the_hooks_load_reads_only_the_bytes_the_lock_records(default_dump, tmp_path,
                                                              pref_server):
    """The file is read once and checked against its locator before it is parsed: a file
    changed after verify (here, between the lock being read and the load) is refused, never
    loaded."""
    from memos.mem_cube.general import GeneralMemCube

    from cubepack.kinds.preferences._memos import load_preferences
    from cubepack.memos._activations import HookReport
    from cubepack.trust import TrustPolicy

    cubepack.pack(default_dump)
    lock = _lock(default_dump)
    data = read_dump(default_dump)
    data["explicit_preference"][0]["payload"]["preference"] = "no tea, ever"  # vectors intact
    (default_dump / FILE).write_text(json.dumps(data))
    cube = GeneralMemCube(cube_config(tmp_path / "t.db", pref_server))
    with pytest.raises(cubepack.CubepackError, match=r"textual_memory.json \[0:.*expected"):
        load_preferences(cube.pref_mem, default_dump, lock, HookReport(cube_dir=default_dump),
                         TrustPolicy())
    assert _held(cube.pref_mem) == []


def test_the_store_computes_the_sparse_vectors_the_cube_does_not_carry(default_dump):
    """Sparse (BM25) vectors are no part of a cube: MemOS's Milvus store computes them from each
    item's memory text as the hook adds the items, so a text search finds them."""
    import cubepack.memos as hook

    cubepack.pack(default_dump)
    cube = hook.init_from_dir(default_dump)
    hits = cube.pref_mem.vector_db.search(query_vector=[0.0] * 32, query="green tea morning",
                                          collection_name="explicit_preference", top_k=1,
                                          search_type="sparse")
    assert [hit.memory for hit in hits] == [PREFERENCES[0][1]]
