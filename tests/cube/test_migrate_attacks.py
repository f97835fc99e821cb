"""Attacks on ``cubepack migrate`` (written against the README's promises, not its tests)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import cubepack
from cubepack.cli import main
from cubepack.errors import FormatError

from helpers import copy_of, tree_bytes


@pytest.fixture
def cube(packed_cube_factory, tmp_path):
    return copy_of(packed_cube_factory(), tmp_path)


def _json_outcome(capsys, argv):
    code = main(argv + ["--json"])
    out = json.loads(capsys.readouterr().out)
    return code, out


@pytest.mark.parametrize("where", ["same", "inside", "via_symlinked_parent", "symlink",
                                   "file", "non_empty"])
def test_bad_out_is_a_usage_error_and_changes_nothing(cube, tmp_path, zoo, capsys, where):
    before = tree_bytes(cube)
    if where == "same":
        out = cube
    elif where == "inside":
        out = cube / "sub" / "new"
    elif where == "via_symlinked_parent":
        (tmp_path / "alias").symlink_to(cube)
        out = tmp_path / "alias" / "new"
    elif where == "symlink":
        (tmp_path / "empty").mkdir()
        out = tmp_path / "link"
        out.symlink_to(tmp_path / "empty")
    elif where == "file":
        out = tmp_path / "f"
        out.write_text("x")
    else:
        out = tmp_path / "full"
        out.mkdir()
        (out / "keep").write_text("x")
    listing = sorted(p.name for p in tmp_path.iterdir())
    code, data = _json_outcome(capsys, ["migrate", str(cube), "--model", str(zoo["b"]),
                                        "--out", str(out)])
    assert code == 2 and data["ok"] is False and data["error"]["type"] == "UsageError"
    assert tree_bytes(cube) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == listing


def test_interrupted_migration_leaves_no_staging_and_no_new_parent_folders(
        cube, tmp_path, zoo, monkeypatch):
    from cubepack.kinds.activations import _migrate

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(_migrate, "reprefill", interrupted)
    before = tree_bytes(cube)
    listing = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(KeyboardInterrupt):
        cubepack.migrate(cube, model=zoo["b"], out=tmp_path / "new" / "deeper" / "cube-b")
    assert tree_bytes(cube) == before
    # "a refusal leaves everything unchanged": not even the folders --out would have sat in
    assert sorted(p.name for p in tmp_path.iterdir()) == listing


def test_editing_the_new_cube_in_place_does_not_change_the_old_one(cube, tmp_path, zoo):
    """MemOS dumps a memory with open(path, "w"), editors write hard-linked files in place:
    the migrated cube must not share a file (an inode) with the cube it came from."""
    (cube / "notes.txt").write_text("old notes\n")
    cubepack.pack(cube)
    before = tree_bytes(cube)
    new = tmp_path / "cube-b"
    cubepack.migrate(cube, model=zoo["b"], out=new)
    for path in new.rglob("*"):
        if path.is_file():
            with open(path, "r+b") as handle:  # in place, as MemOS's dump and editors do
                handle.write(b"#")
    assert tree_bytes(cube) == before
    cubepack.verify(cube)


def _general_text(path: Path, count: int) -> None:
    path.write_text(json.dumps([{"id": f"m{i}", "vector": [1.0, float(i)],
                                 "payload": {"memory": f"memory {i}"}} for i in range(count)]))


def test_reembed_refuses_batches_that_do_not_answer_their_own_texts(tmp_path, monkeypatch):
    """An embedder answering one batch with one vector too many and the next with one too few
    gives as many vectors as texts, every one beside the wrong memory."""
    from cubepack.kinds.vectors._embedder import BATCH
    from cubepack.kinds.vectors import _migrate

    old, staging = tmp_path / "old", tmp_path / "staging"
    old.mkdir(), staging.mkdir()
    _general_text(old / "textual_memory.json", BATCH + 10)
    calls = []

    def skewed(spec, texts):
        calls.append(len(texts))
        extra = 1 if len(calls) == 1 else -1
        return [[1.0, 0.5]] * (len(texts) + extra)

    monkeypatch.setattr(_migrate, "embed", skewed)
    with pytest.raises(FormatError, match="vectors"):
        _migrate._reembed(old, staging, "textual_memory.json", "openai:http://x/v1#e", False)
    assert not (staging / "textual_memory.json").exists()


@pytest.mark.parametrize("answer", [
    [[1.0, 0.0], [1.0, 0.0, 0.0]],        # ragged: two dimensions in one store
    [[1.0, 0.0], [True, False]],           # booleans are not numbers
    [[1.0, 0.0], ["1.0", "0.0"]],          # nor are strings
    [[1.0, 0.0], [[1.0], [0.0]]],          # nor lists
    [[1.0, 0.0], 7],                       # a vector that is not a list
])
def test_reembed_refuses_malformed_vectors_with_a_format_error(tmp_path, monkeypatch, answer):
    from cubepack.kinds.vectors import _migrate

    old, staging = tmp_path / "old", tmp_path / "staging"
    old.mkdir(), staging.mkdir()
    _general_text(old / "textual_memory.json", 2)
    monkeypatch.setattr(_migrate, "embed", lambda spec, texts: answer)
    with pytest.raises(FormatError):
        _migrate._reembed(old, staging, "textual_memory.json", "openai:http://x/v1#e", False)
    assert not (staging / "textual_memory.json").exists()


def test_ids_longer_than_the_new_models_context_are_refused_before_prefill(
        packed_cube_factory, tmp_path, zoo, capsys):
    """A source_text or id list is a claim of any length; the new model attends over at most
    max_position_embeddings positions (512 for the tiny models): refuse, do not prefill."""
    cube = copy_of(packed_cube_factory({"long": [5, 6, 7]}, texts={"long": "the cat " * 600}),
                   tmp_path)
    before = tree_bytes(cube)
    code, data = _json_outcome(capsys, ["migrate", str(cube), "--model", str(zoo["b"]),
                                        "--out", str(tmp_path / "cube-b")])
    assert code == 1 and data["error"]["type"] == "RecomputationFailed", data
    assert "max_position_embeddings 512" in data["error"]["message"]
    assert tree_bytes(cube) == before and not (tmp_path / "cube-b").exists()
