"""Partial pulls (issue #40 item 2): ``cubepack pull REPO --include ITEM_OR_PATTERN`` places the
lock, its signature, every file that is no memory, and only the memories asked for; a sharded
cube's by byte range into sparse shards. Requests and bytes are counted at the local endpoint,
through the real huggingface_hub client. The cube here: 5 memories, two a shard (shards 0, 1,
2 hold item-000/001, item-002/003, item-004)."""

from __future__ import annotations

import json

import pytest
import torch

import cubepack
from cubepack._util import constants
from cubepack.cli import main
from cubepack.errors import PartialCube, UsageError
from cubepack.format import _lock as lockfile
from cubepack.format import _partial as partialformat

from data import HUB_TOKEN

SHARD_1 = "shards/activations-00001.kvshard"


def _push(hub, cube, repo="me/cube"):
    return cubepack.push(cube, repo, endpoint=hub.url, token=HUB_TOKEN,
                         allow_local_paths=True).commit_sha


def _pull(hub, target, *include, repo="me/cube", **kwargs):
    return cubepack.pull(repo, endpoint=hub.url, token=HUB_TOKEN, local_dir=target,
                         include=include, **kwargs)


def _index(cube, shard_path):
    from cubepack.format.sections import shards

    lock = lockfile.parse((cube / constants.LOCK_FILENAME).read_bytes())
    return shards.load_index(lock.shards[shard_path], shards.local_fetch(cube), lock.models)


def _shard_requests(hub):
    return {key: count for key, count in hub.stats.requests.items() if ".kvshard" in key}


def test_one_memory_fetches_its_index_and_its_range_only(hub, sharded, tmp_path, models,
                                                          bundle_factory):
    commit = _push(hub, sharded)
    hub.stats.reset()
    result = _pull(hub, tmp_path / "p", "item-002")
    target = tmp_path / "p"
    memory = _index(sharded, SHARD_1).memories["item-002"].locator
    whole = [name for name in ("cubepack.lock", "cubepack.yaml", "README.md", ".gitattributes")
             if (sharded / name).is_file() or name == ".gitattributes"]
    sizes = sum((target / name).stat().st_size for name in whole)
    index_size = (sharded / "shards/activations-00001.index.json").stat().st_size
    # Every byte sent: the whole files, the one index, the one memory's range; nothing else.
    assert hub.stats.sent_bytes == sizes + index_size + memory.length
    assert _shard_requests(hub) == {f"GET /datasets/me/cube/resolve/<oid>/{SHARD_1}": 1}
    assert not (target / "shards/activations-00000.kvshard").exists()
    assert not (target / "shards/activations-00000.index.json").exists()
    assert (target / SHARD_1).stat().st_size == (sharded / SHARD_1).stat().st_size
    assert result.report.partial["checked"] == 1 and result.report.partial["memories"] == 5
    marker = partialformat.read(target)
    assert marker.memories == {"item-002": SHARD_1} and marker.commit_sha == commit
    # The present memory loads from the sparse shard, as it would from the whole cube.
    cache = cubepack.load_kv_cache(target, models["a"], item="item-002")
    alone = cubepack.load_kv_cache(
        bundle_factory(5) / "activations" / "item-002.kv.safetensors", models["a"])
    for layer, other in zip(cache.layers, alone.layers):
        assert torch.equal(layer.keys, other.keys)
    # An absent one is refused by name, naming the pull that brings it.
    with pytest.raises(PartialCube, match=r"memory 'item-000' is not here .*--include item-000"):
        cubepack.load_kv_cache(target, models["a"], item="item-000")


def test_a_sparse_shard_holds_only_its_ranges_on_disk(hub, bundle, zoo, tmp_path):
    """Two memories of 64 KiB-ish each a shard apart: the partial shard's blocks on disk are
    those of its one range (a file system with holes)."""
    cube = bundle(5, tokens=200)
    size = next((cube / "activations").iterdir()).stat().st_size
    cubepack.pack(cube, cube_id="me/big", model=str(zoo["a"]), shard_size=5 * size + 500)
    _push(hub, cube)
    _pull(hub, tmp_path / "p", "item-004")
    shard = tmp_path / "p" / "shards/activations-00000.kvshard"
    st = shard.stat()
    assert st.st_size == (cube / "shards/activations-00000.kvshard").stat().st_size
    assert st.st_blocks * 512 < 2 * size + 8192  # the range, not the five memories


