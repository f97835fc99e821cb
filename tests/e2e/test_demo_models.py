"""The demo's two reader models (cubepack.testing.reader): they answer from their context in
every environment, their prompts are MemOS's, and the training script reproduces the shipped
weights exactly (with the versions they were trained with)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from cubepack.testing import reader, tiny


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


def test_the_training_script_reproduces_the_shipped_weights(tmp_path):
    trained_with = json.loads(reader.TRAINED_WITH.read_text())
    if reader.versions() != trained_with:
        pytest.skip(f"the shipped weights were trained with {trained_with}; this environment "
                    f"has {reader.versions()} (another release may initialise differently)")
    assert reader.main([str(tmp_path / "again")]) == 0
    for name in reader.SEEDS:
        shipped, again = (load_file(root / f"model-{name}" / "model.safetensors")
                          for root in (reader.SHIPPED, tmp_path / "again"))
        assert shipped.keys() == again.keys()
        assert all(torch.equal(shipped[k], again[k]) for k in shipped), name
        for file in ("tokenizer.json", "config.json"):
            assert (reader.SHIPPED / f"model-{name}" / file).read_bytes() == \
                (tmp_path / "again" / f"model-{name}" / file).read_bytes()
