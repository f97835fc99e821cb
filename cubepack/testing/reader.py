"""Two tiny models that really answer from context, trained to the same bits on any CPU.

The demo (``python -m cubepack.demo``, ``make demo``) needs a harm a person can read: model A,
given a memory that says where someone lives, answers the city; model B, handed A's KV cache,
answers something else. A random model answers garbage either way, so these models are trained
on the one task the demo asks of them: MemOS's memory prompt holds one fact (``Alice lives in
Berlin.``), the user asks ``Where does Alice live?``, and the answer is the city the memory
gives; asked with no memory, they answer nothing. Names and cities are paired at random in
every example, so the city can only come from the memory: nothing about Berlin is learned into
the weights. (Several facts, where the name must pick the city, did not train in any budget we
tried: one fact is the honest size of these models.)

Why the weights ship (``reader_models/``, 0.65 MB) rather than being trained by the demo:
training both takes longer than the demo's whole budget; shipped, every machine prints the same
answers. :func:`main` trains them again, and a test checks that it reproduces the shipped
tensors bit for bit under every instruction set torch's CPU kernels use here (default, AVX2,
AVX-512). That holds because the training is not torch's: every sum in it is exact and every
other step one IEEE operation (:mod:`cubepack.testing._exact`), so neither the vector width nor
the thread count nor the torch release changes a bit (trained by torch's own kernels, the
weights differed between an AVX2 and an AVX-512 machine). Model B is the same recipe with
another seed: the same architecture, shapes and tokenizer (so plain MemOS loads A's cache into
it without a word), other weights (so cubepack's weights digest tells them apart).

The tokenizer is word-level: every word the demo's prompts use is one token, so an answer is
printed as words. The texts are exactly MemOS's (its ``build_kv_cache`` prefix and chat
template, :data:`CHAT_TEMPLATE`), so MemOS's own ``extract`` and ``generate`` drive the models.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Iterator

from .._util.quiet import quiet_libraries
from . import _exact
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
#: The recipe: Adam steps, conversations per step (with a memory; without one), learning rate
#: (decaying linearly to zero). Both seeds then answer all 324 pairs, and nothing without a
#: memory. It is near its edge (with 4 questions without a memory, seed 0 missed 54 pairs at
#: 300 steps): the tests check the shipped models, not the recipe.
STEPS, BATCH, SILENT, LR = 300, 16, 2, 3e-3


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

    return LlamaConfig(vocab_size=vocab_size, **_exact.ARCHITECTURE, bos_token_id=0,
                       eos_token_id=0, pad_token_id=1)


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


def unanswered(name: str) -> list[str]:
    """The tokens of the question asked with no memory (MemOS's ``generate`` without a cache:
    the question with the generation prompt), then the end of text: with nothing to read the
    city from, the model says nothing."""
    return ["<|user|>", *question(name)[:-1].split(), "?", "<|assistant|>", "<|endoftext|>"]


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """One torch thread while training: the results are the same with any number (every sum
    is exact), and one is faster for these small tensors on a shared machine."""
    import torch

    was = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(was)


def train(seed: int, tokenizer: Any, *, steps: int = STEPS, batch: int = BATCH,
          lr: float = LR) -> Any:
    """A 2-layer Llama trained from ``seed`` to answer from its context (see the module), as
    a transformers model in float32, in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    def tokens(rows: list[list[str]]) -> Any:
        return torch.tensor([tokenizer.convert_tokens_to_ids(row) for row in rows])

    def conversations(draw: Any) -> list[tuple[Any, int]]:
        # One fact: every conversation has the same length; the answer and the end of text are
        # learned. A question without a memory is answered by the end of text alone.
        answered = [conversation([(draw.choice(NAMES), draw.choice(CITIES))], 0)
                    for _ in range(batch)]
        silent = [unanswered(draw.choice(NAMES)) for _ in range(SILENT)]
        return [(tokens(answered), 2), (tokens(silent), 1)]

    with _one_thread():
        params = _exact.train(seed, len(tokenizer), conversations, steps=steps, lr=lr)
    with quiet_libraries(verbose=False, progress=False):
        model = AutoModelForCausalLM.from_config(config(len(tokenizer)))
    model.load_state_dict({name: tensor.to(torch.float32) for name, tensor in params.items()})
    return model.eval()


#: The shipped models: ``a`` and ``b``, each a folder ``save_pretrained`` wrote.
SHIPPED = Path(__file__).with_name("reader_models")
SEEDS = {"a": 0, "b": 1}
#: The versions that wrote the shipped files (:func:`main` records them): the tensors do not
#: depend on them, but the other files (config.json names the transformers release) do.
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
    for path in staging.rglob("*"):  # read by anyone, as a checkout has them (safetensors
        path.chmod(0o755 if path.is_dir() else 0o644)  # writes its file private)
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)  # nothing half-written: the folder appears whole
    print(f"trained {', '.join(SEEDS)} into {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
