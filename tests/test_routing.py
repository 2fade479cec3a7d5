"""te_async.routing: the plain-JAX routing against a float64 NumPy reference (every backend), and
the CUDA routing kernel against the plain-JAX routing (GPU), on random logits, exact ties and
adversarial routings, in every top-k variant the models use: softmax scoring (Mixtral, Qwen,
DeepSeek-V2) and DeepSeek-V3's sigmoid scoring with and without its correction bias."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from te_async import _ffi
from te_async.routing import ROUTE, Dispatch, plan_dispatch, route, route_reference

# (experts, top_k, renormalize, scaling, n_group, topk_group): Mixtral, Qwen3, DeepSeek-V2-Lite,
# DeepSeek-V2's group-limited top-k, the kernel's largest expert count, and odd sizes.
VARIANTS = [
    (8, 2, True, 1.0, 1, 1),
    (128, 8, True, 1.0, 1, 1),
    (64, 6, False, 1.0, 1, 1),
    (160, 6, False, 16.0, 8, 3),
    (256, 8, True, 2.5, 8, 4),
    (60, 4, False, 1.0, 1, 1),
    (7, 7, True, 1.0, 1, 1),
    (33, 1, False, 0.5, 3, 2),
]


# DeepSeek-V3 (and Kimi-K2's 384 experts), Moonlight (DeepSeek-V3's router, one group), odd sizes.
SIGMOID_VARIANTS = [
    (256, 8, True, 2.5, 8, 4),
    (384, 8, True, 2.827, 1, 1),
    (64, 6, True, 2.446, 1, 1),
    (33, 3, False, 0.5, 3, 2),
]


# The kernel's cases: VARIANTS, and small awkward groups for sigmoid's group rule (3 groups of 4;
# 8 groups of 2, where a group's score is the sum of the whole group).
KERNEL_VARIANTS = VARIANTS + [(12, 4, True, 1.0, 3, 2), (16, 4, False, 1.0, 8, 3)]

# route()'s scorings as the kernel tests take them: sigmoid without and with a correction bias.
KERNEL_SCORINGS = ["softmax", "sigmoid", "sigmoid_bias"]


def scoring_kwargs(rng, scoring, experts):
    """route()'s scoring arguments; sigmoid_bias draws a random [E] correction bias."""
    if scoring == "softmax":
        return {}
    bias = jnp.asarray(0.1 * rng.standard_normal(experts), jnp.float32) if scoring == "sigmoid_bias" else None
    return dict(scoring="sigmoid", correction_bias=bias)


