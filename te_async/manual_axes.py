"""shard_map's varying manual axes (its check_vma types), for te_async's custom VJPs.

Inside jax.shard_map with check_vma=True every value's type says over which manual mesh axes it
varies, and a jax.custom_vjp's backward must return each cotangent typed as its primal input. A
product of a replicated weight with varying rows has a varying weight gradient, so the custom VJP
would return a varying cotangent for a replicated input, which JAX rejects; JAX's own primitives
first cast such inputs to vary alike (a pcast whose transpose sums over the axes). vary_alike
does that cast before a custom VJP. Outside shard_map nothing varies and it returns its inputs."""

import jax
from jax import lax


def varying_axes(aval) -> tuple:
    """The manual axes an abstract value varies over, sorted (jax >= 0.10's manual axis type)."""
    return tuple(sorted(aval.mat.varying))


def vary_alike(*arrays) -> tuple:
    """The arrays, each cast to vary over every manual axis any of them varies over (a None, an
    absent optional operand, stays None)."""
    have = [set() if a is None else set(varying_axes(jax.typeof(a))) for a in arrays]
    axes = set().union(*have)
    return tuple(a if a is None or h == axes else lax.pcast(a, tuple(sorted(axes - h)), to="varying")
                 for a, h in zip(arrays, have))
