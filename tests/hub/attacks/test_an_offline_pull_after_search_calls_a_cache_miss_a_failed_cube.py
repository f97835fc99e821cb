"""Adversary (issue #40, items 4 and 5): search, then an offline pull of the commit it listed.

The promise (docs/how-to/hub.md): offline, a pull is served from `--local-dir` (an earlier
pull of that commit) or the HF cache; when neither holds the commit, the pull says so and
what fixes it ("pull it online into DIR once ... or put it in the HF cache with `hf download
...`", a HubError). A verification failure ("Do not load it") means the bytes are not the
lock's.

The attack, a composition a new user makes: `cubepack search --model M` lists a cube; on the
train, `HF_HUB_OFFLINE=1 cubepack pull REPO@<the commit listed>`. Search read that commit's
lock through the HF cache, so the cache holds the lock and nothing else of it (as after
`verify --remote`, or `hf download REPO cubepack.lock`).

What happened: the pull took the lone lock for the commit and failed verification, exit 1:
"failed verification (5 problems): file set README.md: missing from the cube ... Do not load
it; pull or pack it again": a cube reported as broken that was only not downloaded, and none
of the advice that works offline.

The fix: offline, the files the lock lists that neither the folder nor the HF cache holds are
a cache miss (HubError, exit 3) naming them and the same two fixes; verification judges only
a commit that is on disk whole.
"""

from __future__ import annotations

import pytest

from cubepack import HubError
from cubepack.cli import main
from cubepack.hub import pull, push, search

from helpers import point_hub_client_at

TOKEN = "writer-token"


@pytest.fixture
def hub(tmp_path, monkeypatch):
    from cubepack.testing.hub import InstrumentedHub

    with InstrumentedHub(tmp_path / "hub-root", tokens=[TOKEN]) as server:
        point_hub_client_at(monkeypatch, server.url, tmp_path / "hf-cache")
        yield server


def test_an_offline_pull_of_a_commit_search_read_is_a_cache_miss(hub, packed_cube_factory, zoo,
                                                                  tmp_path, capsys):
    push(packed_cube_factory(), "ns/cube", endpoint=hub.url, token=TOKEN,
         allow_local_paths=True)
    [found] = search(str(zoo["a"]), repo_type="dataset").matches
    spec = f"{found.repo_id}@{found.revision}"
    with pytest.raises(HubError, match="Offline") as raised:
        pull(spec, local_dir=tmp_path / "off", offline=True, progress=False)
    message = str(raised.value)
    assert "README.md" in message and "hf download ns/cube" in message
    assert not (tmp_path / "off").exists()
    assert main(["pull", spec, "--local-dir", str(tmp_path / "off"), "--offline"]) == 3
    assert "Do not load it" not in capsys.readouterr().err
    # The first fix it names works: online once, then offline from that folder.
    assert pull(spec, local_dir=tmp_path / "off", progress=False, model=str(zoo["a"])).report.ok
    assert pull(spec, local_dir=tmp_path / "off", offline=True, progress=False,
                model=str(zoo["a"])).report.ok
