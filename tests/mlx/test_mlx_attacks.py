"""Attacks on MLX-LM prompt caches: files cubepack's checks and MLX's own reader could read
differently, a header record that is not a string, values of another shape than the model's,
and a NaN that a tensor comparison does not see (real mlx and mlx_lm, the tiny models)."""

from __future__ import annotations

import json
import shutil
import struct
from re import search as re_search

import numpy
import pytest
import torch

import cubepack
import cubepack.mlx
from cubepack._util.safetensors_header import write_safetensors
from cubepack.cli import main
from cubepack.mlx._layout import flat_metadata

from helpers import build_cache

IDS = [1, 17, 42, 7, 99, 5, 300, 12]


def _prompt_cache(path, layers):
    """A prompt cache in mlx_lm's layout (KVCache layers, every position in use), no producer."""
    tensors = []
    for index, (keys, values) in enumerate(layers):
        tensors += [(f"{index}.0", "F32", keys.shape, keys.tobytes()),
                    (f"{index}.1", "F32", values.shape, values.tobytes()),
                    (f"{index}.2", "I32", (), struct.pack("<i", keys.shape[2]))]
    write_safetensors(path, tensors, flat_metadata({"model": "tiny"}, len(layers)))
    return path


def _change_on_the_first_copy(monkeypatch, source, change):
    """While the writer copies its first piece of ``source``, the rest of the file changes in
    place (same inode, as mlx_lm's save): ``truncated`` to half, or 64 bytes zeroed mid-file.
    Returns a list that holds True once the change was made."""
    import cubepack._util.safetensors_header as writer

    real_copy, changed = writer._copy_range, []

    def copy_while_the_source_changes(*args):
        if not changed:
            changed.append(True)
            size = source.stat().st_size
            with open(source, "r+b") as handle:
                if change == "truncated":
                    handle.truncate(size // 2)
                else:
                    handle.seek(size // 2)
                    handle.write(bytes(64))
        return real_copy(*args)

    monkeypatch.setattr(writer, "_copy_range", copy_while_the_source_changes)
    return changed


def _mlx_layers(mlx_model):
    return [(numpy.array(c.keys[..., :len(IDS), :]), numpy.array(c.values[..., :len(IDS), :]))
            for c in cubepack.mlx.prefill(mlx_model, IDS)]


@pytest.mark.parametrize("name", ["doc.cache", "doc", "doc.npz"])
def test_a_checked_cache_is_read_as_the_safetensors_it_was_checked_as(mlx_models, tmp_path, name):
    # MLX picks its parser from the file's suffix: a checked file must not be re-read as npz,
    # gguf, or fail untyped because it has no suffix.
    model = mlx_models["a"]
    saved = cubepack.mlx.save_prompt_cache(tmp_path / "doc.safetensors",
                                           cubepack.mlx.prefill(model, IDS), model, token_ids=IDS)
    renamed = shutil.copy(saved, tmp_path / name)
    caches = cubepack.mlx.load_prompt_cache(renamed, model)
    assert [c.offset for c in caches] == [len(IDS)] * 2


@pytest.mark.parametrize("runtime", [5, ["mlx-lm"], ""])
def test_a_runtime_record_that_is_not_a_name_asks_for_recomputation(mlx_models, tmp_path,
                                                                    runtime):
    # A claim of no runtime (not a string) is read as every other reader reads it
    # (transformers'), so MLX recomputes it; never an AttributeError.
    model = mlx_models["a"]
    path = cubepack.mlx.save_prompt_cache(tmp_path / "r.safetensors",
                                          cubepack.mlx.prefill(model, IDS), model,
                                          token_ids=IDS, metadata={"runtime": runtime})
    caches = cubepack.mlx.load_prompt_cache(path, model)  # MLX reproduces its own cache
    assert [c.offset for c in caches] == [len(IDS)] * 2


def test_values_of_another_head_dim_are_refused(zoo, mlx_models, tmp_path):
    layers = [(k, numpy.concatenate([v, v], axis=-1)) for k, v in _mlx_layers(mlx_models["a"])]
    path = _prompt_cache(tmp_path / "wide.safetensors", layers)
    with pytest.raises(cubepack.IdentityMismatch, match="head_dim"):
        cubepack.mlx.import_prompt_cache(path, zoo["a"])
    assert not (tmp_path / "wide.kv.safetensors").exists()


def test_a_nan_in_a_cache_is_a_tensor_difference(models, mlx_models, tmp_path):
    # transformers' cache with one NaN, loaded into MLX: the recomputation must name the
    # tensors, not report them reproduced (NaN compares false with any bound).
    cache = build_cache(models["a"], torch.tensor([IDS]))
    cache.layers[1].keys[0, 0, 3, 0] = float("nan")
    path = cubepack.save_kv_cache(cache, tmp_path / "nan.kv.safetensors", producer=models["a"],
                                  token_ids=IDS)
    with pytest.raises(cubepack.RecomputationFailed, match=r"layer 1, position 3 \(keys\)"):
        cubepack.mlx.load_prompt_cache(path, mlx_models["a"])


def test_token_ids_that_are_not_integers_are_refused(zoo, mlx_models, tmp_path):
    path = _prompt_cache(tmp_path / "p.safetensors", _mlx_layers(mlx_models["a"]))
    for ids in ([1.7] * len(IDS), [True] * len(IDS)):
        with pytest.raises(cubepack.UsageError, match="integers"):
            cubepack.mlx.import_prompt_cache(path, zoo["a"], token_ids=ids)
    assert not (tmp_path / "p.kv.safetensors").exists()


@pytest.mark.parametrize("ids, says", [
    ("[1000000, 1, 2, 3, 4, 5, 6, 7]", r"Token id 1000000 lies outside the model's vocabulary"),
    ("[-1, 1, 2, 3, 4, 5, 6, 7]", r"Token id -1 lies outside"),
    ("[" + "9" * 5000 + ", 1, 2, 3, 4, 5, 6, 7]",
     r"--token-ids must be a JSON list of integers: the number literal"),
])
def test_token_ids_a_model_cannot_have_are_a_usage_error_about_them(
        zoo, mlx_models, tmp_path, capsys, ids, says):
    """--token-ids outside the vocabulary (or too long to be a number) name --token-ids and
    the vocabulary, not the temp file a write would have used, nor Python's int limit."""
    path = _prompt_cache(tmp_path / "p.safetensors", _mlx_layers(mlx_models["a"]))
    code = main(["import", "mlx", str(path), "--model", str(zoo["a"]), "--token-ids", ids,
                 "--json"])
    error = json.loads(capsys.readouterr().out)["error"]
    assert code != 0 and error["type"] == "UsageError"
    assert re_search(says, error["message"]) and ".tmp" not in error["message"]
    assert "set_int_max_str_digits" not in error["message"]
    assert not (tmp_path / "p.kv.safetensors").exists()


def test_a_kv_file_given_to_import_says_what_to_do_with_it(zoo, mlx_models, tmp_path, capsys):
    path = _prompt_cache(tmp_path / "p.safetensors", _mlx_layers(mlx_models["a"]))
    kv = cubepack.mlx.import_prompt_cache(path, zoo["a"], token_ids=IDS)
    code = main(["import", "mlx", str(kv), "--model", str(zoo["a"]), "--json"])
    error = json.loads(capsys.readouterr().out)["error"]
    assert code != 0 and error["type"] == "FormatError"
    assert "is a cubepack KV file" in error["message"]
    out = tmp_path / "again.safetensors"
    assert main(["export", "mlx", str(kv), "--out", str(out)]) == 0  # the fix it names works


@pytest.mark.parametrize("runtime", [None, "mlx-lm 0.32.2"])
def test_a_sliding_window_cache_is_refused_not_misplaced(zoo, models, tmp_path, runtime):
    # A hybrid model's cache (its sliding layer keeps its last positions only), labelled as
    # MLX's or not: a KVCache built from it would put those positions at the start.
    path = cubepack.save_kv_cache(build_cache(models["hybrid"], torch.tensor([IDS])),
                                  tmp_path / "h.kv.safetensors", producer=models["hybrid"],
                                  token_ids=IDS, metadata={"runtime": runtime} if runtime else None)
    with pytest.raises(cubepack.UnsupportedError, match="layer 0 is a sliding-window layer"):
        cubepack.mlx.load_prompt_cache(path, zoo["hybrid"])


def test_folder_cannot_rename_a_model_that_knows_its_folder(zoo, mlx_models, tmp_path):
    # B loaded by cubepack.mlx.load knows its folder: folder=A must not make it A.
    model = mlx_models["a"]
    path = cubepack.mlx.save_prompt_cache(tmp_path / "a.safetensors",
                                          cubepack.mlx.prefill(model, IDS), model, token_ids=IDS)
    with pytest.raises(cubepack.UsageError, match="was loaded from"):
        cubepack.mlx.load_prompt_cache(path, mlx_models["b"], folder=zoo["a"])
    assert len(cubepack.mlx.load_prompt_cache(path, model, folder=zoo["a"])) == 2


def test_a_prompt_cache_where_a_kv_file_belongs_names_the_import(zoo, mlx_models, tmp_path,
                                                                 capsys):
    # A plain bundle holding a prompt cache under a KV file's name: pack says how to convert it.
    model = mlx_models["a"]
    folder = tmp_path / "bundle"
    (folder / "activations").mkdir(parents=True)
    cubepack.mlx.save_prompt_cache(folder / "activations" / "doc.kv.safetensors",
                                   cubepack.mlx.prefill(model, IDS), model, token_ids=IDS)
    code = main(["pack", str(folder), "--cube-id", "me/docs", "--model", str(zoo["a"]), "--json"])
    error = json.loads(capsys.readouterr().out)["error"]
    assert code == 1 and error["type"] == "FormatError"
    assert "cubepack import mlx" in error["message"]
    assert not (folder / "cubepack.lock").exists()


@pytest.mark.parametrize("change", ["overwritten in place", "truncated"])
@pytest.mark.parametrize("prove", [False, True])
def test_a_source_changed_while_an_import_copies_it_is_refused_and_nothing_written(
        mlx_models, zoo, tmp_path, monkeypatch, change, prove):
    """mlx_lm rewrites a prompt cache in place: an import copies the tensors from the file as
    it writes them (no snapshot in memory), so a source changed while it is copied must be a
    FormatError with no KV file placed (not the new bytes under the old header, nor a crash
    once it is truncated), with or without the proof."""
    import os

    from mlx_lm.models.cache import save_prompt_cache

    source = tmp_path / "native.safetensors"
    save_prompt_cache(str(source), cubepack.mlx.prefill(mlx_models["a"], IDS))  # unaligned
    os.utime(source, ns=(10**18, 10**18))  # written long ago, as a cache being converted is
    kwargs = {"token_ids": IDS, "recompute": True} if prove else {"token_ids": IDS}
    changed = _change_on_the_first_copy(monkeypatch, source, change)
    out = tmp_path / "out.kv.safetensors"
    with pytest.raises(cubepack.FormatError, match="changed while cubepack read it"):
        cubepack.mlx.import_prompt_cache(source, zoo["a"], out=out, **kwargs)
    assert changed and not out.exists() and list(tmp_path.glob(".out*")) == []


def test_an_import_places_exactly_the_bytes_it_proved(mlx_models, zoo, tmp_path, monkeypatch):
    """The proof runs on the KV file as written, before it takes its name: what a later load
    maps is what was recomputed (the source may change after the copy; it no longer matters)."""
    from mlx_lm.models.cache import save_prompt_cache

    import cubepack.mlx._convert as convert
    from cubepack.kv import read_kv_header
    from cubepack.kv._torch import mapped_layers

    source = tmp_path / "native.safetensors"
    save_prompt_cache(str(source), cubepack.mlx.prefill(mlx_models["a"], IDS))
    proved = {}
    real_mapped = convert.mapped_layers

    def remember(info):
        layers = real_mapped(info)
        proved["path"] = info.path
        proved["bytes"] = [bytes(t.contiguous().view(torch.uint8).numpy()) for _, _, k, v in layers
                           for t in (k, v)]
        return layers

    monkeypatch.setattr(convert, "mapped_layers", remember)
    out = cubepack.mlx.import_prompt_cache(source, zoo["a"], out=tmp_path / "out.kv.safetensors",
                                           token_ids=IDS, recompute=True)
    assert proved["path"] != out and not proved["path"].exists()  # the temp file, now renamed
    placed = [bytes(t.contiguous().view(torch.uint8).numpy()) for _, _, k, v in
              mapped_layers(read_kv_header(out)) for t in (k, v)]
    assert placed == proved["bytes"]


@pytest.mark.parametrize("change", ["truncated", "offset rewritten"])
def test_a_prompt_cache_changed_after_its_header_was_checked_is_refused_and_nothing_written(
        mlx_models, zoo, tmp_path, monkeypatch, change):
    """The header and offsets a conversion checked must be the ones in the bytes it converts:
    a file truncated, or given another offset in place, between the two reads is a FormatError
    naming what differed, and no KV file appears."""
    from mlx_lm.models.cache import save_prompt_cache

    import cubepack.mlx._convert as convert

    source = tmp_path / "native.safetensors"
    save_prompt_cache(str(source), cubepack.mlx.prefill(mlx_models["a"], IDS))
    real_read = convert.read_prompt_cache

    def read_then_change(path):
        info = real_read(path)
        with open(source, "r+b") as handle:
            if change == "truncated":
                handle.truncate(info.header.file_size - 4)
            else:
                scalar = info.header.tensors["0.2"]
                handle.seek(info.header.data_offset + scalar.begin)
                handle.write(struct.pack("<i", len(IDS) - 1))
        return info

    monkeypatch.setattr(convert, "read_prompt_cache", read_then_change)
    out = tmp_path / "out.kv.safetensors"
    with pytest.raises(cubepack.FormatError, match="changed while cubepack read it") as caught:
        cubepack.mlx.import_prompt_cache(source, zoo["a"], out=out, token_ids=IDS)
    says = "read" if change == "truncated" else f"offset: expected {len(IDS)}, found {len(IDS) - 1}"
    assert says in str(caught.value)
    assert not out.exists() and list(tmp_path.glob(".out*")) == []


@pytest.mark.parametrize("change", ["data rewritten in place", "mlx_lm saves over it"])
@pytest.mark.parametrize("kind", ["prompt cache", "KV file"])
def test_a_file_changed_between_its_check_and_mlx_reading_it_is_refused(
        mlx_models, zoo, tmp_path, monkeypatch, change, kind):
    """MLX reads a file's tensors when they are evaluated, not at ``mx.load``: a checked load
    must not hand out arrays whose bytes come from a file written after the check (mlx_lm
    rewrites a prompt cache in place). It evaluates them itself and refuses a written file."""
    import os

    import mlx.core as mx
    from mlx_lm.models.cache import save_prompt_cache as mlx_save

    model = mlx_models["a"]
    caches = cubepack.mlx.prefill(model, IDS)
    if kind == "prompt cache":
        path = cubepack.mlx.save_prompt_cache(tmp_path / "doc.safetensors", caches, model,
                                              token_ids=IDS)
    else:
        native = tmp_path / "native.safetensors"
        mlx_save(str(native), caches)
        path = cubepack.mlx.import_prompt_cache(native, zoo["a"], token_ids=IDS,
                                                out=tmp_path / "doc.kv.safetensors")
    os.utime(path, ns=(10**18, 10**18))  # written long ago, as a cache in use is
    real_load = mx.load

    def load_then_change(name, *args, **kwargs):
        arrays = real_load(name, *args, **kwargs)  # lazy: nothing read yet
        size = path.stat().st_size
        if change == "data rewritten in place":
            with open(path, "r+b") as handle:  # same inode, same size, same header
                handle.seek(size // 2)  # inside the tensor data
                handle.write(bytes(64))
        else:
            mlx_save(str(path), cubepack.mlx.prefill(model, IDS[::-1]))
        return arrays

    monkeypatch.setattr(mx, "load", load_then_change)
    with pytest.raises(cubepack.FormatError, match="changed while cubepack loaded it"):
        cubepack.mlx.load_prompt_cache(path, model)


@pytest.mark.parametrize("change", ["overwritten in place", "truncated"])
def test_a_kv_file_changed_while_an_export_copies_it_is_refused_and_nothing_written(
        mlx_models, zoo, tmp_path, monkeypatch, change):
    """An export copies the KV file's tensors as it writes them: a KV file rewritten or truncated
    meanwhile is a FormatError, and no prompt cache appears (none with bytes nobody checked)."""
    import os

    from mlx_lm.models.cache import save_prompt_cache

    native = tmp_path / "native.safetensors"
    save_prompt_cache(str(native), cubepack.mlx.prefill(mlx_models["a"], IDS))
    source = cubepack.mlx.import_prompt_cache(native, zoo["a"], token_ids=IDS,
                                              out=tmp_path / "doc.kv.safetensors")
    os.utime(source, ns=(10**18, 10**18))
    changed = _change_on_the_first_copy(monkeypatch, source, change)
    out = tmp_path / "out.safetensors"
    with pytest.raises(cubepack.FormatError, match="changed while cubepack read it"):
        cubepack.mlx.export_prompt_cache(source, out)
    assert changed and not out.exists() and list(tmp_path.glob(".out*")) == []


def test_a_symlink_swapped_between_the_check_and_mlx_reading_loads_the_file_checked(
        mlx_models, tmp_path, monkeypatch):
    """MLX reads the file the check opened, not the path again: a symlink pointed at another
    cache (another producer's, say) just before ``mx.load`` and back just after gives the
    checked file's tensors, never the other's."""
    import os

    import mlx.core as mx

    model = mlx_models["a"]
    checked = cubepack.mlx.save_prompt_cache(tmp_path / "checked.safetensors",
                                             cubepack.mlx.prefill(model, IDS), model,
                                             token_ids=IDS)
    other = cubepack.mlx.save_prompt_cache(tmp_path / "other.safetensors",
                                           cubepack.mlx.prefill(model, IDS[::-1]), model,
                                           token_ids=IDS[::-1])
    link = tmp_path / "cache.safetensors"
    link.symlink_to(checked)
    expected = [numpy.array(c.keys) for c in cubepack.mlx.load_prompt_cache(checked, model)]
    real_load, swapped = mx.load, []

    def load_with_the_link_swapped(name, *args, **kwargs):
        link.unlink()
        link.symlink_to(other)
        try:
            return real_load(name, *args, **kwargs)
        finally:
            link.unlink()
            link.symlink_to(checked)
            swapped.append(os.readlink(link))

    monkeypatch.setattr(mx, "load", load_with_the_link_swapped)
    loaded = cubepack.mlx.load_prompt_cache(link, model)
    assert swapped and all(numpy.array_equal(numpy.array(c.keys), keys)
                           for c, keys in zip(loaded, expected, strict=True))


def test_a_symlink_flipped_while_the_header_is_checked_cannot_pass_another_producer(
        zoo, mlx_models, tmp_path, monkeypatch):
    """The producer check reads the header by path, MLX reads the file opened first: a
    symlink pointing at another model's KV file only while the check reads it must not pass
    that file's producer off for the opened file's tensors (nor give a cache whose offset
    exceeds the positions it holds)."""
    from mlx_lm.models.cache import save_prompt_cache as mlx_save

    import cubepack.mlx._runtime as runtime

    def kv_file(model_name, name, ids):
        native = tmp_path / f"{name}.native.safetensors"
        mlx_save(str(native), cubepack.mlx.prefill(mlx_models[model_name], ids))
        return cubepack.mlx.import_prompt_cache(native, zoo[model_name], token_ids=ids,
                                                out=tmp_path / f"{name}.kv.safetensors")

    foreign = kv_file("b", "foreign", IDS)  # another model: refused when loaded as it is
    honest_short = kv_file("a", "short", IDS[:2])
    for opened in (foreign, honest_short):
        link = tmp_path / f"current-{opened.stem}"
        link.symlink_to(opened)
        real_read = runtime.read_kv_header

        def read_while_the_link_points_elsewhere(path, link=link, opened=opened,
                                                 real_read=real_read):
            link.unlink()
            link.symlink_to(kv_file("a", "checked", IDS))  # model a's, 8 positions
            try:
                return real_read(path)
            finally:
                link.unlink()
                link.symlink_to(opened)

        monkeypatch.setattr(runtime, "read_kv_header", read_while_the_link_points_elsewhere)
        with pytest.raises(cubepack.FormatError, match="changed while cubepack loaded it"):
            cubepack.mlx.load_prompt_cache(link, mlx_models["a"])
        monkeypatch.undo()


def test_what_leaves_the_bytes_as_they_were_does_not_refuse_a_load(mlx_models, tmp_path,
                                                                   monkeypatch):
    """A chmod, a new hard link, or the path replaced by a new version (the usual deploy)
    while a load runs change no byte of the file loaded: the load succeeds, with its bytes."""
    import os

    import mlx.core as mx

    model = mlx_models["a"]
    path = cubepack.mlx.save_prompt_cache(tmp_path / "v1.safetensors",
                                          cubepack.mlx.prefill(model, IDS), model, token_ids=IDS)
    expected = [numpy.array(c.keys) for c in cubepack.mlx.load_prompt_cache(path, model)]
    newer = cubepack.mlx.save_prompt_cache(tmp_path / "v2.safetensors",
                                           cubepack.mlx.prefill(model, IDS[::-1]), model,
                                           token_ids=IDS[::-1])
    real_load = mx.load

    def load_while_the_path_is_managed(name, *args, **kwargs):
        arrays = real_load(name, *args, **kwargs)
        os.chmod(path, 0o444)
        os.link(path, tmp_path / "backup.safetensors")
        staged = tmp_path / "staged"
        staged.write_bytes(newer.read_bytes())
        os.replace(staged, path)
        return arrays

    monkeypatch.setattr(mx, "load", load_while_the_path_is_managed)
    loaded = cubepack.mlx.load_prompt_cache(path, model)
    assert all(numpy.array_equal(numpy.array(c.keys), keys)
               for c, keys in zip(loaded, expected, strict=True))


def test_a_fifo_is_refused_at_once_not_waited_on(zoo, mlx_models, tmp_path):
    import os

    fifo = tmp_path / "cache.safetensors"
    os.mkfifo(fifo)
    with pytest.raises(cubepack.FormatError, match="is not a regular file"):
        cubepack.mlx.load_prompt_cache(fifo, mlx_models["a"])
    with pytest.raises(cubepack.FormatError, match="is not a regular file"):
        cubepack.mlx.import_prompt_cache(fifo, zoo["a"], token_ids=IDS)


def test_the_suggested_commands_quote_paths(zoo, mlx_models, tmp_path, capsys):
    """The advice a refusal prints runs as printed, spaces in the path and all."""
    import shlex
    import subprocess
    import sys

    folder = tmp_path / "with space"
    folder.mkdir()
    path = _prompt_cache(folder / "p q.safetensors", _mlx_layers(mlx_models["a"]))
    kv = cubepack.mlx.import_prompt_cache(path, zoo["a"], token_ids=IDS)
    assert main(["import", "mlx", str(kv), "--model", str(zoo["a"]), "--json"]) == 1
    message = json.loads(capsys.readouterr().out)["error"]["message"]
    command = message.split("it: ", 1)[1].rstrip(".").replace("FILE", str(tmp_path / "out.st"))
    assert shlex.split(command)[:3] == ["cubepack", "export", "mlx"]
    done = subprocess.run([sys.executable, "-m", "cubepack", *shlex.split(command)[1:]],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out.st").exists()
