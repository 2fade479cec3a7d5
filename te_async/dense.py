"""A dense x @ w that reads its weights near the bandwidth floor at decode sizes.

At a decode step a dense layer's GEMM (attention projections, shared experts, dense MLP layers,
routers, the LM head) has as many rows as the batch, and its time is the read of its weights.
Inside a scan over stacked layers XLA copies each weight slice that one of its GEMMs reads
(a memcpy per GEMM and step), and at one row it runs the GEMM as a multiply fusion that writes
the f32 product and a reduction that reads it back. te_async's device-mode grouped GEMM with a
single group avoids both: XLA hands a scanned weight slice to a custom call in place, and the
small_groups kernel reads each weight once, splitting K over the SMs when the columns alone would
leave most of them idle. It stays inside the step's CUDA graph. ("In place" is a dynamic-slice
fusion around the call, which costs each scan trip 11-20 us of host time per such call on an
H200, tools/scan_trip_probe.py: hidden where a layer keeps the GPU busy longer, as in the models'
decode step; docs/benchmarks.md, "Tried and dropped: stacked weights read in place".)

Measured on an H200 (2026-12-01, docs/results/2026-12-01-h200-generate/dense_probe.log): one
GEMM [1, 2048] x [2048, 3072] in a jit of 26 (wall clock per GEMM) took 13.6 us here against
XLA's 15.9; at 4 rows 15.1 against 13.7, and worse past that; the whole DeepSeek-V2-Lite decode
step at batch 1 went from 5.86 to 4.62 ms. So linear() takes this path up to MAX_ROWS rows and XLA's GEMM past it.
"""

import math

import jax
import jax.numpy as jnp

from .gemm import grouped_gemm

MAX_ROWS = 2  # rows up to which linear() runs te_async's small-M kernel (see the module docstring)
KERNELS = ("auto", "te_async", "xla")


def linear(x: jax.Array, w: jax.Array, *, transpose_w: bool = False, preferred_element_type=None,
           kernel: str = "auto") -> jax.Array:
    """x [..., K] @ w [K, N] (w [N, K] with transpose_w) -> [..., N], accumulated in float32 from
    exact products (float32 inputs are not rounded to TF32) and returned in preferred_element_type
    (default x's dtype). x and w share a dtype. kernel: "auto" (te_async's small-M kernel up to
    MAX_ROWS rows, XLA's GEMM past them), or "te_async" or "xla" whatever the rows (to compare)."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    *lead, k = x.shape
    if w.ndim != 2 or (w.shape[1] if transpose_w else w.shape[0]) != k:
        raise ValueError(f"linear: x {x.shape} and w {w.shape} (transpose_w={transpose_w}) do not fit")
    rows, n = math.prod(lead), w.shape[0] if transpose_w else w.shape[1]
    out_type = preferred_element_type or x.dtype
    if kernel == "xla" or rows == 0 or (kernel == "auto" and rows > MAX_ROWS):
        spec = "...k,nk->...n" if transpose_w else "...k,kn->...n"
        return jnp.einsum(spec, x, w, precision=jax.lax.Precision.HIGHEST,
                          preferred_element_type=jnp.float32).astype(out_type)
    y = grouped_gemm(x.reshape(rows, k), w[None], jnp.full((1,), rows, jnp.int32), transpose_rhs=transpose_w,
                     preferred_element_type=out_type, group_sizes_mode="device")
    return y.reshape(*lead, n)
