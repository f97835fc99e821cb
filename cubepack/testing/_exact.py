"""Training whose result does not depend on the CPU: the demo's reader models, bit for bit.

Whatever vector width torch's kernels use, and by the same argument on any CPU with IEEE-754
doubles (the tests run it under each instruction set torch uses on their machine).

Why not torch's own training: a float sum's result depends on its order, and torch's CPU kernels
order their sums by vector width (AVX-512 adds sixteen float32 lanes at once, AVX2 eight, the
default kernels one at a time), as do the BLAS kernels below a matmul and the SIMD versions of
``exp``. Hundreds of Adam steps turn those last-bit differences into different weights: trained
with torch, the shipped models were reproduced on one AVX-512 machine only with
``ATEN_CPU_CAPABILITY=avx2``, and on another under no setting at all.

Here every sum is exact, so its order cannot matter. Each tensor that enters a sum (a matmul's
operands, a broadcast's gradient, a softmax's terms) is first rounded to ``BITS`` significant
bits relative to the largest magnitude in that tensor (block floating point,
:func:`quantize`): a product of two such tensors is a whole multiple of one unit with at most
``2 * BITS`` bits, and a sum of up to ``2 ** (53 - 2 * BITS)`` of them is a whole multiple of
that unit below 2**53, which float64 holds exactly, in any order, with or without FMA. Every
other operation is one IEEE-754 operation per element (``+ - * /``, ``sqrt``, ``round``), which
every CPU rounds the same way; ``exp`` (softmax, SiLU's sigmoid) is built from those
(:func:`_exp`), not taken from a vectorised math library. The rotary tables and the
initialisation come from Python (``decimal``, ``random``), not from torch.

What is rounded is where the gradient enters a sum (:class:`_RoundGradient`) and where a value
enters one (:class:`_RoundValue`): 20 bits relative to each tensor's largest element, a
precision between bfloat16's and float32's, at which this task trains as it does in float32.

The model is transformers' Llama (:func:`forward` computes what ``LlamaForCausalLM`` does:
RMSNorm, rotary attention with grouped keys and values, SwiGLU MLP; a test compares it with
transformers on the shipped weights), trained in float64 and saved in float32.
"""

from __future__ import annotations

import functools
import math
import random
from decimal import Decimal, localcontext
from typing import Any, Callable

#: Significant bits each tensor entering a sum keeps.
BITS = 20
#: The longest sum that stays exact: products of two BITS-bit values, 2**53 in all.
MAX_TERMS = 2 ** (53 - 2 * BITS)
#: What the models are: transformers' LlamaConfig fields (set here, not from its defaults, which
#: move between releases: the rotary base moved into ``rope_parameters`` in 5.x).
ARCHITECTURE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                "num_attention_heads": 4, "num_key_value_heads": 2,
                "max_position_embeddings": 128, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
                "initializer_range": 0.02, "hidden_act": "silu", "attention_bias": False,
                "mlp_bias": False, "tie_word_embeddings": False}
#: Adam's settings (torch.optim.AdamW's defaults, no weight decay).
BETAS, EPS = (0.9, 0.999), 1e-8


def quantize(x: Any) -> Any:
    """``x`` rounded to :data:`BITS` significant bits relative to its largest magnitude."""
    import torch

    low, high = torch.aminmax(x)
    peak = max(-low.item(), high.item())
    if peak == 0.0:
        return x.clone()
    _, exponent = math.frexp(peak)  # peak < 2**exponent
    scale = math.ldexp(1.0, BITS - exponent)  # a power of two: x * scale is exact
    return torch.round(x * scale).mul_(1.0 / scale)


