"""te_async.decode_moe on every backend: the fused path's JAX side (the two calls' attributes,
the sum over the (token, choice) slots, the custom_vjp) with the handler replaced by its contract
written in plain JAX, against the unfused path; and the default's rule. The kernels themselves
are checked on the GPU (test_decode_moe_gpu.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from te_async import decode_moe
from te_async.gemm import grouped_gemm
from te_async.mlp import activate
from te_async.routing import route

from reference import rel_error


def expert_gemm_contract(lhs, rhs, dispatch, weights, out_dtype, *, gather_div, scatter, swiglu):
    """csrc/cuda/expert_gemm.cc's contract: row r reads lhs row choice_of_row[r] // gather_div
    (gather_div > 0) and, with swiglu, silu(gate) * linear in lhs's dtype; with scatter, it is
    written to row choice_of_row[r], times weights.flat[choice_of_row[r]]; f32 accumulation."""
    c = dispatch.choice_of_row
    rows = lhs[c // gather_div] if gather_div else lhs
    if swiglu:
        rows = activate(rows, "swiglu")
    y = grouped_gemm(rows, rhs, dispatch.group_sizes, preferred_element_type=jnp.float32)
    if scatter:
        y = jnp.zeros_like(y).at[c].set(y * weights.reshape(-1)[c][:, None])
    return y.astype(out_dtype)


@pytest.fixture
def contract(monkeypatch):
    monkeypatch.setattr(decode_moe, "_expert_gemm", expert_gemm_contract)


@pytest.mark.parametrize("tokens, experts, top_k", [(1, 8, 2), (5, 16, 3), (7, 4, 4)])
def test_fused_glue_matches_unfused(rng, contract, tokens, experts, top_k):
    hidden, ffn = 24, 20
    x = jnp.asarray(rng.standard_normal((tokens, hidden)), jnp.float32)
    w_fc1 = jnp.asarray(rng.standard_normal((experts, hidden, 2 * ffn)) / np.sqrt(hidden), jnp.float32)
    w_fc2 = jnp.asarray(rng.standard_normal((experts, ffn, hidden)) / np.sqrt(ffn), jnp.float32)
    logits = jnp.asarray(rng.standard_normal((tokens, experts)), jnp.float32)
    routing, dispatch = route(logits, top_k, renormalize=False, kernel="xla")
    args = (x, routing.weights, dispatch, w_fc1, w_fc2)
    fused, unfused = jax.jit(decode_moe._fused)(*args), jax.jit(decode_moe._unfused)(*args)
    assert rel_error(fused, unfused) < 1e-6
    loss = lambda f: lambda x, w, a, b: jnp.sum(f(x, w, dispatch, a, b) ** 2)
    got = jax.grad(loss(decode_moe._fused), argnums=(0, 1, 2, 3))(x, routing.weights, w_fc1, w_fc2)
    want = jax.grad(loss(decode_moe._unfused), argnums=(0, 1, 2, 3))(x, routing.weights, w_fc1, w_fc2)
    for g, w in zip(got, want):
        assert rel_error(g, w) < 1e-6


def test_nothing_fuses_off_the_gpu_or_outside_device_mode(rng):
    if jax.default_backend() == "gpu":
        pytest.skip("a GPU is the default backend here: test_decode_moe_gpu.py checks the rule")
    w_fc1, w_fc2 = jnp.zeros((8, 16, 24), jnp.float32), jnp.zeros((8, 12, 16), jnp.float32)
    for mode in ("device", "async", "sync"):
        assert not decode_moe.can_fuse(1, 2, w_fc1, w_fc2, mode=mode, activation="swiglu")
        assert not decode_moe.fuses(1, 2, w_fc1, w_fc2, mode=mode, activation="swiglu")
