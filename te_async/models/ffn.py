"""The dense SwiGLU MLP: dense layers and shared experts. w_gate_up [H, 2F] is [gate | up], the
layout grouped_mlp takes per expert, so the activation is te_async.mlp's."""

import jax
import jax.numpy as jnp

from ..mlp import activate


def swiglu_mlp(p: dict, x: jax.Array) -> jax.Array:
    """down(silu(x @ gate) * (x @ up)) with float32 accumulation, in x's dtype."""
    h = jnp.einsum("...h,hf->...f", x, p["w_gate_up"], preferred_element_type=jnp.float32).astype(x.dtype)
    a = activate(h, "swiglu")
    return jnp.einsum("...f,fh->...h", a, p["w_down"], preferred_element_type=jnp.float32).astype(x.dtype)