@functools.cache
def _autograd() -> tuple[Callable, Callable, Callable, Callable]:
    """The four autograd functions (torch imported when training starts, not at import)."""
    import torch

    class _RoundValue(torch.autograd.Function):
        """Round a value that enters a sum; its gradient passes unchanged."""

        @staticmethod
        def forward(ctx, x):
            return quantize(x)

        @staticmethod
        def backward(ctx, grad):
            return grad

    class _RoundGradient(torch.autograd.Function):
        """The value passes unchanged; its gradient, which enters the sums of the backward
        pass (a matmul's, a broadcast's), is rounded."""

        @staticmethod
        def forward(ctx, x):
            return x

        @staticmethod
        def backward(ctx, grad):
            return quantize(grad)

    class _Exp(torch.autograd.Function):
        @staticmethod
        def forward(ctx, z):
            out = _exp(z)
            ctx.save_for_backward(out)
            return out

        @staticmethod
        def backward(ctx, grad):
            (out,) = ctx.saved_tensors
            return grad * out

    class _Sigmoid(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            t = _exp(torch.clamp(-x.abs(), min=-60.0))  # exp(-|x|): never overflows
            s = torch.where(x >= 0, 1.0 / (1.0 + t), t / (1.0 + t))
            ctx.save_for_backward(s)
            return s

        @staticmethod
        def backward(ctx, grad):
            (s,) = ctx.saved_tensors
            return grad * (s * (1.0 - s))

    return _RoundValue.apply, _RoundGradient.apply, _Exp.apply, _Sigmoid.apply


# Cody-Waite: LN2_HI has few bits, so k * LN2_HI is exact for the k used here (|k| < 100).
_LN2_HI, _LN2_LO, _INV_LN2 = 0.693145751953125, 1.42860682030941723212e-6, 1.4426950408889634
#: exp(r) on |r| <= ln(2)/2 by its Taylor polynomial to this degree (relative error < 6e-9).
_DEGREE = 7


def _exp(z: Any) -> Any:
    """exp(z) for float64 ``z`` in [-60, 0], from IEEE ``+ - *`` only (one operation per torch
    call: no fused multiply-add that one kernel would round once and another twice)."""
    import torch

    k = torch.round(z * _INV_LN2)
    r = (z - k * _LN2_HI) - k * _LN2_LO
    p = r * (1.0 / math.factorial(_DEGREE)) + 1.0 / math.factorial(_DEGREE - 1)
    for n in range(_DEGREE - 2, -1, -1):
        p = p * r + 1.0 / math.factorial(n)
    two_k = ((k.to(torch.int64) + 1023) << 52).view(torch.float64)  # 2**k, built from its bits
    return p * two_k


@functools.cache
def rotary_tables(length: int, head_dim: int, theta: float) -> tuple[Any, Any]:
    """cos and sin of each position's rotary angles, (length, head_dim) float64 in
    transformers' layout (the angles twice over), computed in decimal: the same bits
    everywhere."""
    import torch

    def cos_sin(angle: Decimal) -> tuple[float, float]:
        cos, sin, term, n = Decimal(0), Decimal(0), Decimal(1), 0
        while term != 0 and n < 400:  # sum the Taylor series until its terms vanish
            if n % 4 == 0:
                cos += term
            elif n % 4 == 1:
                sin += term
            elif n % 4 == 2:
                cos -= term
            else:
                sin -= term
            n += 1
            term = term * angle / n
        return float(cos), float(sin)

    rows_cos, rows_sin = [], []
    with localcontext() as context:
        context.prec = 40
        inverse = [(-(Decimal(i) / head_dim) * Decimal(theta).ln()).exp()
                   for i in range(0, head_dim, 2)]
        for position in range(length):
            pairs = [cos_sin(position * f) for f in inverse]
            rows_cos.append([c for c, _ in pairs] * 2)
            rows_sin.append([s for _, s in pairs] * 2)
    return (torch.tensor(rows_cos, dtype=torch.float64),
            torch.tensor(rows_sin, dtype=torch.float64))


def parameter_shapes(vocab_size: int) -> dict[str, tuple[int, ...]]:
    """The Llama's parameters by transformers' names, in the order they are initialised."""
    a = ARCHITECTURE
    d, kv = a["hidden_size"], a["num_key_value_heads"] * a["hidden_size"] // \
        a["num_attention_heads"]
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab_size, d)}
    for i in range(a["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({p + "self_attn.q_proj.weight": (d, d), p + "self_attn.k_proj.weight": (kv, d),
                       p + "self_attn.v_proj.weight": (kv, d), p + "self_attn.o_proj.weight": (d, d),
                       p + "mlp.gate_proj.weight": (a["intermediate_size"], d),
                       p + "mlp.up_proj.weight": (a["intermediate_size"], d),
                       p + "mlp.down_proj.weight": (d, a["intermediate_size"]),
                       p + "input_layernorm.weight": (d,),
                       p + "post_attention_layernorm.weight": (d,)})
    shapes["model.norm.weight"] = (d,)
    shapes["lm_head.weight"] = (vocab_size, d)
    return shapes