def numpy_routing(logits, top_k, renormalize, scaling, n_group, topk_group, scoring="softmax", bias=None):
    """float64, one token at a time; ties go to the lower index (a stable sort on -value). Sigmoid:
    DeepSeek-V3's choice by score + bias, groups ranked by the sum of their two best, weights the
    unbiased scores."""
    logits = np.asarray(logits, np.float64)
    t, e = logits.shape
    weights, experts = np.zeros((t, top_k)), np.zeros((t, top_k), np.int64)
    for i in range(t):
        if scoring == "softmax":
            p = np.exp(logits[i] - logits[i].max())
            p /= p.sum()
            choice = p
        else:
            p = 1 / (1 + np.exp(-logits[i]))
            choice = p + (0 if bias is None else np.asarray(bias, np.float64))
        if n_group > 1:
            groups = choice.reshape(n_group, -1)
            best = groups.max(axis=1) if scoring == "softmax" else np.sort(groups, axis=1)[:, -2:].sum(axis=1)
            kept = np.argsort(-best, kind="stable")[:topk_group]
            mask = np.zeros(n_group, bool)
            mask[kept] = True
            choice = np.where(np.repeat(mask, e // n_group), choice, 0.0 if scoring == "softmax" else -np.inf)
        experts[i] = np.argsort(-choice, kind="stable")[:top_k]
        weights[i] = p[experts[i]]
        if renormalize:
            weights[i] /= weights[i].sum()
    return weights * scaling, experts


def check_dispatch(dispatch: Dispatch, experts, num_experts):
    """The dispatch is the stable sort of the flat (token, choice) pairs by expert."""
    flat = np.asarray(experts).reshape(-1)
    order = np.argsort(flat, kind="stable")
    np.testing.assert_array_equal(dispatch.choice_of_row, order)
    np.testing.assert_array_equal(dispatch.token_of_row, order // experts.shape[1])
    np.testing.assert_array_equal(np.asarray(dispatch.row_of_choice)[order], np.arange(flat.size))
    np.testing.assert_array_equal(dispatch.group_sizes, np.bincount(flat, minlength=num_experts))


def random_logits(rng, tokens, experts, kind):
    if kind == "random":
        return rng.standard_normal((tokens, experts)).astype(np.float32)
    if kind == "ties":  # a few distinct values, so most scores tie exactly
        return rng.integers(0, 3, (tokens, experts)).astype(np.float32)
    if kind == "all_equal":
        return np.zeros((tokens, experts), np.float32)
    if kind == "one_expert":  # every token's best is the same expert
        x = rng.standard_normal((tokens, experts)).astype(np.float32)
        x[:, experts // 2] += 30.0
        return x
    raise ValueError(kind)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("kind", ["random", "ties", "all_equal", "one_expert"])
def test_reference_matches_numpy(rng, variant, kind):
    experts, top_k, renormalize, scaling, n_group, topk_group = variant
    logits = random_logits(rng, 13, experts, kind)
    routing = route_reference(jnp.asarray(logits), top_k, renormalize=renormalize, scaling=scaling, n_group=n_group,
                              topk_group=topk_group)
    w_ref, e_ref = numpy_routing(logits, top_k, renormalize, scaling, n_group, topk_group)
    # Random scores have no near ties, and exact ties in the inputs stay exact in float32 and in
    # float64: the same experts either way.
    np.testing.assert_array_equal(routing.experts, e_ref)
    np.testing.assert_allclose(routing.weights, w_ref, rtol=2e-6, atol=1e-7)
    check_dispatch(plan_dispatch(routing.experts, experts), np.asarray(routing.experts), experts)


@pytest.mark.parametrize("variant", SIGMOID_VARIANTS)
@pytest.mark.parametrize("kind", ["random", "ties", "all_equal", "one_expert"])
def test_sigmoid_reference_matches_numpy(rng, variant, kind):
    """With a correction bias on random scores (no near ties in either precision), without one on
    the tied ones (exact ties stay exact)."""
    experts, top_k, renormalize, scaling, n_group, topk_group = variant
    logits = random_logits(rng, 13, experts, kind)
    bias = (0.1 * rng.standard_normal(experts)).astype(np.float32) if kind in ("random", "one_expert") else None
    routing, dispatch = route(jnp.asarray(logits), top_k, renormalize=renormalize, scaling=scaling, n_group=n_group,
                              topk_group=topk_group, scoring="sigmoid",
                              correction_bias=None if bias is None else jnp.asarray(bias))
    w_ref, e_ref = numpy_routing(logits, top_k, renormalize, scaling, n_group, topk_group, "sigmoid", bias)
    np.testing.assert_array_equal(routing.experts, e_ref)
    np.testing.assert_allclose(routing.weights, w_ref, rtol=2e-6, atol=1e-7)
    check_dispatch(dispatch, np.asarray(routing.experts), experts)


def test_sigmoid_bias_chooses_and_does_not_weigh(rng):
    """The bias moves the choice (a large bias on expert 3 puts it in every token's top-k) but not
    the weight: expert 3's weight is its plain sigmoid score."""
    logits = random_logits(rng, 5, 16, "random")
    bias = np.zeros(16, np.float32)
    bias[3] = 5.0
    routing, _ = route(jnp.asarray(logits), 4, renormalize=False, scoring="sigmoid", correction_bias=jnp.asarray(bias))
    chosen = np.asarray(routing.experts)
    assert (chosen[:, 0] == 3).all()
    np.testing.assert_allclose(np.asarray(routing.weights)[:, 0], 1 / (1 + np.exp(-logits[:, 3])), rtol=1e-6)


def test_sigmoid_gradient_flows_through_the_weights(rng):
    """d(sum of weights)/d(logits) is the chosen experts' sigmoid derivative, zero elsewhere; the
    correction bias gets none."""
    logits = jnp.asarray(random_logits(rng, 3, 12, "random"))
    bias = jnp.asarray(0.1 * rng.standard_normal(12), jnp.float32)
    f = lambda l, b: route(l, 2, renormalize=False, scoring="sigmoid", correction_bias=b)[0].weights.sum()
    grad, grad_bias = map(np.asarray, jax.grad(f, argnums=(0, 1))(logits, bias))
    np.testing.assert_array_equal(grad_bias, np.zeros(12))
    chosen = np.asarray(route(logits, 2, renormalize=False, scoring="sigmoid", correction_bias=bias)[0].experts)
    s = 1 / (1 + np.exp(-np.asarray(logits, np.float64)))
    want = np.zeros_like(s)
    np.put_along_axis(want, chosen, np.take_along_axis(s * (1 - s), chosen, axis=1), axis=1)
    np.testing.assert_allclose(grad, want, rtol=1e-5, atol=1e-7)


def test_route_xla_is_the_reference(rng):
    logits = jnp.asarray(random_logits(rng, 9, 64, "random"))
    routing, dispatch = route(logits, 6, renormalize=False, kernel="xla")
    ref = route_reference(logits, 6, renormalize=False)
    np.testing.assert_array_equal(routing.experts, ref.experts)
    np.testing.assert_array_equal(routing.weights, ref.weights)
    check_dispatch(dispatch, np.asarray(ref.experts), 64)


@pytest.mark.parametrize("kwargs, message", [
    (dict(top_k=0), "top_k must be in"),
    (dict(top_k=65), "top_k must be in"),
    (dict(n_group=5), "n_group must divide"),
    (dict(n_group=8, topk_group=9), "topk_group"),
    (dict(n_group=8, topk_group=1, top_k=9), "hold fewer than top_k"),
    (dict(kernel="cuda"), "kernel must be one of"),
    (dict(scoring="tanh"), "scoring must be one of"),
    (dict(correction_bias=jnp.zeros(64)), "correction_bias must be"),
    (dict(scoring="sigmoid", correction_bias=jnp.zeros(63)), "correction_bias must be"),
    (dict(scoring="sigmoid", n_group=64, topk_group=2), "two best experts"),
])
def test_route_rejects_bad_arguments(kwargs, message):
    args = dict(top_k=2, renormalize=True) | kwargs
    with pytest.raises(ValueError, match=message):
        route(jnp.zeros((4, 64), jnp.float32), **args)


def test_route_rejects_non_matrix_logits():
    with pytest.raises(ValueError, match=r"\[T, E\]"):
        route(jnp.zeros((4, 2, 64)), 2, renormalize=True)


@pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
def test_kernel_needs_a_gpu_and_decode_sizes(scoring):
    limit = _ffi.cuda_module().ROUTE_MAX_EXPERTS if _ffi.gpu_present() else 8
    with pytest.raises(ValueError, match="kernel='te_async' needs"):
        route(jnp.zeros((2, limit + 8), jnp.float32), 2, renormalize=True, scoring=scoring, kernel="te_async")


@pytest.mark.parametrize("kernel", ["xla", pytest.param("te_async", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("bias", [None, -2.0])
def test_sigmoid_groups_by_their_two_best_and_never_picks_a_dropped_one(kernel, bias):
    """Group 0 holds the logits 2, 2 and group 1 2.5, 0: by the sum of their two best sigmoid
    scores (a best held twice counts twice) group 0 is kept, though group 1 holds the best expert;
    by the best alone, or by two distinct values, group 1 would be. With a bias of -2 on every
    expert the kept choice values are negative, and the dropped group's experts must still lose
    (masked to -inf, not to 0)."""
    logits = jnp.asarray([[2.0, 2.0, -5.0, -5.0, 2.5, 0.0, -5.0, -5.0]], jnp.float32)
    correction_bias = None if bias is None else jnp.full((8,), bias, jnp.float32)
    routing, dispatch = route(logits, 2, renormalize=False, n_group=2, topk_group=1, scoring="sigmoid",
                              correction_bias=correction_bias, kernel=kernel)
    np.testing.assert_array_equal(routing.experts, [[0, 1]])
    np.testing.assert_allclose(routing.weights, np.full((1, 2), 1 / (1 + np.exp(-2.0))), rtol=1e-6)
    np.testing.assert_array_equal(dispatch.group_sizes, [1, 1, 0, 0, 0, 0, 0, 0])


@pytest.mark.gpu
@pytest.mark.parametrize("variant", KERNEL_VARIANTS)
@pytest.mark.parametrize("kind", ["random", "ties", "all_equal", "one_expert"])
@pytest.mark.parametrize("tokens", [1, 3, 8, 64, 257])
@pytest.mark.parametrize("scoring", KERNEL_SCORINGS)
def test_kernel_matches_reference(rng, variant, kind, tokens, scoring):
    experts, top_k, renormalize, scaling, n_group, topk_group = variant
    logits = jnp.asarray(random_logits(rng, tokens, experts, kind))
    kw = dict(renormalize=renormalize, scaling=scaling, n_group=n_group, topk_group=topk_group,
              **scoring_kwargs(rng, scoring, experts))
    run = jax.jit(lambda l: route(l, top_k, kernel="te_async", **kw))
    routing, dispatch = run(logits)
    ref, ref_dispatch = route(logits, top_k, kernel="xla", **kw)
    np.testing.assert_array_equal(routing.experts, ref.experts)
    np.testing.assert_allclose(routing.weights, ref.weights, rtol=2e-6, atol=1e-7)
    for got, want in zip(dispatch, ref_dispatch):
        np.testing.assert_array_equal(got, want)
    again = run(logits)  # deterministic: bit-identical on a second run
    for a, b in zip(jax.tree.leaves(again), jax.tree.leaves((routing, dispatch))):
        np.testing.assert_array_equal(a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("scoring, n_group, topk_group", [("softmax", 1, 1), ("sigmoid_bias", 8, 4)])
def test_kernel_at_its_limits(rng, scoring, n_group, topk_group):
    """The most experts and choices, for sigmoid in DeepSeek-V3's groups."""
    module = _ffi.cuda_module()
    experts, top_k = module.ROUTE_MAX_EXPERTS, 8
    tokens = module.ROUTE_MAX_CHOICES // top_k
    logits = jnp.asarray(random_logits(rng, tokens, experts, "random"))
    kw = dict(renormalize=True, n_group=n_group, topk_group=topk_group, **scoring_kwargs(rng, scoring, experts))
    routing, dispatch = jax.jit(lambda l: route(l, top_k, kernel="te_async", **kw))(logits)
    ref, _ = route(logits, top_k, kernel="xla", **kw)
    np.testing.assert_array_equal(routing.experts, ref.experts)
    np.testing.assert_allclose(routing.weights, ref.weights, rtol=2e-6, atol=1e-7)
    check_dispatch(dispatch, np.asarray(ref.experts), experts)
    with pytest.raises(ValueError, match="kernel='te_async' needs"):
        route(jnp.zeros((tokens + 1, experts), jnp.float32), top_k, kernel="te_async", **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", [VARIANTS[2], VARIANTS[3], VARIANTS[4]])
@pytest.mark.parametrize("scoring", KERNEL_SCORINGS)
def test_kernel_gradient_matches_reference(rng, variant, scoring):
    """The gradient to the logits; the correction bias gets none on either path."""
    experts, top_k, renormalize, scaling, n_group, topk_group = variant
    logits = jnp.asarray(random_logits(rng, 5, experts, "random"))
    probe = jnp.asarray(rng.standard_normal((5, top_k)), jnp.float32)
    kw = dict(renormalize=renormalize, scaling=scaling, n_group=n_group, topk_group=topk_group,
              **scoring_kwargs(rng, scoring, experts))
    bias = kw.pop("correction_bias", None)

    def grads(kernel):  # to the logits and the bias (None without one)
        loss = lambda l, b: jnp.sum(route(l, top_k, kernel=kernel, correction_bias=b, **kw)[0].weights * probe)
        return jax.jit(jax.grad(loss, argnums=(0, 1)))(logits, bias)

    (got, got_bias), (want, want_bias) = grads("te_async"), grads("xla")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    if bias is not None:
        np.testing.assert_array_equal(got_bias, np.zeros(experts))
        np.testing.assert_array_equal(want_bias, np.zeros(experts))


@pytest.mark.gpu
@pytest.mark.parametrize("bias_shape, sigmoid, n_group, message", [
    ((31,), True, 1, r"correction bias must be \[E\] or \[0\]"),
    ((1, 32), True, 1, r"correction bias must be \[E\] or \[0\]"),
    ((32,), False, 1, "a correction bias needs sigmoid scoring"),
    ((0,), True, 32, "two best experts: n_group 32 leaves 1 expert per group"),
])
def test_kernel_rejects_bad_bias_and_groups(bias_shape, sigmoid, n_group, message):
    """The handler's own checks, past route()'s: the FFI call made directly, on 32 experts."""
    t, e, k = 4, 32, 2
    i32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32)
    call = jax.ffi.ffi_call(ROUTE, (jax.ShapeDtypeStruct((t, k), jnp.float32), i32(t, k), i32(e), i32(t * k),
                                    i32(t * k)))
    with pytest.raises(jax.errors.JaxRuntimeError, match=message):
        jax.block_until_ready(call(jnp.zeros((t, e), jnp.float32), jnp.zeros(bias_shape, jnp.float32), top_k=k,
                                   n_group=n_group, topk_group=1, renormalize=True, scaling=np.float32(1.0),
                                   sigmoid=sigmoid))
