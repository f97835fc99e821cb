"""A pull's deadline (``--timeout``) covers its checks too, inside one adapter: the adversary's
cube (an adapter of thousands of one-element LoRA modules and a hundred long ``rank_pattern``
keys, re-sealed) made each adapter's matching modules x keys work that ran past the deadline,
which was checked only between adapters. The budget is now checked at each module, and shape
checks are cached by pattern. Synchronised on an event, not time: the deadline is expired from
outside once the matching has begun."""

from __future__ import annotations

import pytest
from slow_adapter import slow_adapter_cube

import cubepack
from cubepack.hub import _deadline
from cubepack.kinds.adapters import _lora as _adapters
from cubepack.testing.hub import InstrumentedHub, upload_folder


def test_a_pull_ends_at_its_deadline_inside_one_adapters_checks(zoo, tmp_path, monkeypatch):
    cube = slow_adapter_cube(zoo["a"], tmp_path / "cube", modules=400, keys=20)
    deadlines = []
    real_init, real_rank = _deadline.Deadline.__init__, _adapters._pattern_rank

    def recording(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        deadlines.append(self)

    def matching_then_expired(*args, **kwargs):
        if deadlines and not deadlines[-1].expired:
            deadlines[-1].expire()  # time runs out while this adapter is being matched
        return real_rank(*args, **kwargs)

    monkeypatch.setattr(_deadline.Deadline, "__init__", recording)
    monkeypatch.setattr(_adapters, "_pattern_rank", matching_then_expired)
    with InstrumentedHub(tmp_path / "hub-root") as hub:
        sha = upload_folder(hub.url, "mallory/slow", cube, repo_type="dataset")
        with pytest.raises(cubepack.HubError, match="its checks were still running") as caught:
            cubepack.pull(f"mallory/slow@{sha}", local_dir=tmp_path / "out", endpoint=hub.url,
                          cache_dir=tmp_path / "hf", timeout=600)
    assert "rank_pattern of module" in str(caught.value)
    assert not (tmp_path / "out").exists()
