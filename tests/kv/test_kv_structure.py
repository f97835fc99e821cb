"""KV files with a true producer and a lying structure are refused before any tensor is used.

Each case keeps the producer identity honest and breaks the structure a loader relies on; each
must be refused by ``read_kv_header`` with a FormatError naming the problem, and by
``cubepack inspect`` with exit code 1.
"""

from __future__ import annotations

import json
import struct

import pytest
import torch
from safetensors.torch import save_file

import cubepack
from cubepack import FormatError
from cubepack.cli import main
from cubepack.kv import read_kv_header

from helpers import build_cache


@pytest.fixture(scope="module")
def honest(models, tmp_path_factory):
    """(tensors, metadata) of honest files from model A (full layers) and the hybrid model
    (a 4-token sliding window), 10 tokens each."""
    folder = tmp_path_factory.mktemp("honest")
    result = {}
    for kind in ("a", "hybrid"):
        ids = torch.arange(2, 12)[None]
        path = cubepack.save_kv_cache(build_cache(models[kind], ids), folder / f"{kind}.kv",
                                      producer=models[kind], token_ids=ids)
        from safetensors import safe_open

        with safe_open(str(path), "pt") as handle:
            tensors = {name: handle.get_tensor(name).clone() for name in handle.keys()}
            meta = json.loads(handle.metadata()["cubepack"])
        result[kind] = (tensors, meta)
    return result


def write(tmp_path, tensors, meta, name="case.kv.safetensors"):
    path = tmp_path / name
    save_file(tensors, str(path), metadata={"cubepack": json.dumps(sealed(meta))})
    return path


def sealed(meta):
    """The metadata with its header checksum recomputed (as anyone writing a header can): the
    structure checks these cases reach lie behind it."""
    from cubepack.kv import _checksum

    return _checksum.seal(meta)


def case_uneven_lengths(tensors, meta):
    for part in ("keys", "values"):
        tensors[f"layers.1.{part}"] = tensors[f"layers.1.{part}"][:, :, :7].contiguous()
    meta["layers"][1]["cumulative_length"] = 7
    return r"layers\[1\]\.cumulative_length: expected 10, found 7"


def case_batch_differs(tensors, meta):
    for part in ("keys", "values"):
        tensors[f"layers.1.{part}"] = tensors[f"layers.1.{part}"].repeat(2, 1, 1, 1)
    return r"layers\[1\]\.batch: expected 1, found 2"


def case_zero_size_huge_positions(tensors, meta):
    for part in ("keys", "values"):
        tensors[f"layers.0.{part}"] = tensors[f"layers.0.{part}"][:, :, :0].contiguous()
    for layer in meta["layers"]:
        layer["cumulative_length"] = 10**9
    meta["token_count"], meta["token_ids"] = 10**9, None
    return r"layers\[0\]\.stored_positions"


def case_sliding_longer_than_window(tensors, meta):
    full = torch.zeros(1, 2, 10, 16)
    tensors["layers.0.keys"], tensors["layers.0.values"] = full, full.clone()
    return r"layers\[0\]\.stored_positions: expected <= 3 \(the sliding window 4"


def case_cumulative_contradicts_storage(tensors, meta):
    for part in ("keys", "values"):
        tensors[f"layers.0.{part}"] = tensors[f"layers.0.{part}"][:, :, :2].contiguous()
    return r"layers\[0\]\.stored_positions: expected 3"


def case_token_ids_outside_vocabulary(tensors, meta):
    meta["token_ids"][3] = 10**6
    return r"token id 1000000 lies outside its producer's vocabulary \(0\.\.999\)"


def case_token_id_negative(tensors, meta):
    meta["token_ids"][0] = -1
    return r"token id -1 lies outside its producer's vocabulary"


def case_token_id_a_boolean(tensors, meta):  # json true, which Python counts as the int 1
    meta["token_ids"][5] = True
    return r"token_ids must be a list of 10 integers"


