"""te_async.decode_moe on the GPU: the fused decode experts (gather in fc1, swiglu and the weighted
combine in fc2) against a float64 reference and against the unfused device path, on random and
adversarial routings, sizes that are not multiples of 8, f32 and bf16; bit-identical repeats;
gradients; moe_block's and the models' use of it. Outputs are poisoned in gpu_check.sh's runs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from te_async import decode_moe
from te_async.moe import moe_block
from te_async.routing import Routing, plan_dispatch, route

from reference import rel_error

pytestmark = pytest.mark.gpu

TOL = {jnp.float32: 1e-5, jnp.bfloat16: 1.5e-2}


def experts_reference(x, weights, experts, w_fc1, w_fc2):
    """sum_k w_k * fc2(swiglu(fc1(x))) per token in float64, with fc1's output and the activation
    rounded to x's dtype as both te_async paths do."""
    dt = x.dtype
    x64, w1, w2 = (np.asarray(jnp.asarray(a, jnp.float64)) for a in (x, w_fc1, w_fc2))
    rnd = lambda v: np.asarray(jnp.asarray(v).astype(dt).astype(jnp.float64))
    out = np.zeros(x.shape, np.float64)
    for t in range(x.shape[0]):
        for j in range(experts.shape[1]):
            e = int(experts[t, j])
            h = rnd(x64[t] @ w1[e])
            gate, lin = np.split(h, 2)
            a = rnd(gate / (1 + np.exp(-gate)) * lin)
            out[t] += float(weights[t, j]) * (a @ w2[e])
    return out


def make(rng, tokens, experts, hidden, ffn, dtype, top_k, routing_kind):
    x = jnp.asarray(rng.standard_normal((tokens, hidden)), dtype)
    w_fc1 = jnp.asarray(rng.standard_normal((experts, hidden, 2 * ffn)) / np.sqrt(hidden), dtype)
    w_fc2 = jnp.asarray(rng.standard_normal((experts, ffn, hidden)) / np.sqrt(ffn), dtype)
    logits = rng.standard_normal((tokens, experts)).astype(np.float32)
    if routing_kind == "one_expert":  # every token's first choice is expert 1: one group of T rows
        logits[:, 1] += 30.0
    elif routing_kind == "distinct":  # token t prefers experts t*k .. t*k+k-1 (wrapping): few shared
        for t in range(tokens):
            logits[t, (np.arange(top_k) + t * top_k) % experts] += 30.0 - np.arange(top_k)
    return x, w_fc1, w_fc2, jnp.asarray(logits)


CASES = [  # tokens, experts, hidden, ffn, top_k
    (1, 64, 256, 176, 6),
    (8, 64, 256, 176, 6),
    (3, 8, 72, 40, 2),
    (5, 16, 100, 36, 3),  # hidden and ffn not multiples of 8: the scalar paths
    (32, 128, 128, 96, 8),
]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("routing_kind", ["random", "one_expert", "distinct"])
def test_fused_matches_float64_and_unfused(rng, dtype, case, routing_kind):
    tokens, experts, hidden, ffn, top_k = case
    x, w_fc1, w_fc2, logits = make(rng, tokens, experts, hidden, ffn, dtype, top_k, routing_kind)
    assert decode_moe.can_fuse(tokens, top_k, w_fc1, w_fc2, mode="device", activation="swiglu")
    routing, dispatch = route(logits, top_k, renormalize=False)
    fused = jax.jit(decode_moe.fused_experts)
    y = fused(x, routing, dispatch, w_fc1, w_fc2)
    assert y.shape == x.shape and y.dtype == dtype
    ref = experts_reference(x, np.asarray(routing.weights), np.asarray(routing.experts), w_fc1, w_fc2)
    assert rel_error(y, ref) < TOL[dtype]
    unfused = jax.jit(decode_moe._unfused)(x, routing.weights, dispatch, w_fc1, w_fc2)
    assert rel_error(y, unfused) < TOL[dtype]
    np.testing.assert_array_equal(fused(x, routing, dispatch, w_fc1, w_fc2), y)  # bit-identical repeat


def test_fused_with_the_reference_dispatch(rng):
    """fused_experts takes any dispatch of the stable sort, here plain JAX's, not the kernel's."""
    x, w_fc1, w_fc2, logits = make(rng, 4, 8, 64, 32, jnp.float32, 2, "random")
    routing, _ = route(logits, 2, renormalize=True, kernel="xla")
    y = jax.jit(decode_moe.fused_experts)(x, routing, plan_dispatch(routing.experts, 8), w_fc1, w_fc2)
    ref = experts_reference(x, np.asarray(routing.weights), np.asarray(routing.experts), w_fc1, w_fc2)
    assert rel_error(y, ref) < TOL[jnp.float32]


