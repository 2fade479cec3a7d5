"""A dense x @ w that reads its weights near the bandwidth floor at decode sizes.

At a decode step a dense layer's GEMM (attention projections, shared experts, dense MLP layers,
routers, the LM head) has as many rows as the batch, and its time is the read of its weights.
Inside a scan over stacked layers XLA copies each weight slice that one of its GEMMs reads
(a memcpy per GEMM and step), and at one row it runs the GEMM as a multiply fusion that writes
the f32 product and a reduction that reads it back. te_async's device-mode grouped GEMM with a
single group avoids both: XLA hands a scanned weight slice to a custom call in place, and the
small_groups kernel reads each weight once, splitting K over the SMs when the columns alone would
leave most of them idle. It stays inside the step's CUDA graph.

Measured on an H200 (2026-12-01, tools note in docs/benchmarks.md): one GEMM [1, 2048] x [2048,
3072] in a jit of 26 (wall clock per GEMM) took 13.6 us here against XLA's 15.9; at 4 rows 15.1
against 13.7, and worse past that; the whole DeepSeek-V2-Lite decode step at batch 1 went from
5.86 to 4.62 ms. So linear() takes this path up to MAX_ROWS rows and XLA's GEMM past it. batched_matmul() does the
same for a batch of GEMMs (decode attention over a KV cache).
"""

import math

import jax
import jax.numpy as jnp

from . import plan
from .gemm import grouped_gemm

MAX_ROWS = 2  # rows up to which linear() runs te_async's small-M kernel (see the module docstring)


def _xla(spec: str, x, w, out_type):
    return jnp.einsum(spec, x, w, precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32).astype(out_type)


def _grouped(x2d, w3d, rows_per_group: int, transpose_w: bool, out_type):
    sizes = jnp.full((w3d.shape[0],), rows_per_group, jnp.int32)
    return grouped_gemm(x2d, w3d, sizes, transpose_rhs=transpose_w, preferred_element_type=out_type,
                        group_sizes_mode="device")


def _check(x, w, transpose_w: bool, batched: bool) -> None:
    k = x.shape[-1]
    fits = w.ndim == 2 + batched and (w.shape[-1] if transpose_w else w.shape[-2]) == k
    if batched:
        fits = fits and x.ndim == 3 and w.shape[0] == x.shape[0]
    if not fits:
        raise ValueError(f"x {x.shape} and w {w.shape} (transpose_w={transpose_w}) do not fit")


def linear(x: jax.Array, w: jax.Array, *, transpose_w: bool = False, preferred_element_type=None) -> jax.Array:
    """x [..., K] @ w [K, N] (w [N, K] with transpose_w) -> [..., N], accumulated in float32 from
    exact products (float32 inputs are not rounded to TF32) and returned in preferred_element_type
    (default x's dtype). x and w share a dtype."""
    _check(x, w, transpose_w, batched=False)
    *lead, k = x.shape
    rows, out_type = math.prod(lead), preferred_element_type or x.dtype
    if not 0 < rows <= MAX_ROWS:
        return _xla("...k,nk->...n" if transpose_w else "...k,kn->...n", x, w, out_type)
    return _grouped(x.reshape(rows, k), w[None], rows, transpose_w, out_type).reshape(*lead, -1)


def batched_matmul(x: jax.Array, w: jax.Array, *, transpose_w: bool = False, preferred_element_type=None) -> jax.Array:
    """x [G, R, K] @ w [G, K, N] (w [G, N, K] with transpose_w) -> [G, R, N], as linear() computes.

    Decode attention over a KV cache is such a batch: per sequence, its heads' queries against its
    cache. Inside a scan over stacked layers the cache is a slice of the run's stacked cache, which
    XLA copies for each of its own GEMMs but hands to a custom call in place; so up to the
    small_groups row limit (te_async.plan) this is one te_async grouped GEMM of G groups of R rows,
    and XLA's batched GEMM past it."""
    _check(x, w, transpose_w, batched=True)
    g, r, k = x.shape
    out_type = preferred_element_type or x.dtype
    if not 0 < g * r <= plan.read_settings().small_groups_max_rows:
        return _xla("grk,gnk->grn" if transpose_w else "grk,gkn->grn", x, w, out_type)
    return _grouped(x.reshape(g * r, k), w, r, transpose_w, out_type).reshape(g, r, -1)