def case_token_id_a_float(tensors, meta):
    meta["token_ids"][9] = 4.0
    return r"token_ids must be a list of 10 integers"


def case_token_id_a_string(tensors, meta):
    meta["token_ids"][2] = "7"
    return r"token_ids must be a list of 10 integers"


def case_token_count_lies(tensors, meta):
    meta["token_count"] = 3
    return r"token_count 3 contradicts its layers"


CASES = {name[5:]: function for name, function in dict(globals()).items()
         if name.startswith("case_")}
#: Which honest file each case starts from (the sliding-window cases need the hybrid model).
KINDS = {name: "hybrid" if name in ("zero_size_huge_positions", "sliding_longer_than_window",
                                    "cumulative_contradicts_storage") else "a"
         for name in CASES}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_lying_structure_is_refused_by_the_reader_and_the_cli(name, honest, tmp_path, capsys):
    kind = KINDS[name]
    tensors, meta = dict(honest[kind][0]), json.loads(json.dumps(honest[kind][1]))
    expected = CASES[name](tensors, meta)
    path = write(tmp_path, tensors, meta)
    with pytest.raises(FormatError, match=expected):
        read_kv_header(path)
    assert main(["inspect", str(path)]) == 1
    assert "error:" in capsys.readouterr().err


@pytest.mark.parametrize("where", ["top level", "producer"])
def test_a_key_repeated_in_the_cubepack_metadata_is_refused(honest, tmp_path, where):
    """json keeps the last of two equal keys, other readers the first: token ids (or a
    producer field) given twice would be two different files to two readers."""
    tensors, meta = dict(honest["a"][0]), json.loads(json.dumps(honest["a"][1]))
    text = json.dumps(meta)
    if where == "top level":
        text = text[:-1] + ', "token_ids": ' + json.dumps(meta["token_ids"][::-1]) + "}"
    else:
        text = text.replace('"producer": {', '"producer": {"dtype": "float16", ', 1)
    path = tmp_path / "twice.kv.safetensors"
    save_file(tensors, str(path), metadata={"cubepack": text})
    with pytest.raises(FormatError, match="repeats the key"):
        read_kv_header(path)


def _raw_file(header: dict, data: bytes, pad_to: int = 8) -> bytes:
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % pad_to)
    return struct.pack("<Q", len(encoded)) + encoded + data


def test_duplicate_tensor_keys_in_the_header_are_refused(tmp_path):
    entry = '{"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}'
    text = '{"x": ' + entry + ', "x": ' + entry + '}'
    raw = text.encode() + b" " * (-len(text) % 8)
    path = tmp_path / "dup.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(4))
    with pytest.raises(FormatError, match="ambiguous safetensors header: it repeats the key 'x'"):
        read_kv_header(path)


@pytest.mark.parametrize("layout, message", [
    ({"x": [4, 8]}, "4 bytes before tensor 'x' belong to no tensor"),
    ({"x": [0, 4]}, "4 bytes after the last tensor"),
])
def test_gaps_in_the_data_are_refused(tmp_path, layout, message):
    header = {name: {"dtype": "F32", "shape": [1], "data_offsets": offsets}
              for name, offsets in layout.items()}
    path = tmp_path / "gap.safetensors"
    path.write_bytes(_raw_file(header, bytes(8)))
    with pytest.raises(FormatError, match=message):
        read_kv_header(path)


def test_unaligned_tensors_are_refused(tmp_path):
    header = {"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
              "b": {"dtype": "F32", "shape": [1], "data_offsets": [1, 5]}}
    path = tmp_path / "unaligned.safetensors"
    path.write_bytes(_raw_file(header, bytes(5)))
    with pytest.raises(FormatError, match="'b' is not aligned"):
        read_kv_header(path)


@pytest.mark.parametrize("depth, reason", [(200, "nesting deeper than 64"),
                                           (5000, "nesting deeper than 64")])
