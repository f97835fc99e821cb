"""The one way cubepack loads a transformers model of its own (recompute, migrate, the embedder
check, the demo, ``cubepack.testing.tiny``).

Why one owner: transformers 5.25 turned ``use_kernels`` on by default, which swaps layers for
kernels fetched from the Hub (code downloaded at load time) and fails every load with
``ValueError: Kernels are not available`` where the ``kernels`` package is missing or too old.
A model cubepack loads to *prove* a cache must compute with the library's own layers, offline,
whatever that default: every load here asks for ``use_kernels=False`` (4.57 and 5.x accept it;
older releases pop it the same way), and a load that still fails for want of kernels is an
:class:`~cubepack.errors.UnsupportedError` naming the setting that avoids it.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Iterator

from ..errors import UnsupportedError

#: The environment setting that turns transformers' Hub kernels off for every load.
KERNELS_OFF = "USE_HUB_KERNELS=0"


def _needs_kernels(exc: BaseException) -> bool:
    text = str(exc)
    return "Kernels are not available" in text or "`kernels` is either not installed" in text


@contextlib.contextmanager
def kernel_errors(what: str) -> Iterator[None]:
    """Turn transformers' "Kernels are not available" into a typed error naming the fix, for a
    load cubepack does not make itself (MemOS's, through the hook)."""
    try:
        yield
    except (ValueError, ImportError) as exc:
        if not _needs_kernels(exc):
            raise
        raise UnsupportedError(
            f"Loading {what} failed: this transformers wants its Hub kernels by default "
            "(use_kernels) and the `kernels` package is missing or of an unsupported version. "
            f"Run with {KERNELS_OFF} in the environment (transformers then uses its own "
            "layers), or install the kernels version transformers names.") from exc


def load_causal_lm(folder: str | Path, **kwargs: Any) -> Any:
    """``AutoModelForCausalLM.from_pretrained(folder, **kwargs)`` in eval mode, with the
    library's own layers (no Hub kernels)."""
    from transformers import AutoModelForCausalLM

    with kernel_errors(str(folder)):
        return AutoModelForCausalLM.from_pretrained(str(folder), use_kernels=False,
                                                    **kwargs).eval()


def load_encoder(folder: str | Path, **kwargs: Any) -> Any:
    """``AutoModel.from_pretrained(folder, **kwargs)`` in eval mode, no Hub kernels (the
    embedder check's encoder)."""
    from transformers import AutoModel

    with kernel_errors(str(folder)):
        return AutoModel.from_pretrained(str(folder), use_kernels=False, **kwargs).eval()
