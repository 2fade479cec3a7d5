"""What a step must do: decode_bytes, the bytes one decode step must read (for a bandwidth floor:
bytes over the HBM read rate); train_flops, the model FLOPs of a training step (for TFLOP/s and MFU)."""

from typing import Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np

from .cache import cache_shapes
from .params import layer_runs, param_shapes


def tree_bytes(tree) -> int:
    """Bytes of the arrays (or ShapeDtypeStructs) of a pytree."""
    return sum(int(np.prod(s.shape)) * jnp.dtype(s.dtype).itemsize for s in jax.tree_util.tree_leaves(tree))


def _check_positive(**counts) -> None:
    for name, value in counts.items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def decode_bytes(config, batch: int, context_len: int, active_experts: Union[float, Sequence[float]], *,
                 dtype=jnp.bfloat16, cache_dtype=None) -> Union[int, float]:
    """Bytes a decode step of `batch` tokens must read at context length `context_len` (the cached
    tokens attended to, the new one included): per layer the attention weights, norms, dense MLP,
    router, shared experts and the `active_experts` routed experts the step's routing touches (a count
    for every MoE layer, or one per MoE layer; at most min(num_experts, batch * top_k); a mean over
    steps may be fractional, and the bytes are linear in it, so the result is then a float), the KV
    cache up to context_len (cache_dtype, default dtype; MLA: the latent and the rope key), one
    embedding row per token, the final norm and the LM head. Weights in `dtype`, routers in float32
    (params.py). A step as decode_step runs it reads the whole max_len cache, masked: this is the floor.
    """
    _check_positive(batch=batch, context_len=context_len)
    shapes = param_shapes(config, dtype)
    runs = layer_runs(config)
    n_moe = sum(n for (_, n), run in zip(runs, shapes["layers"]) if "moe" in run)
    active = [active_experts] * n_moe if np.ndim(active_experts) == 0 else list(active_experts)
    if len(active) != n_moe:
        raise ValueError(f"active_experts has {len(active)} entries for {n_moe} MoE layers")
    limit = min(config.num_experts, batch * config.num_experts_per_tok)
    if any(not 0 < a <= limit for a in active):
        raise ValueError(f"active experts per layer must be in [1, {limit}] at batch {batch}, got {active}")
    total = 0
    for (_, n), run in zip(runs, shapes["layers"]):  # each run's leaves hold its n layers
        total += tree_bytes({k: v for k, v in run.items() if k != "moe"})
        if "moe" in run:
            moe = dict(run["moe"])
            expert = tree_bytes({"w_fc1": moe.pop("w_fc1"), "w_fc2": moe.pop("w_fc2")}) // (n * config.num_experts)
            total += tree_bytes(moe) + sum(expert * a for a in active[:n])
            active = active[n:]
    cache_item = jnp.dtype(cache_dtype or dtype).itemsize
    per_token = sum(int(np.prod(s[:1] + s[3:])) for run in cache_shapes(config, 1, 1) for s in run.values())
    total += batch * context_len * per_token * cache_item
    row = config.hidden_size * jnp.dtype(dtype).itemsize
    total += batch * row + tree_bytes(shapes["final_norm"]) + tree_bytes(shapes.get("lm_head", shapes["embed"]))
    return total


def train_flops(config, batch: int, seq: int) -> int:
    """Model FLOPs of one training step, forward and backward (3x the forward), on `batch` sequences
    of `seq` tokens from position 0, as MFU counts them: 2 per multiply-add of every weight matrix a
    token passes through (the attention's projections, the dense MLP or the router, the shared
    experts and its top_k routed experts, the LM head; the embedding is a lookup) and of causal
    attention's scores and values (a query at position i sees min(i + 1, window) keys). Norms,
    activations, softmax and the routing's sort are not counted, nor recomputation."""
    _check_positive(batch=batch, seq=seq)
    c = config
    shapes = param_shapes(c, jnp.float32)
    if c.is_mla:
        qk, v = c.qk_nope_head_dim + c.qk_rope_head_dim, c.v_head_dim
    else:
        qk = v = c.head_dim
    positions = np.arange(seq)
    weights = int(np.prod(shapes.get("lm_head", shapes["embed"]).shape))  # multiply-adds per token
    attention = 0  # multiply-adds per sequence
    for (start, n), run in zip(layer_runs(c), shapes["layers"]):
        for path, s in jax.tree_util.tree_leaves_with_path(run):
            name = path[-1].key
            if len(s.shape) < 3:  # norms, biases, DeepSeek-V3's router bias: [n, width]
                continue
            size = int(np.prod(s.shape))
            weights += size * c.num_experts_per_tok // c.num_experts if name in ("w_fc1", "w_fc2") else size
        window = c.window(start)
        seen = positions + 1 if window is None else np.minimum(positions + 1, window)
        attention += n * c.num_attention_heads * (qk + v) * int(seen.sum())
    return 3 * 2 * (batch * seq * weights + batch * attention)
