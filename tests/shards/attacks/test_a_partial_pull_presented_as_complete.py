"""A partial pull presented as a complete cube: its marker removed (as a copy that leaves
bookkeeping behind would), the folder is refused, never verified as whole; with it, the
report and the CLI say "N of M" and exit 4, never 0."""

from __future__ import annotations

import json

import pytest

import cubepack
from cubepack.cli import main
from cubepack.errors import VerificationFailed
from cubepack.format import _partial as partialformat

from data import HUB_TOKEN


def _partial(hub, sharded, tmp_path, *include):
    cubepack.push(sharded, "me/cube", endpoint=hub.url, token=HUB_TOKEN,
                  allow_local_paths=True)
    target = tmp_path / "p"
    cubepack.pull("me/cube", endpoint=hub.url, token=HUB_TOKEN, local_dir=target,
                  include=include)
    return target


def test_without_its_marker_a_partial_cube_is_refused(hub, sharded, tmp_path, capsys):
    target = _partial(hub, sharded, tmp_path, "item-002")
    (target / partialformat.MARKER).unlink()
    with pytest.raises(VerificationFailed) as caught:
        cubepack.verify(target)
    failed = {(check.name, check.subject) for check in caught.value.failures}
    assert ("file set", "shards/activations-00000.kvshard") in failed
    # the sparse shard: proved through its index (each byte hashed once), the absent
    # memories' zeros fail their ranges' sha256; its file's own sha256 is never passed
    assert ("shards", "shards/activations-00001.index.json (shards/activations-00001.kvshard)"
            ) in failed
    assert not any(check.name == "sha256" and check.subject.endswith("00001.kvshard")
                   and check.ok for check in caught.value.report.checks)
    assert main(["verify", str(target)]) == 1


def test_every_memory_asked_is_still_not_a_whole_cube(hub, sharded, tmp_path, capsys):
    """--include '*' selects every memory: the folder holds every byte of the cube, each shard
    whole and hashed, yet it is what was asked, a partial pull: verify says 5 of 5 and exits 4,
    so a script never takes a pull with --include for a whole one."""
    target = _partial(hub, sharded, tmp_path, "*")
    for shard in sorted((sharded / "shards").iterdir()):
        assert (target / "shards" / shard.name).read_bytes() == shard.read_bytes()
    capsys.readouterr()
    assert main(["verify", str(target), "--json"]) == 4
    data = json.loads(capsys.readouterr().out)
    assert data["report"]["partial"]["checked"] == data["report"]["partial"]["memories"] == 5
