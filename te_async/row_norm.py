"""RMSNorm and LayerNorm over the rows of x, differentiable: one CUDA kernel each way on the GPU.

grouped_mlp normalises every routed row before fc1 and differentiates through it. XLA runs that
norm as three kernels forward (the row sums, their rsqrt, the scaled output) and three backward
(the row dot products, then the input gradient fused with the scale's column sum), reading x up to
three times: 94 + 223 us a layer at DeepSeek-V2-Lite's 24576 routed rows on an H200
(docs/benchmarks.md, table T). csrc/cuda/row_norm.cu reads each operand once each way; the
backward writes per-block partial column sums for the scale and bias gradients, which an XLA
reduction adds in a fixed order (deterministic).

`normalize` takes the kernel on the GPU where it applies (16- or 32-bit x, H a multiple of 16
bytes up to 16 KB a row) from AUTO_MIN_ROWS rows, and `normalize_reference`, plain JAX, elsewhere;
both compute in float32 and round the output once to x's dtype. Below AUTO_MIN_ROWS (a decode
step's few rows) XLA fuses the norm into its neighbours' kernels, where a kernel of its own would
add a launch; the kernel was not timed there. TE_ASYNC_ROW_NORM=xla (or "te_async", an error
where the kernel cannot run) overrides the choice ("auto").
"""

import functools
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from . import _ffi, plan

ROW_NORM_FORWARD = "te_async_row_norm_forward"
ROW_NORM_BACKWARD = "te_async_row_norm_backward"
NORMS = ("rmsnorm", "layernorm", None)
KERNELS = ("auto", "te_async", "xla")
KERNEL_ENV = "TE_ASYNC_ROW_NORM"
AUTO_MIN_ROWS = 1024


@functools.lru_cache(maxsize=None)
def default_kernel() -> str:
    """TE_ASYNC_ROW_NORM, read once."""
    return plan.kernel_setting(KERNEL_ENV, KERNELS)


def normalize_reference(x, scale, bias, norm: Optional[str], eps: float):
    """RMSNorm or LayerNorm over the last axis in float32, cast back to x.dtype."""
    if norm is None:
        return x
    xf = x.astype(jnp.float32)
    if norm == "layernorm":
        xf = xf - jnp.mean(xf, axis=-1, keepdims=True)
    y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    if scale is not None:
        y = y * scale.astype(jnp.float32)
    if bias is not None:
        y = y + bias.astype(jnp.float32)
    return y.astype(x.dtype)


def kernel_blocks(x) -> int:
    """The kernels' blocks for x (its rows as [-1, H]) on the local GPUs, 0 where they do not apply
    (no CUDA module or GPU, another dtype, H not a multiple of 16 bytes or past 16 KB)."""
    module = _ffi.cuda_module()
    if module is None or not plan.on_gpu() or x.ndim < 1 or x.dtype not in (jnp.bfloat16, jnp.float16, jnp.float32):
        return 0
    h = x.shape[-1]
    rows = x.size // h if h else 0
    return module.row_norm_blocks(rows, h, jnp.dtype(x.dtype).itemsize, plan.local_sm_count())


def normalize(x, scale, bias, norm: Optional[str], eps: float, *, kernel: Optional[str] = None):
    """normalize_reference's value, through the CUDA kernels where they apply (see the module's
    docstring); differentiable in x, scale and bias either way. kernel: None (the TE_ASYNC_ROW_NORM
    setting), "auto", "te_async" or "xla"."""
    kernel = default_kernel() if kernel is None else kernel
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    if norm not in NORMS:
        raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")
    if norm is None:
        return x
    blocks = kernel_blocks(x) if kernel != "xla" else 0
    if kernel == "te_async" and not blocks:
        raise ValueError(f"kernel='te_async' needs a GPU and x of bfloat16, float16 or float32 whose rows are a multiple "
                         f"of 16 bytes, at most 16 KB; got {x.dtype} {x.shape}")
    h = x.shape[-1]
    if not blocks or (kernel == "auto" and x.size < AUTO_MIN_ROWS * h):
        return normalize_reference(x, scale, bias, norm, eps)
    static = _Static(norm == "layernorm", float(eps), blocks)
    return _normalize(static, x.reshape(-1, h), scale, bias).reshape(x.shape)


class _Static(NamedTuple):
    layernorm: bool
    eps: float
    blocks: int


def _vector(v, h: int) -> jax.Array:
    """An optional [H] parameter as the kernels take it: float32, [0] where there is none."""
    return jnp.zeros((0,), jnp.float32) if v is None else v.astype(jnp.float32).reshape(h)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _normalize(static: _Static, x, scale, bias):
    h = x.shape[1]
    call = jax.ffi.ffi_call(ROW_NORM_FORWARD, jax.ShapeDtypeStruct(x.shape, x.dtype), vmap_method="sequential")
    return call(x, _vector(scale, h), _vector(bias, h), layernorm=static.layernorm, eps=np.float32(static.eps),
                blocks=static.blocks)


def _normalize_fwd(static: _Static, x, scale, bias):
    return _normalize(static, x, scale, bias), (x, scale, bias)


def _normalize_bwd(static: _Static, residuals, dy):
    x, scale, bias = residuals
    h = x.shape[1]
    partials = lambda wanted: jax.ShapeDtypeStruct((static.blocks if wanted else 0, h), jnp.float32)
    call = jax.ffi.ffi_call(ROW_NORM_BACKWARD, (jax.ShapeDtypeStruct(x.shape, x.dtype), partials(scale is not None),
                                                partials(bias is not None)), vmap_method="sequential")
    dx, dscale, dbias = call(x, dy.astype(x.dtype), _vector(scale, h), layernorm=static.layernorm,
                             eps=np.float32(static.eps))
    column_sum = lambda part, like: None if like is None else jnp.sum(part, axis=0).reshape(like.shape).astype(like.dtype)
    return dx, column_sum(dscale, scale), column_sum(dbias, bias)


_normalize.defvjp(_normalize_fwd, _normalize_bwd)
