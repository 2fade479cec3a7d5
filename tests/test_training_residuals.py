"""What a scanned layer's gradient keeps for its backward, read from te_async.scan's stacks (the
AllocateBuffer calls of the gradient lowered for a GPU: one [layers, ...] buffer per residual).
The activation's, the norm's and attention's float32 values are recomputed in the backward
(jax.checkpoint), not stacked; each test fails without its checkpoint."""

import jax
import jax.numpy as jnp
import numpy as np

import te_async
from helpers import allocated_buffers, cuda_stablehlo
from te_async import models
from te_async.bench import presets
from te_async.decode_attention import attend, causal_mask
from te_async.models.ffn import swiglu_mlp
from te_async.models.norm import rms_norm
from te_async.moe import moe_block

LAYERS = 3


def _stacks(step, carry, xs) -> list:
    """The stacked residuals of jax.grad of sum(scan(step)) with respect to carry and xs."""
    loss = lambda c, x: jnp.sum(te_async.scan(step, c, x)[0].astype(jnp.float32))
    return allocated_buffers(cuda_stablehlo(jax.grad(loss, argnums=(0, 1)), carry, xs))


def _bf16(rng, *shape):
    return jnp.asarray(rng.standard_normal(shape) / 4, jnp.bfloat16)


def test_swiglu_mlp_keeps_its_bf16_product_not_float32_activations(rng):
    """A SwiGLU MLP (a shared expert, a dense layer) at training rows: the bf16 gate/up product is
    kept, no float32 array (dense.linear's checkpointed SwiGLU; JAX kept five of its size)."""
    rows, hidden, ffn = 64, 16, 24
    p = {"w_gate_up": _bf16(rng, LAYERS, hidden, 2 * ffn), "w_down": _bf16(rng, LAYERS, ffn, hidden)}
    stacks = _stacks(lambda x, p: (x + swiglu_mlp(p, x), None), _bf16(rng, rows, hidden), p)
    assert f"{LAYERS}x{rows}x{2 * ffn}xbf16" in stacks
    assert not [s for s in stacks if s.endswith("f32")], stacks


def test_rms_norm_keeps_no_float32_copy(rng):
    rows, hidden = 32, 16
    step = lambda x, w: (jnp.tanh(rms_norm(x, w, 1e-6)), None)
    stacks = _stacks(step, _bf16(rng, rows, hidden), _bf16(rng, LAYERS, hidden))
    assert not [s for s in stacks if s.endswith("f32") and s.startswith(f"{LAYERS}x{rows}x{hidden}")], stacks


def test_attention_keeps_its_inputs_not_its_probabilities(rng):
    """Causal attention over 24 positions: the scores and probabilities ([.., 24, 24], float32 and
    bf16) are recomputed in the backward; q, k and v are what it keeps."""
    batch, seq, heads, dim = 2, 24, 4, 8
    mask = causal_mask(jnp.arange(seq), jnp.arange(seq), None)

    def step(x, w):
        q, k, v = (jnp.einsum("bshd,de->bshe", x, w[i]) for i in range(3))
        return x + attend(q, k, v, mask, dim**-0.5), None

    stacks = _stacks(step, _bf16(rng, batch, seq, heads, dim), _bf16(rng, LAYERS, 3, dim, dim))
    assert not [s for s in stacks if f"x{seq}x{seq}x" in s], stacks
    assert stacks.count(f"{LAYERS}x{batch}x{seq}x{heads}x{dim}xbf16") >= 3


def test_bf16_model_keeps_no_attention_probabilities_and_one_float32_row_stack(rng):
    """A bf16 DeepSeek-V2-shaped model (MLA, shared experts, a dense first layer, then a scanned run
    of 3 MoE layers): no stacked residual of the attention's [seq, seq] shape, and of [tokens, hidden]
    in float32 only the router's input (its weights are float32 by design)."""
    config = presets.config("tiny", num_hidden_layers=1 + LAYERS)
    params = models.init_params(config, jax.random.key(0), jnp.bfloat16)
    batch, seq = 2, 24
    tokens = jnp.asarray(rng.integers(0, config.vocab_size, (batch, seq)), jnp.int32)
    loss = lambda p: jnp.mean(models.forward(p, config, tokens))
    stacks = allocated_buffers(cuda_stablehlo(jax.grad(loss), params))
    assert len(stacks) > 20
    assert not [s for s in stacks if f"x{seq}x{seq}x" in s or s.endswith(f"x{seq}x{seq}xf32")], stacks
    rows = [s for s in stacks if s.endswith("f32") and np.prod([int(d) for d in s[:-4].split("x")]) >=
            LAYERS * batch * seq * config.hidden_size]
    assert rows == [f"{LAYERS}x{batch * seq}x{config.hidden_size}xf32"], rows


def test_moe_block_keeps_its_input_rows_not_its_output_rows(rng):
    """A scanned MoE block's routed experts keep one [T*k, H] stack, grouped_mlp's input rows: the
    router weights ride on grouped_mlp's rows (row_weights), so the output rows that combine kept
    for the weights' gradient are kept by nobody."""
    tokens, experts, hidden, ffn, top_k = 32, 4, 16, 12, 2  # h [T*k, 24]: not the rows' shape
    p = {"router": _bf16(rng, LAYERS, hidden, experts), "w_fc1": _bf16(rng, LAYERS, experts, hidden, 2 * ffn),
         "w_fc2": _bf16(rng, LAYERS, experts, ffn, hidden)}
    step = lambda x, p: (x + moe_block(x, **p, top_k=top_k, group_sizes_mode="device", fuse=False), None)
    stacks = _stacks(step, _bf16(rng, tokens, hidden), p)
    assert stacks.count(f"{LAYERS}x{tokens * top_k}x{hidden}xbf16") == 1, stacks
