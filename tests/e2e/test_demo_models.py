"""The demo's two reader models (cubepack.testing.reader): they answer from their context in
every environment, their prompts are MemOS's, and the training script reproduces the shipped
weights bit for bit under every instruction set torch's CPU kernels use on this machine
(default, AVX2, AVX-512: none forced by the product), and the other shipped files with the
versions that wrote them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from cubepack.testing import reader, tiny

from envs import MEMOS


def test_a_conversation_is_the_tokens_memos_prompts_make():
    tokenizer = reader.build_tokenizer()
    facts = [("Alice", "Berlin")]
    # MemOS's build_kv_cache (system message, no generation prompt), then its generate
    # (the question with the generation prompt): memos/llms/hf.py.
    memory = tokenizer.apply_chat_template(
        [{"role": "system", "content": f"{reader.MEMOS_PREFIX}\n{reader.memory_text(facts)}"}],
        tokenize=False, add_generation_prompt=False)
    ask = tokenizer.apply_chat_template(
        [{"role": "user", "content": reader.question("Alice")}], tokenize=False,
        add_generation_prompt=True)
    assert tokenizer.tokenize(memory + ask) + ["Berlin", "<|endoftext|>"] == \
        reader.conversation(facts, 0)
    assert tokenizer.decode(tokenizer("Berlin<|endoftext|>").input_ids,
                            skip_special_tokens=True) == "Berlin"


def test_a_question_without_memory_is_the_tokens_memos_generate_makes():
    tokenizer = reader.build_tokenizer()
    # MemOS's generate without a cache: the question with the generation prompt (hf.py).
    ask = tokenizer.apply_chat_template(
        [{"role": "user", "content": reader.question("Alice")}], tokenize=False,
        add_generation_prompt=True)
    assert tokenizer.tokenize(ask) + ["<|endoftext|>"] == reader.unanswered("Alice")


@pytest.mark.parametrize("name", sorted(reader.SEEDS))
def test_each_shipped_model_answers_nothing_without_a_memory(name):
    tokenizer = reader.build_tokenizer()
    model = tiny.load(reader.SHIPPED / f"model-{name}")
    rows = torch.tensor([tokenizer.convert_tokens_to_ids(reader.unanswered(n))
                         for n in reader.NAMES])
    with torch.no_grad():
        answers = model(input_ids=rows[:, :-1]).logits[:, -1].argmax(-1)
    assert tokenizer.convert_ids_to_tokens(answers.tolist()) == ["<|endoftext|>"] * len(rows)


def test_the_training_computes_what_transformers_runs():
    """The exact trainer's forward pass is transformers' LlamaForCausalLM's (within its
    rounding to 20 bits), on the shipped weights: it trains the model the demo loads."""
    from safetensors.torch import load_file

    from cubepack.testing import _exact

    tokenizer = reader.build_tokenizer()
    model = tiny.load(reader.SHIPPED / "model-a")
    params = {k: v.to(torch.float64)
              for k, v in load_file(reader.SHIPPED / "model-a" / "model.safetensors").items()}
    pairs = [(n, c) for n in reader.NAMES[:4] for c in reader.CITIES[:4]]
    rows = torch.tensor([tokenizer.convert_tokens_to_ids(reader.conversation([pair], 0))
                         for pair in pairs])
    positions = list(range(rows.shape[1]))
    with torch.no_grad():
        ours = _exact.forward(params, rows, positions).reshape(len(pairs), len(positions), -1)
        theirs = model.double()(input_ids=rows).logits
    assert torch.allclose(ours, theirs, rtol=0, atol=1e-3), (ours - theirs).abs().max()


@pytest.mark.parametrize("name", sorted(reader.SEEDS))
def test_each_shipped_model_answers_every_name_and_city_from_its_context(name):
    tokenizer = reader.build_tokenizer()
    model = tiny.load(reader.SHIPPED / f"model-{name}")
    pairs = [(n, c) for n in reader.NAMES for c in reader.CITIES]
    rows = torch.tensor([tokenizer.convert_tokens_to_ids(reader.conversation([pair], 0))
                         for pair in pairs])
    with torch.no_grad():
        answers = model(input_ids=rows[:, :-2]).logits[:, -1].argmax(-1)
    assert tokenizer.convert_ids_to_tokens(answers.tolist()) == [c for _, c in pairs]


def test_the_shipped_weights_are_small():
    size = sum(p.stat().st_size for p in reader.SHIPPED.rglob("*") if p.is_file())
    assert size <= 5 * 2**20


def _environment(capability: str | None) -> dict[str, str]:
    """This process's environment with ``ATEN_CPU_CAPABILITY=capability`` (None: unset, as a
    user runs it)."""
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    if capability is not None:
        env["ATEN_CPU_CAPABILITY"] = capability
    return env


def _started(argv: list[str], capability: str | None) -> subprocess.Popen:
    """``python ARGV`` under ``ATEN_CPU_CAPABILITY=capability``, started (output kept)."""
    return subprocess.Popen([sys.executable, *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_environment(capability))


def _finished(processes: list[subprocess.Popen], timeout: float) -> list[str]:
    """Each process's standard output once all have ended (each must exit 0); any still
    running when one fails or times out is killed."""
    try:
        outputs = []
        for process in processes:
            output, errors = process.communicate(timeout=timeout)
            assert process.returncode == 0, output + errors
            outputs.append(output)
        return outputs
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()


@pytest.fixture(scope="module")
def retrained(tmp_path_factory) -> dict[str, Path]:
    """``python -m cubepack.testing.reader FOLDER`` in a process of its own under every
    capability this CPU offers (default, avx2, avx512; each once), with none forced first: the
    folder each trained, by the capability torch ran, and "unforced". The probes (which
    capability torch runs when one is asked for: it falls back to the best the CPU has for one
    the CPU lacks), then the trainings, run at once: independent processes, each the run it
    would be alone, so a second core shortens the wait instead of idling."""
    asked = (None, "default", "avx2", "avx512")
    probe = ["-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"]
    probed = _finished([_started(probe, capability) for capability in asked], timeout=300)
    runs: dict[str, str | None] = {}
    for capability, output in zip(asked, probed):
        runs.setdefault(output.split()[-1].lower(), capability)
    folders = {ran: tmp_path_factory.mktemp(f"again-{ran}") / "models" for ran in runs}
    _finished([_started(["-m", "cubepack.testing.reader", str(folders[ran])], capability)
               for ran, capability in runs.items()], timeout=1800)
    folders["unforced"] = folders[next(ran for ran, capability in runs.items()
                                       if capability is None)]
    return folders


@pytest.mark.skipif(not MEMOS, reason="the demo's models are trained where the demo runs: the "
                                      "memos environment (its transformers wrote the files)")
def test_the_training_script_reproduces_the_shipped_tensors_under_every_capability(retrained):
    assert {"unforced", "default"} <= set(retrained), retrained
    for capability, folder in retrained.items():
        for name in reader.SEEDS:
            shipped, again = (load_file(root / f"model-{name}" / "model.safetensors")
                              for root in (reader.SHIPPED, folder))
            assert shipped.keys() == again.keys()
            differ = [k for k in shipped if not torch.equal(shipped[k], again[k])]
            assert not differ, (capability, name, differ)


@pytest.mark.skipif(not MEMOS, reason="the demo's models are trained where the demo runs: the "
                                      "memos environment (its transformers wrote the files)")
def test_the_training_script_reproduces_the_shipped_files(retrained):
    trained_with = json.loads(reader.TRAINED_WITH.read_text())
    if reader.versions() != trained_with:
        pytest.skip(f"the shipped files were written with {trained_with}; this environment "
                    f"has {reader.versions()} (config.json names the transformers release)")
    again = retrained["unforced"]
    assert sorted(p.relative_to(again) for p in again.rglob("*")) == \
        sorted(p.relative_to(reader.SHIPPED) for p in reader.SHIPPED.rglob("*"))
    for path in reader.SHIPPED.rglob("*"):
        if path.is_file():
            assert path.read_bytes() == (again / path.relative_to(reader.SHIPPED)).read_bytes(), \
                path
