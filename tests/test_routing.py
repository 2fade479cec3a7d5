"""te_async.routing: the plain-JAX routing against a float64 NumPy reference (every backend), and
the CUDA routing kernel against the plain-JAX routing (GPU), on random logits, exact ties and
adversarial routings, in every top-k variant the models use."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from te_async import _ffi
from te_async.routing import Dispatch, plan_dispatch, route, route_reference

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


def numpy_routing(logits, top_k, renormalize, scaling, n_group, topk_group):
    """float64, one token at a time; ties go to the lower index (a stable sort on -value)."""
    logits = np.asarray(logits, np.float64)
    t, e = logits.shape
    weights, experts = np.zeros((t, top_k)), np.zeros((t, top_k), np.int64)
    for i in range(t):
        p = np.exp(logits[i] - logits[i].max())
        p /= p.sum()
        if n_group > 1:
            best = p.reshape(n_group, -1).max(axis=1)
            kept = np.argsort(-best, kind="stable")[:topk_group]
            mask = np.zeros(n_group, bool)
            mask[kept] = True
            p = np.where(np.repeat(mask, e // n_group), p, 0.0)
        experts[i] = np.argsort(-p, kind="stable")[:top_k]
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
])
def test_route_rejects_bad_arguments(kwargs, message):
    args = dict(top_k=2, renormalize=True) | kwargs
    with pytest.raises(ValueError, match=message):
        route(jnp.zeros((4, 64), jnp.float32), **args)


def test_route_rejects_non_matrix_logits():
    with pytest.raises(ValueError, match=r"\[T, E\]"):
        route(jnp.zeros((4, 2, 64)), 2, renormalize=True)


def test_kernel_needs_a_gpu_and_decode_sizes():
    limit = _ffi.cuda_module().ROUTE_MAX_EXPERTS if _ffi.gpu_present() else 8
    with pytest.raises(ValueError, match="kernel='te_async' needs"):
        route(jnp.zeros((2, limit + 8), jnp.float32), 2, renormalize=True, kernel="te_async")


@pytest.mark.gpu
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("kind", ["random", "ties", "all_equal", "one_expert"])
@pytest.mark.parametrize("tokens", [1, 3, 8, 64, 257])
def test_kernel_matches_reference(rng, variant, kind, tokens):
    experts, top_k, renormalize, scaling, n_group, topk_group = variant
    logits = jnp.asarray(random_logits(rng, tokens, experts, kind))
    kw = dict(renormalize=renormalize, scaling=scaling, n_group=n_group, topk_group=topk_group)
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
def test_kernel_at_its_limits(rng):
    module = _ffi.cuda_module()
    experts, top_k = module.ROUTE_MAX_EXPERTS, 8
    tokens = module.ROUTE_MAX_CHOICES // top_k
    logits = jnp.asarray(random_logits(rng, tokens, experts, "random"))
    routing, dispatch = jax.jit(lambda l: route(l, top_k, renormalize=True, kernel="te_async"))(logits)
    ref, _ = route(logits, top_k, renormalize=True, kernel="xla")
    np.testing.assert_array_equal(routing.experts, ref.experts)
    check_dispatch(dispatch, np.asarray(ref.experts), experts)
    with pytest.raises(ValueError, match="kernel='te_async' needs"):
        route(jnp.zeros((tokens + 1, experts), jnp.float32), top_k, renormalize=True, kernel="te_async")


@pytest.mark.gpu
@pytest.mark.parametrize("variant", [VARIANTS[2], VARIANTS[3], VARIANTS[4]])
def test_kernel_gradient_matches_reference(rng, variant):
    experts, top_k, renormalize, scaling, n_group, topk_group = variant
    logits = jnp.asarray(random_logits(rng, 5, experts, "random"))
    probe = jnp.asarray(rng.standard_normal((5, top_k)), jnp.float32)
    kw = dict(renormalize=renormalize, scaling=scaling, n_group=n_group, topk_group=topk_group)
    grad = lambda kernel: jax.jit(jax.grad(lambda l: jnp.sum(route(l, top_k, kernel=kernel, **kw)[0].weights * probe)))
    np.testing.assert_allclose(grad("te_async")(logits), grad("xla")(logits), rtol=1e-5, atol=1e-7)
