import torch

import cubepack
from cubepack.testing import tiny  # two tiny offline models; use any transformers causal LM

tokenizer = tiny.build_tokenizer()
model = tiny.load(tiny.build_model("model-a", tiny.llama_config(), seed=0, tokenizer=tokenizer))
other = tiny.load(tiny.build_model("model-b", tiny.llama_config(), seed=1, tokenizer=tokenizer))

ids = torch.tensor([[1, 17, 42, 7, 99]])
cache = cubepack.prefill(model, ids)  # the KV cache model A builds for this prompt
cubepack.save_kv_cache(cache, "memory.kv.safetensors", producer=model, token_ids=ids)

loaded = cubepack.load_kv_cache("memory.kv.safetensors", model)  # its producer: loads
print("loaded", loaded.get_seq_length(), "positions")
try:
    cubepack.load_kv_cache("memory.kv.safetensors", other)  # same shapes, other weights
except cubepack.IdentityMismatch as refusal:
    print("refused:", refusal)  # names weights_digest, expected vs found
