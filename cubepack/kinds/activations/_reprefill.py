"""Re-prefilling an activation with another model: the one implementation ``cubepack migrate``
and the MemOS hook's ``rebuild`` policy share.

A cache is rebuilt from what the cube proves it was built from: its stored token ids, when the
new model's tokenizer is the producer's (same ``tokenizer_digest``: the ids mean the same text);
otherwise its ``source_text``, re-tokenised with the new model's tokenizer and chat template as
MemOS builds a cache (:func:`~cubepack.memos_format._layout.memos_prompt_ids`), and the result says
so. The new cache is the new model's prefill of those ids, so it is ``recomputed`` by
construction.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...errors import CubepackError, IdentityMismatch, Mismatch, RecomputationFailed
from ...format._provenance import RECOMPUTED
from ...identity._config_fields import declared_context
from ...identity._identity import ModelIdentity
from ...kv._torch import cache_layers, prefill
from ...memos_format._layout import item_metadata, memos_prompt_ids

#: Why an item was re-tokenised from its source text.
NO_IDS = "it records no token ids"
OTHER_TOKENIZER = "the new model's tokenizer is not its producer's (tokenizer_digest differs)"


@dataclass
class Reprefilled:
    """One activation rebuilt by a model: the ids it prefilled, the cache it built."""

    item_id: str
    token_ids: list[int]
    cache: Any  # the model's own DynamicCache for ``token_ids``
    #: why the ids were re-tokenised from source_text (None: the stored ids were used)
    retokenized: str | None
    seconds: float

    @property
    def layers(self) -> list[tuple]:
        return cache_layers(self.cache)


def token_ids_for(item_id: str, *, token_ids: list[int] | None, metadata: dict[str, Any],
                  producer: ModelIdentity | None, identity: ModelIdentity,
                  tokenizer: Callable[[], Any]) -> tuple[list[int], str | None]:
    """(ids the model ``identity`` must prefill, why they were re-tokenised or None).

    ``tokenizer`` is called only when the source text must be re-tokenised.

    Raises:
        RecomputationFailed: the stored ids are another tokenizer's (or absent) and the item
            records no source_text; the tokenizer has no chat template for it.
        IdentityMismatch: a stored id lies outside the model's vocabulary.
    """
    same = producer is not None and producer.tokenizer_digest == identity.tokenizer_digest
    if token_ids and same:
        vocab = identity.geometry.get("vocab_size")
        if isinstance(vocab, int) and max(token_ids) >= vocab:
            raise IdentityMismatch(f"Activation {item_id!r}", [
                Mismatch("token_ids", f"< {vocab} (the model's vocab_size)", max(token_ids))],
                "The new model cannot read these ids; migrate to a model of this vocabulary.")
        return list(token_ids), None
    why = NO_IDS if not token_ids else OTHER_TOKENIZER
    source = item_metadata(metadata).get("source_text")
    if source is None:
        theirs = producer.tokenizer_digest if producer is not None else "unknown"
        detail = ("it records no token ids" if not token_ids else
                  f"its token ids are its producer's tokenizer's (tokenizer_digest {theirs}), "
                  f"not the new model's ({identity.tokenizer_digest})")
        raise RecomputationFailed(
            f"Activation {item_id!r} cannot be rebuilt by the new model: {detail}, and it records "
            "no source_text to re-tokenise, so the new model's tokenizer cannot reproduce its "
            "prompt. Migrate to a model with the producer's tokenizer, or re-extract the "
            "activation from its text.")
    try:
        ids = memos_prompt_ids(tokenizer(), source)
    except CubepackError:
        raise  # a source_text that is neither text nor messages: its own sentence
    except Exception as exc:  # noqa: BLE001 - no chat template, an odd message: one sentence
        raise RecomputationFailed(
            f"Activation {item_id!r} cannot be re-tokenised from its source_text with the new "
            f"model's tokenizer and chat template ({type(exc).__name__}: {exc}); give the "
            "tokenizer a chat template, or migrate to a model with the producer's tokenizer.")
    if not ids:
        raise RecomputationFailed(f"Activation {item_id!r}: its source_text gives no tokens.")
    return ids, why


def reprefill(model: Any, item_id: str, *, token_ids: list[int] | None,
              metadata: dict[str, Any], producer: ModelIdentity | None,
              identity: ModelIdentity, tokenizer: Callable[[], Any]) -> Reprefilled:
    """Rebuild one activation with the loaded ``model`` (whose identity is ``identity``): see
    the module docstring and :func:`token_ids_for`."""
    import torch

    ids, why = token_ids_for(item_id, token_ids=token_ids, metadata=metadata, producer=producer,
                             identity=identity, tokenizer=tokenizer)
    # The ids (or the source text) are the cube's claim, of any length: refuse what the model
    # cannot attend over rather than prefill it (memory grows with the length).
    limit, how = declared_context(getattr(model, "config", None))
    if limit is not None and len(ids) > limit:
        raise RecomputationFailed(
            f"Activation {item_id!r} has {len(ids)} tokens, more than the new model attends "
            f"over ({limit}: {how}); it cannot be rebuilt by this model. Migrate to a model "
            "with a longer context, or shorten the memory.")
    started = time.perf_counter()
    device = next(model.parameters()).device
    cache = prefill(model, torch.tensor([ids], device=device))
    return Reprefilled(item_id, ids, cache, why, time.perf_counter() - started)


def provenance(done: Reprefilled, identity: ModelIdentity, by: str) -> dict[str, Any]:
    """The ``recomputed`` label of a re-prefilled activation: made by this model from these
    ids just now, so it is that model's cache by construction."""
    source = ("the stored token ids" if done.retokenized is None else
              "its source_text, re-tokenised with the model's chat template because "
              + done.retokenized)
    return {"kind": RECOMPUTED,
            "detail": f"recomputed by construction: re-prefilled by {by} with the model of "
                      f"weights {identity.weights_digest} from {source} "
                      f"({len(done.token_ids)} tokens)",
            "model": identity.weights_digest, "tokens": len(done.token_ids),
            "retokenized": done.retokenized is not None,
            "at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
