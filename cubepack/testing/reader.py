"""Two tiny models that really answer from context, trained deterministically on CPU.

The demo (``python -m cubepack.demo``, ``make demo``) needs a harm a person can read: model A, given a memory that says
where someone lives, answers the city; model B, handed A's KV cache, answers something else. A
random model answers garbage either way, so these models are trained on the one task the demo
asks of them: MemOS's memory prompt holds one fact (``Alice lives in Berlin.``), the user asks
``Where does Alice live?``, and the answer is the city the memory gives. Names and cities are
paired at random in every example, so the city can only come from the memory: nothing about
Berlin is learned into the weights. (Several facts, where the name must pick the city, did not
train in any budget we tried: one fact is the honest size of these models.)

Why the weights ship (``reader_models/``, 0.65 MB) rather than being trained by the demo:
training both takes about 20 s of CPU each on a busy 2-core machine (400 steps; fewer steps
left some seeds unable to copy), more than the demo's whole budget; shipped, every machine
prints the same answers. :func:`main` trains them again (seeded; deterministic algorithms;
one thread, since a floating-point sum's order depends on how many threads share it), and a
test checks that it reproduces the shipped tensors exactly with the versions in
:data:`TRAINED_WITH`. Model B is the same recipe with another seed: the same architecture,
shapes and tokenizer (so plain MemOS loads A's cache into it without a word), other weights
(so cubepack's weights digest tells them apart).

The tokenizer is word-level: every word the demo's prompts use is one token, so an answer is
printed as words. The texts are exactly MemOS's (its ``build_kv_cache`` prefix and chat
template, :data:`CHAT_TEMPLATE`), so MemOS's own ``extract`` and ``generate`` drive the models.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Iterator

from .._util.quiet import quiet_libraries
from .tiny import CHAT_TEMPLATE

NAMES = ("Alice", "Bob", "Carol", "Dave", "Erin", "Frank", "Grace", "Heidi", "Ivan", "Judy",
         "Mallory", "Oscar", "Peggy", "Rupert", "Sybil", "Trent", "Victor", "Walter")
CITIES = ("Berlin", "Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Rome", "Madrid", "Lisbon",
          "Vienna", "Dublin", "Prague", "Seoul", "Delhi", "Nairobi", "Sydney", "Quito", "Hanoi")
#: What MemOS's ``build_kv_cache`` puts before a memory given as text (memos/llms/hf.py).
MEMOS_PREFIX = "Below is some information about the user."
WORDS = ("Below", "is", "some", "information", "about", "the", "user", ".", "lives", "in",
         "Where", "does", "live", "?")
SPECIALS = ("<|endoftext|>", "<|pad|>", "<unk>", "<|system|>", "<|user|>", "<|assistant|>")
STEPS = 400


def build_tokenizer() -> Any:
    """A word-level fast tokenizer over :data:`WORDS`, names and cities, with MemOS's chat
    template (the role markers are special tokens, so ``<|user|>Where`` is two tokens)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {word: i for i, word in enumerate((*SPECIALS, *WORDS, *NAMES, *CITIES))}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.decoder = decoders.WordPiece()  # joins words with spaces, "." and "?" attached
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>",
                                   bos_token="<|endoftext|>", pad_token="<|pad|>",
                                   unk_token="<unk>",
                                   additional_special_tokens=list(SPECIALS[3:]),
                                   model_input_names=["input_ids", "attention_mask"])
    fast.chat_template = CHAT_TEMPLATE
    return fast


def config(vocab_size: int) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=128, tie_word_embeddings=False,
                       bos_token_id=0, eos_token_id=0, pad_token_id=1)


def memory_text(facts: list[tuple[str, str]]) -> str:
    """The memory as a user would write it: ``Alice lives in Berlin. Bob lives in Paris.``"""
    return " ".join(f"{name} lives in {city}." for name, city in facts)


def question(name: str) -> str:
    return f"Where does {name} live?"