def test_fused_gradients_are_the_unfused_ones(rng):
    x, w_fc1, w_fc2, logits = make(rng, 3, 8, 64, 32, jnp.float32, 2, "random")
    routing, dispatch = route(logits, 2, renormalize=True)
    loss = lambda f: lambda x, w, a, b: jnp.sum(f(x, w, a, b) ** 2)
    fused = loss(lambda x, w, a, b: decode_moe.fused_experts(x, Routing(w, routing.experts), dispatch, a, b))
    unfused = loss(lambda x, w, a, b: decode_moe._unfused(x, w, dispatch, a, b))
    args = (x, routing.weights, w_fc1, w_fc2)
    got = jax.jit(jax.grad(fused, argnums=(0, 1, 2, 3)))(*args)
    want = jax.jit(jax.grad(unfused, argnums=(0, 1, 2, 3)))(*args)
    for g, w in zip(got, want):
        assert rel_error(g, w) < 1e-5


def test_fused_rejects_mismatched_operands(rng):
    x, w_fc1, w_fc2, logits = make(rng, 2, 8, 64, 32, jnp.float32, 2, "random")
    routing, dispatch = route(logits, 2, renormalize=True)
    with pytest.raises(TypeError, match="share a dtype"):
        decode_moe.fused_experts(x.astype(jnp.bfloat16), routing, dispatch, w_fc1, w_fc2)
    with pytest.raises(ValueError, match=r"need w_fc1 \[E,H,2F\]"):
        decode_moe.fused_experts(x, routing, dispatch, w_fc1[:, :, :-2], w_fc2)
    with pytest.raises(ValueError, match="routing's 2 tokens"):
        decode_moe.fused_experts(x[:1], routing, dispatch, w_fc1, w_fc2)


def test_can_fuse_only_in_device_mode_at_decode_sizes(rng):
    _, w_fc1, w_fc2, _ = make(rng, 1, 64, 256, 176, jnp.bfloat16, 6, "random")
    assert decode_moe.can_fuse(8, 6, w_fc1, w_fc2, mode="device", activation="swiglu")
    assert not decode_moe.can_fuse(8, 6, w_fc1, w_fc2, mode="async", activation="swiglu")
    assert not decode_moe.can_fuse(8, 6, w_fc1, w_fc2, mode="device", activation="gelu")
    assert not decode_moe.can_fuse(4096, 6, w_fc1, w_fc2, mode="device", activation="swiglu")
    assert decode_moe.fuses(1, 6, w_fc1, w_fc2, mode="device", activation="swiglu")  # the default: one token
    assert not decode_moe.fuses(8, 6, w_fc1, w_fc2, mode="device", activation="swiglu")


@pytest.mark.parametrize("dtype, target", [(jnp.bfloat16, "te_async_token_moe"), (jnp.float32, "te_async_expert_gemm")])
def test_moe_block_fused_matches_unfused(rng, dtype, target):
    """At one token moe_block runs te_async.token_moe where it applies (16-bit: the routing is
    inside it) and the routing kernel with the fused expert GEMMs elsewhere (f32); both match the
    unfused path."""
    tokens = 1
    experts, hidden, ffn, top_k = 64, 128, 96, 6
    x, w_fc1, w_fc2, _ = make(rng, tokens, experts, hidden, ffn, dtype, top_k, "random")
    router = jnp.asarray(rng.standard_normal((hidden, experts)) / np.sqrt(hidden), dtype)
    scale = jnp.asarray(1 + 0.1 * rng.standard_normal(hidden), dtype)
    block = jax.jit(lambda x, fuse: moe_block(x, router, w_fc1, w_fc2, top_k=top_k, norm_scale=scale,
                                              group_sizes_mode="device", fuse=fuse), static_argnums=1)
    hlo = jax.jit(lambda x: moe_block(x, router, w_fc1, w_fc2, top_k=top_k, norm_scale=scale,
                                      group_sizes_mode="device")).lower(x).as_text()
    assert target in hlo and ("te_async_route" in hlo) == (dtype == jnp.float32)
    assert rel_error(block(x, True), block(x, False)) < TOL[dtype]