def initial_parameters(vocab_size: int, seed: int) -> dict[str, Any]:
    """Norm weights 1, every matrix uniform with the standard deviation transformers' normal
    initialisation has (``initializer_range``), drawn from Python's ``random``."""
    import torch

    draw = random.Random(seed)
    half_width = ARCHITECTURE["initializer_range"] * math.sqrt(3.0)
    params = {}
    for name, shape in parameter_shapes(vocab_size).items():
        if name.endswith("norm.weight"):
            params[name] = torch.ones(shape, dtype=torch.float64)
        else:
            values = [(draw.random() * 2.0 - 1.0) * half_width for _ in range(math.prod(shape))]
            params[name] = torch.tensor(values, dtype=torch.float64).reshape(shape)
    return params


def forward(params: dict[str, Any], ids: Any, positions: list[int]) -> Any:
    """The logits ``LlamaForCausalLM`` gives at ``positions`` of each row of ``ids`` (one
    length, no padding), as (rows * len(positions), vocab), with every sum exact."""
    import torch

    value, gradient, exp, sigmoid = _autograd()
    a = ARCHITECTURE
    rows, length = ids.shape
    d, heads, groups = a["hidden_size"], a["num_attention_heads"], a["num_key_value_heads"]
    head_dim, eps = d // heads, a["rms_norm_eps"]
    vocab = params["model.embed_tokens.weight"].shape[0]
    if max(rows * length, d, a["intermediate_size"], vocab) > MAX_TERMS:
        raise ValueError(f"a sum of more than {MAX_TERMS} terms would not be exact")

    def linear(x, weight):
        return gradient(value(x) @ value(weight).transpose(0, 1))

    def rms_norm(x, weight):
        x = value(x)
        mean_square = (x * x).sum(-1, keepdim=True) / x.shape[-1]
        normed = gradient(x * (1.0 / torch.sqrt(mean_square + eps)))
        return gradient(value(normed) * value(weight))

    def softmax(scores, mask):
        top = scores.masked_fill(~mask, -math.inf).amax(-1, keepdim=True).detach()
        terms = value(exp(torch.clamp(scores - top, min=-60.0, max=0.0)) * mask)
        return gradient(terms * value(1.0 / terms.sum(-1, keepdim=True)))

    def rotate(x, cos, sin):
        half = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

    cos, sin = rotary_tables(length, head_dim, a["rope_theta"])
    one_hot = torch.zeros(rows * length, vocab, dtype=torch.float64)
    one_hot[torch.arange(rows * length), ids.reshape(-1)] = 1.0
    h = gradient(one_hot @ value(params["model.embed_tokens.weight"])).reshape(rows, length, d)
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    for i in range(a["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = rms_norm(h, params[p + "input_layernorm.weight"]).reshape(rows * length, d)

        def split(name, count, x=x, p=p):
            return linear(x, params[p + name]).reshape(rows, length, count, head_dim) \
                .transpose(1, 2)

        q = rotate(split("self_attn.q_proj.weight", heads), cos, sin)
        k = rotate(split("self_attn.k_proj.weight", groups), cos, sin)
        v = split("self_attn.v_proj.weight", groups)
        shared = (rows, groups, heads // groups, length, head_dim)
        k = k[:, :, None].expand(shared).reshape(rows, heads, length, head_dim)
        v = v[:, :, None].expand(shared).reshape(rows, heads, length, head_dim)
        scores = gradient(value(q) @ value(k).transpose(-1, -2)) * (1.0 / math.sqrt(head_dim))
        attended = gradient(value(softmax(scores, causal)) @ value(v))
        attended = attended.transpose(1, 2).reshape(rows * length, d)
        h = h + linear(attended, params[p + "self_attn.o_proj.weight"]).reshape(rows, length, d)
        x = rms_norm(h, params[p + "post_attention_layernorm.weight"]).reshape(rows * length, d)
        gate = linear(x, params[p + "mlp.gate_proj.weight"])
        up = linear(x, params[p + "mlp.up_proj.weight"])
        h = h + linear(gate * sigmoid(gate) * up,
                       params[p + "mlp.down_proj.weight"]).reshape(rows, length, d)
    last = rms_norm(h[:, positions], params["model.norm.weight"])
    return linear(last.reshape(-1, d), params["lm_head.weight"])


@functools.cache
def _loss() -> Callable:
    import torch

    class _CrossEntropy(torch.autograd.Function):
        """Mean cross-entropy; its gradient (softmax - one-hot) / n, from exact sums."""

        @staticmethod
        def forward(ctx, logits, target):
            top = logits.amax(-1, keepdim=True)
            terms = quantize(_exp(torch.clamp(logits - top, min=-60.0)))
            p = terms / terms.sum(-1, keepdim=True)
            one_hot = torch.zeros_like(p).scatter_(1, target[:, None], 1.0)
            ctx.save_for_backward(p, one_hot)
            return -torch.log((p * one_hot).amax(-1)).mean()  # reported only

        @staticmethod
        def backward(ctx, grad):
            p, one_hot = ctx.saved_tensors
            return (p - one_hot) * (grad / p.shape[0]), None

    return _CrossEntropy.apply


def train(seed: int, vocab_size: int,
          batches: Callable[[random.Random], list[tuple[Any, int]]], *, steps: int,
          lr: float) -> dict[str, Any]:
    """Train from ``seed``: ``batches(draw)`` gives each step's groups of conversations, each
    (token ids (rows, length), n): the loss is on each row's last n tokens (each predicted from
    the one before, as transformers shifts labels), averaged over all; AdamW (no weight decay)
    with its learning rate decaying linearly to zero. Returns the float64 parameters by
    transformers' names."""
    import torch

    cross_entropy = _loss()
    draw = random.Random(seed)
    params = initial_parameters(vocab_size, seed)
    for tensor in params.values():
        tensor.requires_grad_(True)
    first = {name: torch.zeros_like(t) for name, t in params.items()}
    second = {name: torch.zeros_like(t) for name, t in params.items()}
    (beta1, beta2), power1, power2 = BETAS, 1.0, 1.0
    for step in range(steps):
        groups = batches(draw)
        logits = torch.cat([forward(params, ids, list(range(ids.shape[1] - 1 - n,
                                                             ids.shape[1] - 1)))
                            for ids, n in groups])
        loss = cross_entropy(logits, torch.cat([ids[:, -n:].reshape(-1) for ids, n in groups]))
        grads = torch.autograd.grad(loss, list(params.values()))
        rate = lr * (1 - step / steps)
        power1, power2 = power1 * beta1, power2 * beta2  # products, not pow(): the same bits
        with torch.no_grad():
            for (name, tensor), grad in zip(params.items(), grads):
                first[name] = first[name] * beta1 + grad * (1 - beta1)
                second[name] = second[name] * beta2 + (grad * grad) * (1 - beta2)
                step_size = (first[name] / (1 - power1)) / \
                    (torch.sqrt(second[name] / (1 - power2)) + EPS)
                tensor.sub_(step_size * rate)
    return {name: tensor.detach() for name, tensor in params.items()}
