"""The MLX suite (``make test`` runs it in the mlx environment only, ``--only mlx=tests/mlx``).
Elsewhere MLX is not installed and these files are not collected."""

from __future__ import annotations

import importlib.util

import pytest

HAS_MLX = all(importlib.util.find_spec(name) is not None for name in ("mlx", "mlx_lm"))
collect_ignore_glob = [] if HAS_MLX else ["test_*.py", "attacks/test_*.py"]


@pytest.fixture(scope="session")
def mlx_models(zoo):
    """MLX models loaded from the zoo's folders by ``cubepack.mlx.load`` (read only)."""
    import cubepack.mlx

    return {name: cubepack.mlx.load(zoo[name])[0] for name in ("a", "b", "deep")}
