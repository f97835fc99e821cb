"""Attacks on plain cache bundles: headers whose producer name is a local path (which would be
fingerprinted instead of the Hub model they claim), and KV files outside ``activations/`` (which
would ship as sources under a pin nobody checked them against). Each refusal is one JSON object
and leaves the folder as it was."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import torch

import cubepack
from cubepack.cli import main
from cubepack.identity._fingerprint import fingerprint

from helpers import build_cache

IDS = [1, 17, 42, 7, 99]


def cli(capsys, *args):
    code = main([*map(str, args), "--json"])
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] == (code == 0)
    return code, data


def _bundle(folder, model, producer, name="activations/doc.kv.safetensors"):
    path = folder / name
    path.parent.mkdir(parents=True)
    cubepack.save_kv_cache(build_cache(model, torch.tensor([IDS])), path, producer=producer,
                           token_ids=IDS)
    (folder / "doc.txt").write_text("the handbook\n", encoding="utf-8")
    return folder


def _listing(folder):
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*"))


@pytest.mark.parametrize("where", ["absolute", "relative"])
def test_a_header_naming_a_local_path_does_not_pick_the_pin(zoo, models, tmp_path, capsys,
                                                            monkeypatch, where):
    # B's caches, whose headers name a Hub-style producer at a commit: "org/name" resolves
    # to a folder of B in the working directory, or the name is B's absolute path. Either way
    # pack would fingerprint that folder, not the Hub model in the HF cache.
    monkeypatch.chdir(tmp_path)
    if where == "relative":
        shutil.copytree(zoo["b"], tmp_path / "org" / "name")
        claimed = "org/name"
    else:
        claimed = str(zoo["b"])
    lie = dataclasses.replace(fingerprint(zoo["b"]), model_id=claimed, revision="1" * 40)
    folder = _bundle(tmp_path / "bundle", models["b"], lie)
    before = _listing(folder)
    code, data = cli(capsys, "pack", folder, "--cube-id", "me/docs")
    assert code == 2 and data["error"]["type"] == "UsageError"
    assert "local path" in data["error"]["message"] and "--model" in data["error"]["message"]
    assert _listing(folder) == before


@pytest.mark.parametrize("name", ["doc.kv.safetensors", "notes/doc.kv.safetensors"])
def test_a_kv_file_outside_activations_is_refused(zoo, models, tmp_path, capsys, name):
    # B's cache beside the sources of a bundle pinned to A: it would ship unchecked.
    folder = tmp_path / "bundle"
    _bundle(folder, models["a"], models["a"])
    _bundle(tmp_path / "other", models["b"], models["b"], name=name)
    (folder / name).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(tmp_path / "other" / name, folder / name)
    before = _listing(folder)
    code, data = cli(capsys, "pack", folder, "--cube-id", "me/docs", "--model", zoo["a"])
    assert code == 1 and data["error"]["type"] == "UnsafeInputError"
    assert name in data["error"]["message"] and "activations/" in data["error"]["message"]
    assert _listing(folder) == before
