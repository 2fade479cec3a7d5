"""Products of 16-bit operands accumulated in float32 whose gradients are products of 16-bit
operands too.

jnp.einsum(a, b, preferred_element_type=float32) of bf16 operands runs a bf16 GEMM, but JAX's
derivative of it multiplies the float32 cotangent by the other operand converted to float32:
float32 GEMMs, which XLA runs without tensor cores at precision HIGHEST (an H200's datasheet:
67 TFLOP/s FP32 against 989 dense bf16) and as TF32 at DEFAULT (half the bf16 rate), reading
twice the bytes either way. einsum() here rounds the cotangent to the operands' dtype
before its two gradient products, as mixed-precision training does (PyTorch's autocast Linear,
FlashAttention's dS), so a bf16 model's backward runs bf16 GEMMs with float32 accumulation.
Where the product's output is rounded to the operands' dtype anyway (a linear layer's output),
the cotangent already is in it and nothing changes but the GEMMs' speed; float32 operands round
nothing.
"""

import functools
from typing import Optional

import jax
import jax.numpy as jnp

from .manual_axes import vary_alike


def einsum(spec: str, a: jax.Array, b: jax.Array, *, precision: Optional[jax.lax.Precision] = None) -> jax.Array:
    """jnp.einsum(spec, a, b, precision=precision, preferred_element_type=float32), differentiated
    as the module says; operands of two dtypes are promoted to one first, as jnp.einsum does. spec
    names every axis with a letter (no ellipsis, no axis twice in one operand), and every axis of
    an operand is in the other operand or in the output (so that each gradient is one product)."""
    ins, _, out = spec.replace(" ", "").partition("->")
    sa, _, sb = ins.partition(",")
    names = sa + sb + out
    if not (out and sb and names.isalpha() and len(set(sa)) == len(sa) and len(set(sb)) == len(sb)
            and set(sa) <= set(sb + out) and set(sb) <= set(sa + out) and set(out) <= set(sa + sb)):
        raise ValueError(f"einsum spec {spec!r}: needs 'a,b->out' over letters, each axis once per operand and "
                         "each operand's axes in the other operand or the output")
    dtype = jnp.result_type(a, b)  # as jnp.einsum promotes
    return _einsum(*vary_alike(a.astype(dtype), b.astype(dtype)), (sa, sb, out), precision)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _einsum(a, b, specs, precision):
    sa, sb, out = specs
    return jnp.einsum(f"{sa},{sb}->{out}", a, b, precision=precision, preferred_element_type=jnp.float32)


def _einsum_fwd(a, b, specs, precision):
    return _einsum(a, b, specs, precision), (a, b)


def _einsum_bwd(specs, precision, residuals, g):
    a, b = residuals
    sa, sb, out = specs
    g = g.astype(a.dtype)
    product = functools.partial(jnp.einsum, precision=precision, preferred_element_type=jnp.float32)
    return (product(f"{out},{sb}->{sa}", g, b).astype(a.dtype), product(f"{out},{sa}->{sb}", g, a).astype(b.dtype))


_einsum.defvjp(_einsum_fwd, _einsum_bwd)
