"""The dense SwiGLU MLP: dense layers and shared experts. w_gate_up [H, 2F] is [gate | up], the
layout grouped_mlp takes per expert, so the activation is te_async.mlp's."""

import jax

from ..dense import linear


def swiglu_mlp(p: dict, x: jax.Array, kernel: str = "auto") -> jax.Array:
    """down(silu(x @ gate) * (x @ up)) with float32 accumulation, in x's dtype (te_async.dense.linear:
    at decode sizes the weights are read by te_async's small-M kernel, which applies the activation
    as the second GEMM loads its input; `kernel` is linear's)."""
    return linear(linear(x, p["w_gate_up"], kernel=kernel), p["w_down"], kernel=kernel, swiglu_input=True)
