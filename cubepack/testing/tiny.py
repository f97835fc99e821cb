"""Tiny, deterministic models and tokenizers built in milliseconds, with no download.

Used by the tests, the benchmarks and ``cubepack demo``: the machine that runs them may have no
network at all, and real models are gigabytes. Every model here is a real transformers model
saved with ``save_pretrained`` as safetensors, so everything cubepack does to it is what it does
to a real checkpoint.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from .._util.models import load_causal_lm
from .._util.quiet import quiet_libraries

CORPUS = (
    "The user is a Chinese man who likes green tea and long walks.",
    "MemOS stores the memory of a language model in a cube.",
    "A key value cache is only valid for the model that produced it.",
    "Pin to content, not to names: a branch is not a revision.",
    "Never unpickle untrusted bytes downloaded from the internet.",
)
OTHER_CORPUS = (
    "Completely different words make a completely different vocabulary here.",
    "Zebras, quartz and jukeboxes vex the wizard of the tokenizer forest.",
)
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
VOCAB_SIZE = 1000


def build_tokenizer(corpus: tuple[str, ...] = CORPUS, vocab_size: int = 400) -> Any:
    """A byte-level BPE fast tokenizer with a chat template, trained on ``corpus``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|pad|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tokenizer.train_from_iterator(list(corpus), trainer=trainer)
    # A causal LM takes no token_type_ids: MemOS passes the tokenizer's output to generate().
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>",
                                   bos_token="<|endoftext|>", pad_token="<|pad|>",
                                   model_input_names=["input_ids", "attention_mask"])
    fast.chat_template = CHAT_TEMPLATE
    return fast


def llama_config(num_layers: int = 2) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=128,
                       num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=512, initializer_range=0.5, tie_word_embeddings=False,
                       bos_token_id=0, eos_token_id=0, pad_token_id=1)


def hybrid_config(sliding_window: int = 4) -> Any:
    """A Qwen2 model whose first layer uses sliding-window attention."""
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=512, initializer_range=0.5,
                       use_sliding_window=True, sliding_window=sliding_window, max_window_layers=0,
                       layer_types=["sliding_attention", "full_attention"],
                       tie_word_embeddings=False, bos_token_id=0, eos_token_id=0, pad_token_id=1)


#: RoPE scalings whose model attends past ``max_position_embeddings`` (:func:`rope_scaled_config`).
ROPE_SCALINGS = ("yarn", "dynamic", "longrope")


def rope_scaled_config(kind: str, positions: int = 32, factor: float = 4.0) -> Any:
    """A Llama whose RoPE ``kind`` (YaRN, dynamic NTK, LongRoPE) scales ``positions`` by
    ``factor``: ``max_position_embeddings`` stays ``positions`` (as Qwen2.5 turns YaRN on: a
    factor over the pretraining length; what dynamic scaling grows past), so the model's own
    caches up to ``factor * positions`` are longer than that field."""
    from transformers import LlamaConfig

    scaling: dict[str, Any] = {"rope_type": kind, "factor": factor}
    if kind == "longrope":  # Phi-3's fields; one factor per rotary frequency (head_dim 16: 8)
        scaling["original_max_position_embeddings"] = positions
        scaling["short_factor"] = [1.0] * 8
        scaling["long_factor"] = [1.0 + index / 2 for index in range(8)]
    return LlamaConfig(vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=positions, rope_scaling=scaling,
                       initializer_range=0.5, tie_word_embeddings=False, bos_token_id=0,
                       eos_token_id=0, pad_token_id=1)


def build_model(folder: str | Path, config: Any, *, seed: int, tokenizer: Any,
                dtype: Any = None) -> Path:
    """Initialise a causal LM from ``config`` with ``seed`` and save it with its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(config)
    if dtype is not None:
        model = model.to(dtype)
    folder = Path(folder)
    with quiet_libraries(verbose=False, progress=False):  # no "Writing model shards" bar
        model.save_pretrained(folder, safe_serialization=True)
        tokenizer.save_pretrained(folder)
    return folder


def build_zoo(root: str | Path) -> dict[str, Path]:
    """Every fixture model the tests need, under ``root``; returns name -> folder.

    - ``a``: the producer; ``b``: same config, other seed (same shapes, other weights);
    - ``a_bf16``: A's weights saved in bfloat16; ``deep``: three layers instead of two;
    - ``other_tok``: A's exact weight files with a different tokenizer;
    - ``hybrid``: Qwen2 with a sliding-window layer and a full-attention layer.
    """
    import torch

    root = Path(root)
    tokenizer = build_tokenizer()
    zoo = {
        "a": build_model(root / "model-a", llama_config(), seed=0, tokenizer=tokenizer),
        "b": build_model(root / "model-b", llama_config(), seed=1, tokenizer=tokenizer),
        "a_bf16": build_model(root / "model-a-bf16", llama_config(), seed=0, tokenizer=tokenizer,
                              dtype=torch.bfloat16),
        "deep": build_model(root / "model-deep", llama_config(3), seed=0, tokenizer=tokenizer),
        "hybrid": build_model(root / "model-hybrid", hybrid_config(), seed=2, tokenizer=tokenizer),
    }
    other = root / "model-other-tokenizer"
    shutil.copytree(zoo["a"], other)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (other / name).unlink(missing_ok=True)
    build_tokenizer(OTHER_CORPUS).save_pretrained(other)
    zoo["other_tok"] = other
    return zoo


def load(folder: str | Path, dtype: Any = None) -> Any:
    """Load a saved tiny model for inference (eager attention: deterministic on CPU)."""
    kwargs = {"attn_implementation": "eager"}
    if dtype is not None:
        kwargs["dtype"] = dtype
    with quiet_libraries(verbose=False, progress=False):  # no "Loading weights" bar
        return load_causal_lm(folder, **kwargs)


def sentencepiece_model(corpus: tuple[str, ...] = CORPUS) -> bytes:
    """A SentencePiece BPE model (``tokenizer.model`` bytes) trained on ``corpus``: llama.cpp's
    converter recognises a byte-level BPE ``tokenizer.json`` only by the hash of a known
    vocabulary, so :func:`build_tokenizer`'s is not convertible; its SentencePiece path takes
    any model. Needs ``sentencepiece`` (the llama.cpp environment has it)."""
    import io

    import sentencepiece

    buffer = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus * 20), model_writer=buffer, vocab_size=100,
        model_type="bpe", hard_vocab_limit=False, minloglevel=2, unk_id=0, bos_id=1, eos_id=2,
        pad_id=-1)
    return buffer.getvalue()
