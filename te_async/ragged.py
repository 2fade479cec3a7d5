"""te_async.ragged_dot: jax.lax.ragged_dot's signature and semantics on te_async's grouped GEMMs.

JAX MoE stacks (MaxText's sparse_matmul, for one) call jax.lax.ragged_dot, which the GPU backend
expands into a dense masked product over every group (10-13 TFLOP/s at DeepSeek-V2-Lite's
prefill and training shapes on an H200, docs/benchmarks.md tables P and T). Swapping in te_async.ragged_dot keeps the call and its
gradients and runs grouped GEMMs instead: forward lhs_g @ rhs[g], gradients through the
transposed rhs (lhs) and through ragged k (rhs), in one group-sizes mode chosen, by default, for
all three GEMMs (device mode where it has a fast kernel for each, else async).

Differences from jax.lax.ragged_dot: inputs are computed in their promoted dtype, which must be
bfloat16, float16 or float32; products are exact and sums float32 whatever `precision` says (it
is accepted for the signature's sake); group_offset is not supported (JAX's own ragged_dot does
not run with one either).
"""

from typing import Optional

import jax
import jax.numpy as jnp

from . import plan
from .gemm import GEMM_DTYPES, grouped_gemm, vjp_shapes
from .group_sizes import resolve_group_sizes_mode


def _check(lhs, rhs, group_sizes) -> None:
    """jax.lax.ragged_dot's rejections, with its kind of message."""
    if lhs.ndim != 2:
        raise TypeError(f"ragged_dot requires lhs of rank 2 (m, k), got shape {lhs.shape}")
    if rhs.ndim != 3:
        raise TypeError(f"ragged_dot requires rhs of rank 3 (g, k, n), got shape {rhs.shape}")
    if group_sizes.ndim != 1 or not jnp.issubdtype(group_sizes.dtype, jnp.integer):
        raise TypeError(f"ragged_dot requires integer group_sizes of rank 1, got {group_sizes.dtype} "
                        f"{tuple(group_sizes.shape)}")
    if rhs.shape[0] != group_sizes.shape[0]:
        raise TypeError(f"expected rhs group dimension size to be {group_sizes.shape[0]}, got {rhs.shape[0]}")
    if lhs.shape[1] != rhs.shape[1]:
        raise TypeError(f"ragged_dot requires contracting dimensions to have the same shape, got "
                        f"{lhs.shape[1]} (lhs {lhs.shape}) and {rhs.shape[1]} (rhs {rhs.shape})")


def ragged_dot(lhs, rhs, group_sizes, precision=None, preferred_element_type=None, group_offset=None, *,
               group_sizes_mode: Optional[str] = None) -> jax.Array:
    """lhs [m, k], rhs [g, k, n], group_sizes [g] -> [m, n]: row block g of lhs times rhs[g], rows
    past sum(group_sizes) zero, as jax.lax.ragged_dot; differentiable in lhs and rhs.
    group_sizes_mode as in te_async.grouped_gemm (None: device where fast for the forward and both
    gradients, else async)."""
    del precision  # products are exact, sums float32: at least HIGHEST's accuracy
    if group_offset is not None:
        raise NotImplementedError("te_async.ragged_dot does not support group_offset")
    lhs, rhs, group_sizes = jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(group_sizes)
    _check(lhs, rhs, group_sizes)
    dtype = jnp.promote_types(lhs.dtype, rhs.dtype)
    if dtype not in GEMM_DTYPES:
        raise TypeError(f"te_async.ragged_dot computes in bfloat16, float16 or float32, not {dtype} "
                        f"(lhs {lhs.dtype}, rhs {rhs.dtype})")
    out = jnp.dtype(preferred_element_type or dtype)
    computed = dtype if out == dtype else jnp.dtype(jnp.float32)  # te_async writes the input dtype or float32
    (m, k), (g, _, n) = lhs.shape, rhs.shape
    shapes = vjp_shapes(g, m, k, n, dtype, jnp.dtype(computed).name)
    mode = resolve_group_sizes_mode(group_sizes_mode, False, None, lambda: plan.device_mode_is_fast(shapes))
    y = grouped_gemm(lhs.astype(dtype), rhs.astype(dtype), group_sizes.astype(jnp.int32),
                     preferred_element_type=computed, group_sizes_mode=mode)
    return y.astype(out)