def test_verify_says_n_of_m_with_its_own_exit_code(hub, sharded, tmp_path, capsys):
    _push(hub, sharded)
    _pull(hub, tmp_path / "p", "item-002", "item-004")
    report = cubepack.verify(tmp_path / "p")
    assert report.ok and report.partial["checked"] == 2 and report.partial["memories"] == 5
    assert report.complete is False  # the API's word for "whole", beside ok (present passed)
    assert report.to_dict()["complete"] is False
    summary = [check for check in report.checks if check.name == "partial"
               and check.subject == "*"]
    assert summary[0].ok is None and "2 of 5 memories checked" in summary[0].detail
    capsys.readouterr()
    assert main(["verify", str(tmp_path / "p")]) == PartialCube.exit_code == 4
    out, err = capsys.readouterr()
    assert "PARTIAL: 2 of 5 memories checked" in out and "verified:" not in out
    assert main(["verify", str(tmp_path / "p"), "--json"]) == 4
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is False and data["error"]["type"] == "PartialCube"
    assert data["error"]["exit_code"] == 4 and data["report"]["partial"]["checked"] == 2


def test_recompute_applies_to_the_memories_present_and_says_so(hub, sharded, tmp_path, zoo):
    _push(hub, sharded)
    _pull(hub, tmp_path / "p", "item-003")
    report = cubepack.verify(tmp_path / "p", model=str(zoo["a"]), recompute=True)
    recomputed = [check.subject for check in report.checks
                  if check.name == "recompute" and check.ok]
    assert recomputed and all("item-003" in subject for subject in recomputed)
    summary = next(check for check in report.checks
                   if check.name == "partial" and check.subject == "*")
    assert "recompute" in summary.detail and "applied to the 1 memories present" in summary.detail


def test_patterns_match_ids_and_paths_across_shards(hub, sharded, tmp_path):
    _push(hub, sharded)
    hub.stats.reset()
    result = _pull(hub, tmp_path / "a", "item-00[13]")  # one id in shard 0, one in shard 1
    assert result.report.partial["checked"] == 2
    assert set(partialformat.read(tmp_path / "a").memories) == {"item-001", "item-003"}
    assert len(_shard_requests(hub)) == 2
    # A path selects every memory of its file: shard 2 holds one, fetched whole.
    result = _pull(hub, tmp_path / "b", "shards/activations-00002.kvshard")
    assert set(partialformat.read(tmp_path / "b").memories) == {"item-004"}
    assert (tmp_path / "b/shards/activations-00002.kvshard").read_bytes() == \
        (sharded / "shards/activations-00002.kvshard").read_bytes()


def test_a_pattern_that_matches_nothing_is_refused_naming_ids(hub, sharded, tmp_path, capsys,
                                                              monkeypatch):
    from helpers import point_hub_client_at

    _push(hub, sharded)
    with pytest.raises(UsageError, match=r"'item-9\*' matches no memory.*item-000, item-001"):
        _pull(hub, tmp_path / "p", "item-002", "item-9*")
    assert not (tmp_path / "p").exists()
    point_hub_client_at(monkeypatch, hub.url, tmp_path / "hf-cache")
    capsys.readouterr()
    assert main(["pull", "me/cube", "--include", "nope", "--local-dir", str(tmp_path / "q"),
                 "--token", HUB_TOKEN, "--json"]) == 2
    error = json.loads(capsys.readouterr().out)["error"]
    assert error["type"] == "UsageError" and "'nope' matches no memory" in error["message"]
    assert not (tmp_path / "q").exists()


def test_a_cube_of_one_file_a_memory(hub, bundle, zoo, tmp_path, models):
    cube = bundle(3)
    cubepack.pack(cube, cube_id="me/flat", model=str(zoo["a"]))
    _push(hub, cube)
    hub.stats.reset()
    result = _pull(hub, tmp_path / "p", "activations/item-001*")
    assert result.report.partial == {**result.report.partial, "checked": 1, "memories": 3}
    assert sorted(path.name for path in (tmp_path / "p/activations").iterdir()) == \
        ["item-001.kv.safetensors"]
    assert not any("item-000" in key or "item-002" in key for key in hub.stats.requests)
    cubepack.load_kv_cache(tmp_path / "p", models["a"], item="item-001")
    with pytest.raises(PartialCube, match="'item-002' is not here"):
        cubepack.load_kv_cache(tmp_path / "p", models["a"], item="item-002")