def conversation(facts: list[tuple[str, str]], asked: int) -> list[str]:
    """The tokens of one conversation, as MemOS builds it: the memory prefill
    (``build_kv_cache``: the system message, no generation prompt), then the question with the
    generation prompt, then the answer and the end of text. Built as tokens, not through the
    chat template (a template per example is most of a training step's time); a test checks
    they are the template's."""
    memory = " ".join(f"{name} lives in {city} ." for name, city in facts)
    return ["<|system|>", *f"{MEMOS_PREFIX[:-1]} . {memory}".split(), "<|user|>",
            *question(facts[asked][0])[:-1].split(), "?", "<|assistant|>", facts[asked][1],
            "<|endoftext|>"]


@contextlib.contextmanager
def _deterministic(threads: int = 1) -> Iterator[None]:
    import torch

    was = (torch.are_deterministic_algorithms_enabled(), torch.get_num_threads())
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(threads)
    try:
        with torch.random.fork_rng(devices=[]):
            yield
    finally:
        torch.use_deterministic_algorithms(was[0])
        torch.set_num_threads(was[1])


def train(seed: int, tokenizer: Any, *, steps: int = STEPS, batch: int = 64,
          lr: float = 3e-3) -> Any:
    """A 2-layer Llama trained from ``seed`` to answer from its context (see the module)."""
    import random

    import torch
    from transformers import AutoModelForCausalLM

    draw = random.Random(seed)
    with _deterministic():
        torch.manual_seed(seed)
        cfg = config(len(tokenizer))
        cfg._attn_implementation = "eager"
        model = AutoModelForCausalLM.from_config(cfg)
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
        # Linear decay to zero: large steps early learn fast, small ones late settle.
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: 1 - i / steps)
        model.train()
        for _ in range(steps):
            rows = [tokenizer.convert_tokens_to_ids(conversation(
                [(draw.choice(NAMES), draw.choice(CITIES))], 0)) for _ in range(batch)]
            ids = torch.tensor(rows)  # one fact: every conversation has the same length
            labels = torch.full_like(ids, -100)
            labels[:, -2:] = ids[:, -2:]  # only the answer and the end of text are learned
            model(input_ids=ids, labels=labels).loss.backward()
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
        model.eval()
    return model


#: The shipped models: ``a`` and ``b``, each a folder ``save_pretrained`` wrote.
SHIPPED = Path(__file__).with_name("reader_models")
SEEDS = {"a": 0, "b": 1}
#: The versions the shipped weights were trained with (:func:`main` writes it): another torch
#: or transformers may initialise or sum differently, so reproduction is checked only with these.
TRAINED_WITH = SHIPPED / "trained_with.json"


def build(folder: str | Path, *, seed: int, tokenizer: Any = None) -> Path:
    """Train a reader model from ``seed`` and save it with its tokenizer (safetensors)."""
    tokenizer = tokenizer or build_tokenizer()
    model = train(seed, tokenizer)
    folder = Path(folder)
    with quiet_libraries(verbose=False, progress=False):
        model.save_pretrained(folder, safe_serialization=True)
        tokenizer.save_pretrained(folder)
    return folder


def versions() -> dict[str, str]:
    import torch
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__}


def main(argv: list[str] | None = None) -> int:
    """``python -m cubepack.testing.reader [FOLDER]``: train both models again into FOLDER
    (default: the shipped ones, :data:`SHIPPED`, replaced whole)."""
    import json
    import shutil
    import sys
    import tempfile

    argv = sys.argv[1:] if argv is None else argv
    target = Path(argv[0]) if argv else SHIPPED
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".reader-", dir=target.parent))
    staging.chmod(0o755)  # mkdtemp makes it private; the shipped folder is read by anyone
    tokenizer = build_tokenizer()
    for name, seed in SEEDS.items():
        build(staging / f"model-{name}", seed=seed, tokenizer=tokenizer)
    (staging / TRAINED_WITH.name).write_text(json.dumps(versions(), indent=1) + "\n")
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)  # nothing half-written: the folder appears whole
    print(f"trained {', '.join(SEEDS)} into {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
