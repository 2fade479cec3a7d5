"""The dense SwiGLU MLP: dense layers and shared experts. w_gate_up [H, 2F] is [gate | up], the
layout grouped_mlp takes per expert, so the activation is te_async.mlp's."""

import jax

from .. import token_ffn
from ..dense import linear

KERNELS = ("auto", "token_ffn", "te_async", "xla")


def swiglu_mlp(p: dict, x: jax.Array, kernel: str = "auto") -> jax.Array:
    """down(silu(x @ gate) * (x @ up)) with float32 accumulation, in x's dtype. kernel: "auto" runs one
    token through te_async.token_ffn (both GEMMs and the activation in one kernel) where it applies,
    and otherwise te_async.dense.linear's "auto" (at decode sizes te_async's small-M kernel, which
    applies the activation as the second GEMM loads its input); "token_ffn" insists on the one kernel;
    "te_async" and "xla" run both GEMMs with that linear() kernel, for comparison."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    token = x.reshape(-1, x.shape[-1])
    shared = token_ffn.Shared(p["w_gate_up"], p["w_down"])
    if kernel == "token_ffn" or (kernel == "auto" and token_ffn.applies(token, shared=shared)):
        return token_ffn.token_ffn(token, shared=shared).reshape(x.shape)
    return linear(linear(x, p["w_gate_up"], kernel=kernel), p["w_down"], kernel=kernel, swiglu_input=True)