@pytest.mark.parametrize("verb", ["pack", "push", "upgrade", "sign", "migrate", "encrypt"])
def test_verbs_that_need_the_cube_whole_refuse_a_partial_one(hub, sharded, tmp_path, zoo,
                                                             verb, private_keys_factory=None):
    _push(hub, sharded)
    result = _pull(hub, tmp_path / "p", "item-002")
    cube = tmp_path / "p"
    calls = {
        "pack": lambda: cubepack.pack(cube, model=str(zoo["a"])),
        "push": lambda: cubepack.push(cube, "me/other", endpoint=hub.url, token=HUB_TOKEN,
                                      allow_local_paths=True),
        "upgrade": lambda: cubepack.upgrade(cube, str(zoo["a"])),
        "sign": lambda: cubepack.sign(cube, tmp_path / "no-key.pem"),
        "migrate": lambda: cubepack.migrate(cube, model=str(zoo["a"]), out=tmp_path / "m"),
        "encrypt": lambda: cubepack.encrypt(cube, ["age1qqqq"]),
    }
    before = sorted((p.relative_to(cube).as_posix(), p.stat().st_mtime_ns)
                    for p in cube.rglob("*"))
    with pytest.raises(PartialCube, match=rf"{verb} .*Pull it whole: cubepack pull "
                                          rf"me/cube@{result.commit_sha}"):
        calls[verb]()
    assert sorted((p.relative_to(cube).as_posix(), p.stat().st_mtime_ns)
                  for p in cube.rglob("*")) == before


def test_the_pull_an_absent_memory_names_works_in_the_same_folder(hub, sharded, tmp_path,
                                                                   models, monkeypatch, capsys):
    """The refusal's suggestion, run as printed (the CLI, --local-dir the partial folder):
    the folder then holds both memories, and the whole pull it names makes it whole."""
    import shlex

    from helpers import point_hub_client_at

    _push(hub, sharded)
    target = tmp_path / "p"
    _pull(hub, target, "item-002")
    with pytest.raises(PartialCube) as caught:
        cubepack.load_kv_cache(target, models["a"], item="item-004")
    more, whole = caught.value.args[0].split("Pull it too: ")[1].split(", or the whole cube: ")
    point_hub_client_at(monkeypatch, hub.url, tmp_path / "hf-cache")
    argv = shlex.split(more.replace("<this folder>", str(target)))[1:]
    assert main([*argv, "--token", HUB_TOKEN]) == 0
    assert set(partialformat.read(target).memories) == {"item-002", "item-004"}
    cubepack.load_kv_cache(target, models["a"], item="item-004")
    argv = shlex.split(whole.rstrip(".").replace("<this folder>", str(target)))[1:]
    assert main([*argv, "--token", HUB_TOKEN]) == 0
    assert partialformat.read(target) is None
    assert cubepack.verify(target).partial is None and cubepack.verify(target).complete
    assert main(["verify", str(target)]) == 0


def test_adjacent_memories_of_a_shard_come_in_one_range(hub, bundle, zoo, tmp_path):
    cube = bundle(5)
    size = next((cube / "activations").iterdir()).stat().st_size
    cubepack.pack(cube, cube_id="me/three", model=str(zoo["a"]), shard_size=3 * size + 200)
    _push(hub, cube)
    hub.stats.reset()
    result = _pull(hub, tmp_path / "p", "item-000", "item-001")  # of item-000..002
    assert result.report.partial["checked"] == 2
    assert _shard_requests(hub) == {
        "GET /datasets/me/cube/resolve/<oid>/shards/activations-00000.kvshard": 1}


def test_include_offline_is_refused_before_anything(hub, sharded, tmp_path):
    _push(hub, sharded)
    hub.stats.reset()
    with pytest.raises(UsageError, match="offline"):
        _pull(hub, tmp_path / "p", "item-002", offline=True)
    assert sum(hub.stats.requests.values()) == 0 and not (tmp_path / "p").exists()
