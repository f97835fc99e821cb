"""A load of one memory reads its shard's index for that memory (docs/reference/shards.md,
"What one memory's load checks"): what decides the load is refused by it, what concerns only
the other memories is refused by verify and leaves this memory's load as it was. Swept over a
shard of 5 memories (item-000 to item-004), loaded locally and on demand."""

from __future__ import annotations

import json
import shutil

import pytest

import cubepack
from cubepack._util import canonical
from cubepack.errors import FormatError

from helpers import reseal_lock

SHARD = "shards/activations-00000.kvshard"
INDEX = "shards/activations-00000.index.json"


@pytest.fixture(scope="module")
def one_shard(bundle_factory, zoo, tmp_path_factory):
    cube = tmp_path_factory.mktemp("one-shard") / "cube"
    shutil.copytree(bundle_factory(5), cube)
    cubepack.pack(cube, cube_id="me/one-shard", model=str(zoo["a"]), shards=True)
    return cube


@pytest.fixture
def cube(one_shard, tmp_path):
    target = tmp_path / "cube"
    shutil.copytree(one_shard, target)
    return target


def _edit(cube, remote, change):
    def edit(index):
        change(index["memories"])
    remote.edit_index(cube, INDEX, edit)


def _overlap_of_two_others(cube, remote):
    _edit(cube, remote, lambda m: m["item-004"].update(offset=m["item-004"]["offset"] - 64))


def _bytes_hidden_after_the_last(cube, remote):
    _edit(cube, remote, lambda m: m["item-004"].update(length=m["item-004"]["length"] - 1))


def _others_out_of_order(cube, remote):
    def change(m):
        three, four = m["item-003"], m["item-004"]
        for key in ("offset", "sha256"):
            three[key], four[key] = four[key], three[key]
    _edit(cube, remote, change)


def _another_record_malformed(cube, remote):
    _edit(cube, remote, lambda m: m["item-004"].update(kv_dtype=5))


def _another_record_repeats_a_key(cube, remote):
    text = (cube / INDEX).read_text()
    at = text.index('"item-004":{') + len('"item-004":{')
    remote.plant(cube, INDEX, text[:at] + '"kv_dtype":"x",' + text[at:])


def _its_range_overlaps_the_next(cube, remote):
    _edit(cube, remote, lambda m: m["item-001"].update(offset=m["item-001"]["offset"] - 64))


def _it_is_listed_twice(cube, remote):
    text = (cube / INDEX).read_text()
    record = json.loads(text)["memories"]["item-000"]
    at = text.index('"item-004":')
    remote.plant(cube, INDEX, text[:at] + '"item-000":' + canonical.dumps(record, compact=True)
                 + "," + text[at:])


def _another_id_equal_once_normalised(cube, remote):
    twin = "item-00\uff10"  # FULLWIDTH DIGIT ZERO: "item-000" in NFKC
    _edit(cube, remote, lambda m: m.__setitem__(twin, dict(m["item-004"])))
    reseal_lock(cube, lambda lock: lock["shards"][SHARD].update(memories=6, last=twin))


def _its_record_repeats_a_key(cube, remote):
    text = (cube / INDEX).read_text()
    at = text.index('"item-000":{') + len('"item-000":{')
    remote.plant(cube, INDEX, text[:at] + '"offset":64,' + text[at:])


def _its_range_past_the_shard(cube, remote):
    _edit(cube, remote, lambda m: m["item-000"].update(offset=10 ** 9))


LOADED = [_overlap_of_two_others, _bytes_hidden_after_the_last, _others_out_of_order,
          _another_record_malformed, _another_record_repeats_a_key]
REFUSED = [(_its_range_overlaps_the_next, "overlap memory 'item-001'"),
           (_it_is_listed_twice, "twice"),
           (_another_id_equal_once_normalised, "normalisation"),
           (_its_record_repeats_a_key, "repeats a key"),
           (_its_range_past_the_shard, "points outside its shard")]


def _verify_refuses(cube, zoo):
    report = cubepack.verify(cube, model=str(zoo["a"]), raise_on_failure=False)
    assert not report.ok, report.to_dict()


@pytest.mark.parametrize("attack", LOADED, ids=lambda f: f.__name__)
def test_what_concerns_other_memories_leaves_this_load_and_verify_refuses(
        cube, zoo, models, remote, attack):
    alone = cubepack.load_kv_cache(cube, models["a"], item="item-000")
    attack(cube, remote)
    _verify_refuses(cube, zoo)
    cache = cubepack.load_kv_cache(cube, models["a"], item="item-000")
    assert cache.get_seq_length() == alone.get_seq_length() == 4
    for layer, other in zip(cache.layers, alone.layers):
        assert layer.keys.equal(other.keys) and layer.values.equal(other.values)


@pytest.mark.parametrize("attack, words", REFUSED, ids=lambda f: getattr(f, "__name__", None))
def test_what_decides_this_load_is_refused_by_it(cube, zoo, models, remote, attack, words):
    attack(cube, remote)
    _verify_refuses(cube, zoo)
    with pytest.raises(FormatError, match=words):
        cubepack.load_kv_cache(cube, models["a"], item="item-000")


@pytest.mark.parametrize("attack, words",
                         [(LOADED[0], None), (REFUSED[0][0], REFUSED[0][1])],
                         ids=["another-pair-overlaps", "its-range-overlaps"])
def test_on_demand_as_locally(hub, cube, models, remote, attack, words):
    remote.push(hub, cube)  # a cube push verifies; the attack is uploaded without cubepack
    attack(cube, remote)
    remote.upload(hub, cube, [INDEX, "cubepack.lock"])
    opened = remote.open(hub)
    if words is None:
        assert opened.load("item-000", models["a"]).get_seq_length() == 4
    else:
        with pytest.raises(FormatError, match=words):
            opened.load("item-000", models["a"])


def test_its_record_nested_past_the_strict_bound_is_refused(cube, models, remote):
    """The strict parse's depth bound holds for the memory's own record (a value nested 500
    deep, inside the C parser's bound): refused as FormatError, not a RecursionError."""
    text = (cube / INDEX).read_text()
    at = text.index('"item-000":{') + len('"item-000":{')
    remote.plant(cube, INDEX, text[:at] + '"extra":' + "[" * 500 + "]" * 500 + "," + text[at:])
    with pytest.raises(FormatError, match="nest"):
        cubepack.load_kv_cache(cube, models["a"], item="item-000")
