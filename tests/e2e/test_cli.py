"""The command line: JSON output, one-line errors, exit codes, and a torch-free --help."""

from __future__ import annotations

import json

import torch

import cubepack
from cubepack.cli import main

from helpers import build_cache, run_torch_free


def run(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_help_does_not_import_torch():
    done = run_torch_free("from cubepack.cli import main\n"
                          "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n")
    assert "fingerprint" in done.stdout and "inspect" in done.stdout


def test_fingerprint_json(zoo, capsys):
    code, out, _ = run(capsys, "fingerprint", str(zoo["a"]), "--json")
    assert code == 0
    data = json.loads(out)
    assert data["weights_digest"] == cubepack.fingerprint(zoo["a"]).weights_digest
    assert data["geometry"]["num_layers"] == 2


def test_fingerprint_of_a_folder_does_not_import_torch(zoo):
    run_torch_free(f"from cubepack.cli import main\n"
                   f"assert main(['fingerprint', {str(zoo['a'])!r}]) == 0\n")


def test_inspect_shows_producer_and_shapes(models, tmp_path, capsys):
    cache = build_cache(models["a"], torch.tensor([[5, 6, 7, 8]]))
    path = cubepack.save_kv_cache(cache, tmp_path / "x.kv.safetensors", producer=models["a"])
    code, out, _ = run(capsys, "inspect", str(path), "--json")
    data = json.loads(out)
    assert code == 0 and data["token_count"] == 4 and data["version"] == 3
    assert data["layers"][0]["shape"] == [1, 2, 4, 16]
    code, out, _ = run(capsys, "inspect", str(path))
    assert "cubepack.kv v3" in out and "tokens:      4" in out


def test_errors_are_one_line_with_exit_codes(tmp_path, capsys):
    bad = tmp_path / "bad.kv.safetensors"
    bad.write_bytes(b"\x00" * 3)
    code, out, err = run(capsys, "inspect", str(bad))
    assert code == 1 and err.count("\n") == 1 and err.startswith("error: ")
    code, _, err = run(capsys, "fingerprint", str(tmp_path / "nope"))
    assert code == 2 and "is neither a folder" in err and "Traceback" not in err
    code, _, _ = run(capsys, "inspect")
    assert code == 2
    code, _, _ = run(capsys, "no-such-command")
    assert code == 2


def test_debug_shows_the_traceback(tmp_path, capsys):
    code, _, err = run(capsys, "--debug", "fingerprint", str(tmp_path / "nope"))
    assert code == 2 and "Traceback" in err