def test_deeply_nested_metadata_is_refused(honest, tmp_path, depth, reason):
    tensors, meta = dict(honest["a"][0]), json.loads(json.dumps(honest["a"][1]))
    path = tmp_path / "deep.kv.safetensors"
    text = json.dumps(meta)[:-1] + ', "deep": ' + "[" * depth + "]" * depth + "}"
    save_file(tensors, str(path), metadata={"cubepack": text})
    with pytest.raises(FormatError, match=f"corrupt cubepack metadata.*{reason}"):
        read_kv_header(path)


def test_a_lock_number_that_overflows_is_refused_as_malformed(packed_cube_factory, tmp_path):
    import shutil

    cube = tmp_path / "cube"
    shutil.copytree(packed_cube_factory(), cube)
    lock = cube / "cubepack.lock"
    lock.write_text(lock.read_text().replace('"lock_version": 4', '"lock_version": 1e999'))
    assert main(["verify", str(cube)]) == 1
    with pytest.raises(cubepack.VerificationFailed, match="overflows to infinity"):
        cubepack.verify(cube)


@pytest.mark.parametrize("change, message", [
    (lambda m: m.update(version=2.0), r"version must be an integer, found 2\.0"),
    (lambda m: m.update(version=True), r"version must be an integer, found True"),
    (lambda m: m.update(token_count=float(m["token_count"])), r"token_count 10\.0 contradicts"),
    (lambda m: m.update(token_count=True), r"token_count True contradicts"),
    (lambda m: m.update(metadata={"n": 2**53}), r"/metadata/n \(9007199254740992\) lies outside"),
    (lambda m: m["producer"]["compute_config"].update(x=-2**60), r"/producer/compute_config/x"),
])
def test_header_numbers_are_integers_where_integers_are_meant_and_bounded(honest, tmp_path,
                                                                         change, message):
    """2.0 == 2 and True == 1 in Python: a version or count must be an int, not equal to one."""
    tensors, meta = dict(honest["a"][0]), json.loads(json.dumps(honest["a"][1]))
    change(meta)
    path = write(tmp_path, tensors, meta)
    with pytest.raises(FormatError, match=message):
        read_kv_header(path)
    assert main(["inspect", str(path)]) == 1


def test_a_5000_digit_number_is_refused_before_it_is_converted(honest, tmp_path):
    tensors, meta = dict(honest["a"][0]), json.loads(json.dumps(honest["a"][1]))
    text = json.dumps(meta)[:-1] + ', "huge": ' + "7" * 5000 + "}"
    path = tmp_path / "huge.kv.safetensors"
    save_file(tensors, str(path), metadata={"cubepack": text})
    with pytest.raises(FormatError, match="number literal 7+... has 5000 characters; at most 32"):
        read_kv_header(path)


def test_a_sliding_layer_holding_its_whole_window_is_refused(honest, tmp_path):
    """transformers keeps window - 1 positions; a file holding the whole window would load and
    then fail at the model's next step, so the reader refuses it."""
    tensors, meta = honest["hybrid"]
    tensors, meta = dict(tensors), json.loads(json.dumps(meta))
    sliding = next(i for i, layer in enumerate(meta["layers"])
                   if layer["type"] == "sliding_attention")
    window = meta["producer"]["geometry"]["sliding_window"]
    keys = tensors[f"layers.{sliding}.keys"]
    whole = torch.zeros(*keys.shape[:2], window, keys.shape[3], dtype=keys.dtype)
    tensors[f"layers.{sliding}.keys"], tensors[f"layers.{sliding}.values"] = whole, whole.clone()
    target = tmp_path / "whole-window.kv.safetensors"
    save_file(tensors, str(target), metadata={"cubepack": json.dumps(sealed(meta))})
    with pytest.raises(cubepack.FormatError, match=rf"layers\[{sliding}\]\.stored_positions"):
        cubepack.read_kv_header(target)
