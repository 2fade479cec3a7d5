"""Causal self-attention of a whole sequence from position 0: the models' forward, prefill and
training step.

XLA's attention (decode_attention.attend) materialises the [heads, S, S] scores and probabilities,
in float32, and its backward recomputes and reads them again: in DeepSeek-V2-Lite's training step
at 4096 tokens, XLA's elementwise and reduce fusions took 16 of 46 ms (docs/benchmarks.md, table
TM2), most of them that softmax by their sizes. On the GPU this runs cuDNN's flash attention
instead (jax.nn.dot_product_attention, implementation="cudnn"), forward and backward: the scores
stay on chip and the masked half is skipped. jax's public call takes values as wide as the keys,
so MLA's (128 dims against 192) are padded with zeros and the output sliced back: exact, at the
cost of computing 64 idle output columns. An odd sequence gets one zero row the same way.

TE_ASYNC_SEQUENCE_ATTENTION (read once): "auto" (default: cuDNN where jax's checks accept the
operands, XLA's attention elsewhere), "cudnn" (an error where it cannot run) or "xla" (XLA's
attention everywhere). cuDNN's backward is not bitwise reproducible: two identical training steps
gave different bits on an H200 (presumably its dQ, summed over key blocks in no fixed order).
"xla" is the setting for a step that must give the same bits twice, and "auto" takes it by itself
where XLA_FLAGS asks for --xla_gpu_deterministic_ops: with that flag jax 0.11.2's XLA failed to
compile the training step with cuDNN's attention (an internal IndexError, "raw_hash_map<>::at";
H100, 2026-12-05), while XLA's attention compiled and gave the same bits twice. On one H200
(docs/benchmarks.md, table TM2) cuDNN's made DeepSeek-V2-Lite's 4-layer training step at 4096
tokens 1.31x faster.
"""

import functools
import os
import re
from typing import Optional

import jax
import jax.numpy as jnp

from . import plan
from .decode_attention import attend, causal_mask, check_window_and_layer

KERNEL_ENV = "TE_ASYNC_SEQUENCE_ATTENTION"
KERNELS = ("auto", "cudnn", "xla")
CUDNN_DTYPES = (jnp.bfloat16, jnp.float16)


@functools.lru_cache(maxsize=None)
def default_kernel() -> str:
    """TE_ASYNC_SEQUENCE_ATTENTION, read once."""
    return plan.kernel_setting(KERNEL_ENV, KERNELS)


@functools.lru_cache(maxsize=None)
def deterministic_ops_requested() -> bool:
    """Whether XLA_FLAGS turns on --xla_gpu_deterministic_ops (bare, =true or =1), read once."""
    return re.search(r"--xla_gpu_deterministic_ops(=(true|1))?(\s|$)", os.environ.get("XLA_FLAGS", "")) is not None


def causal_attention(q: jax.Array, k: jax.Array, v: jax.Array, scale: float, window: Optional[int] = None, *,
                     kernel: Optional[str] = None) -> jax.Array:
    """Query i of q [B,S,H,dk] attends to keys j <= i (and j > i - window) of k [B,S,Hkv,dk], v
    [B,S,Hkv,dv], dv <= dk; the H query heads share the Hkv key heads in groups. [B,S,H,dv] in v's
    dtype. kernel: None (the TE_ASYNC_SEQUENCE_ATTENTION setting), "auto", "cudnn" or "xla"."""
    kernel = default_kernel() if kernel is None else kernel
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    if kernel == "auto" and deterministic_ops_requested():
        kernel = "xla"  # the module docstring says why
    _check_shapes(q, k, v)
    check_window_and_layer(window, 0, 1)
    if kernel != "xla" and plan.on_gpu() and {q.dtype, k.dtype, v.dtype} in ({jnp.dtype(d)} for d in CUDNN_DTYPES):
        try:
            return _cudnn(q, k, v, scale, window)
        except NotImplementedError:  # jax's checks: head dims, cuDNN version, compute capability
            if kernel == "cudnn":
                raise
    elif kernel == "cudnn":
        raise ValueError(f"kernel='cudnn' needs a GPU and bf16 or f16 operands of one dtype; got q {q.dtype}, "
                         f"k {k.dtype}, v {v.dtype}")
    pos = jnp.arange(q.shape[1], dtype=jnp.int32)
    return attend(q, k, v, causal_mask(pos, pos, window), scale)


def _check_shapes(q, k, v) -> None:
    b, s, h, dk = q.shape if q.ndim == 4 else (None,) * 4
    if k.ndim != 4 or v.ndim != 4 or k.shape[:2] != (b, s) or v.shape[:3] != k.shape[:3] or k.shape[3] != dk \
            or h % k.shape[2] or v.shape[3] > dk:
        raise ValueError(f"expected q [B,S,H,dk], k [B,S,Hkv,dk], v [B,S,Hkv,dv] with H a multiple of Hkv and "
                         f"dv <= dk; got q {q.shape}, k {k.shape}, v {v.shape}")


def _cudnn(q, k, v, scale, window):
    """jax's cuDNN call refuses an odd length when differentiated (jax 0.11: "Unsupported sequence
    length"), so one zero row is appended: causal, no real query sees it, and its gradient is cut."""
    s, dv = q.shape[1], v.shape[-1]
    pad = lambda x, cols=0: jnp.pad(x, ((0, 0), (0, s % 2), (0, 0), (0, cols)))
    out = jax.nn.dot_product_attention(pad(q), pad(k), pad(v, q.shape[-1] - dv), scale=scale, is_causal=True,
                                       implementation="cudnn",
                                       local_window_size=None if window is None else (window - 1, 0))
    return out[:, :s, :, :dv]
