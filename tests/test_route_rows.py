"""te_async.route_rows: a decode MoE block's norm, router GEMM, routing and row gather in one call,
against a float64 reference written here (CPU: the JAX reference path; GPU: the kernel, with
poisoned outputs in gpu_check.sh's runs): both norm roundings, a router on x or on norm(x), plain,
renormalised and group-limited top-k, DeepSeek's scaling, float32 routers and scales, 1 to 16
tokens, adversarial routings (ties, every token to one expert, every choice a distinct expert);
its gradients; moe_block's use of it; the errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from te_async import route_rows
from te_async.moe import moe_block
from te_async.token_moe import Norm, Router

from reference import rel_error
from test_routing import check_dispatch, numpy_routing
from test_token_ffn import TOL

ULP = {jnp.bfloat16: 2.0**-7, jnp.float16: 2.0**-10}  # the largest relative spacing of x's dtype


def make(rng, *, tokens, hidden, experts, top_k, n_group=1, topk_group=1, renormalize=True, scaling=1.0,
         round_first=True, reads_normed=True, scale_f32=False, router_f32=False, dtype=jnp.bfloat16):
    normal = lambda *shape: rng.standard_normal(shape)
    x = jnp.asarray(3 * normal(tokens, hidden), dtype)  # not unit RMS: the norm must act
    norm = Norm(jnp.asarray(1 + 0.3 * normal(hidden), jnp.float32 if scale_f32 else dtype), 1e-6, round_first)
    # Router logits of a few units, so that the top-k is decided well above rounding.
    weight = jnp.asarray(4 * normal(hidden, experts) / np.sqrt(hidden), jnp.float32 if router_f32 else dtype)
    return x, norm, Router(weight, top_k, renormalize, scaling, n_group, topk_group, reads_normed)


def reference64(x, norm, router):
    """(norm(x) [T, H] in float64 with x's roundings, experts, weights, the weights' rtol): the
    weights' bound is test_token_moe.reference's (float32 logits' rounding)."""
    f64 = lambda a: np.asarray(jnp.asarray(a, jnp.float64))
    rounded = lambda v: f64(jnp.asarray(v, jnp.float64).astype(x.dtype))
    xf, scale = f64(x), f64(norm.scale)
    y = xf / np.sqrt(np.mean(xf * xf, axis=1, keepdims=True) + norm.eps)
    xn = rounded(rounded(y) * rounded(scale)) if norm.round_first else rounded(y * scale)
    router_in, w = (xn if router.reads_normed else xf), f64(router.weight)
    weights, experts = numpy_routing(router_in @ w, router.top_k, router.renormalize, router.scaling, router.n_group,
                                     router.topk_group)
    rtol = np.finfo(np.float32).eps * np.sqrt(xf.shape[1]) * np.max(np.abs(router_in) @ np.abs(w))
    return xn, experts, weights, rtol


def run(x, norm, router, device=None):
    fn = jax.jit(lambda x, scale, weight: route_rows.route_rows(x, norm._replace(scale=scale),
                                                                router._replace(weight=weight)))
    arrays = (x, norm.scale, router.weight)
    if device is not None:
        arrays = jax.device_put(arrays, device)
    return fn(*arrays), fn.lower(*arrays).as_text()


def check(got, want, dtype, weights_rtol=None):
    rows, routing, dispatch = got
    xn, experts, weights, rounding = want
    assert rows.dtype == dtype and rows.shape == (experts.size, xn.shape[1])
    np.testing.assert_array_equal(np.asarray(routing.experts), experts)
    np.testing.assert_allclose(np.asarray(routing.weights), weights, rtol=rounding if weights_rtol is None else weights_rtol)
    check_dispatch(dispatch, experts, int(dispatch.group_sizes.shape[0]))
    # Each row is its token's norm(x), within two ulps of x's dtype: the kernel's sum of squares and
    # rsqrtf may move a value across a rounding boundary, and transformers' rounding (round_first)
    # multiplies that ulp by the scale before rounding again (seen: 8 of 65536 values 2 ulps off, f16).
    want_rows = xn[np.asarray(dispatch.token_of_row)]
    np.testing.assert_allclose(np.asarray(rows, np.float64), want_rows, rtol=2 * ULP[dtype], atol=0)


# DeepSeek-like (group-limited top-k, scaling, a float32 router), Qwen3-like (128 experts, top-8),
# Mixtral-like (8 experts, top-2, H 4096), moe_block's conventions (router on x, the scale in
# float32), one token, and the most logits the kernel holds.
CASES = [
    dict(tokens=8, hidden=2048, experts=64, top_k=6, n_group=8, topk_group=3, renormalize=False, scaling=16.0,
         router_f32=True),
    dict(tokens=16, hidden=512, experts=128, top_k=8),
    dict(tokens=5, hidden=4096, experts=8, top_k=2),
    dict(tokens=3, hidden=256, experts=32, top_k=4, round_first=False, reads_normed=False, scale_f32=True),
    dict(tokens=1, hidden=64, experts=16, top_k=3, router_f32=True),
    dict(tokens=8, hidden=1024, experts=256, top_k=8, n_group=8, topk_group=4, router_f32=True),
]


def case_id(c):
    return "-".join(f"{k}{v}" for k, v in c.items())


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_reference_path_against_float64(rng, case):
    """Off the GPU route_rows runs its JAX reference: the same math as the float64 reference."""
    args = make(rng, **case)
    got, _ = run(*args, device=jax.devices("cpu")[0])
    check(got, reference64(*args), jnp.bfloat16)


def marked(x, norm, router, lead):
    """x's last len(lead) columns made markers (64 on the diagonal, 0 elsewhere; scale 1), and the
    router's rows there adding about 45 to token t's logits of experts lead[t] (one list for every
    token where len(lead) is 1), so that they lead beyond doubt but the other experts' softmax
    weights stay above float32's underflow (a marker of 64 read raw, times 3, left them all 0,
    tied in index order)."""
    t, h = x.shape
    n = len(lead)
    xf = np.asarray(x, np.float64)
    xf[:, h - n:] = 64 * np.eye(t, n) if n > 1 else 64
    w = np.asarray(router.weight, np.float64)
    w[h - n:] = 0
    for i, experts in enumerate(lead):
        w[h - n + i, experts] = 3 if router.reads_normed else 0.7  # the normalised marker is about 15
    scale = norm.scale.at[h - n:].set(1)
    return (jnp.asarray(xf, x.dtype), norm._replace(scale=scale),
            router._replace(weight=jnp.asarray(w, router.weight.dtype)))


def tied(rng, dtype=jnp.bfloat16):
    """Experts 2, 5 and 9 (in two groups) have identical router columns and lead for every token:
    their logits tie exactly, and the top-k must take them in index order."""
    x, norm, router = make(rng, tokens=6, hidden=512, experts=64, top_k=6, n_group=8, topk_group=3,
                           renormalize=False, router_f32=True, dtype=dtype)
    weight = router.weight.at[:, 5].set(router.weight[:, 2]).at[:, 9].set(router.weight[:, 2])
    return marked(x, norm, router._replace(weight=weight), [[2, 5, 9]])


def test_reference_path_breaks_ties_by_index(rng):
    args = tied(rng)
    want = reference64(*args)
    assert all(list(e[:3]) == [2, 5, 9] for e in want[1])
    got, _ = run(*args, device=jax.devices("cpu")[0])
    check(got, want, jnp.bfloat16)


def test_errors(rng):
    x, norm, router = make(rng, tokens=4, hidden=64, experts=8, top_k=2)
    with pytest.raises(ValueError, match=r"\[H, E\]"):
        route_rows.route_rows(x, norm, router._replace(weight=router.weight[1:]))
    with pytest.raises(ValueError, match=r"x \[T, H\]"):
        route_rows.route_rows(x[0], norm, router)
    assert not route_rows.applies(x.astype(jnp.float32), norm, router)


# ---- GPU ------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_kernel_against_float64(rng, case, dtype):
    args = make(rng, **case, dtype=dtype)
    assert route_rows.applies(*args)
    got, hlo = run(*args)
    assert route_rows.ROUTE_ROWS in hlo
    # The kernel's rsqrtf and sums may move the normalised x by an ulp here and there, and the
    # router's logits with it (about 1e-3 of a weight): looser than the reference path's bound.
    check(got, reference64(*args), dtype, weights_rtol=5e-3)
    again, _ = run(*args)  # deterministic: bit-identical
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(again)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("kind", ["ties", "one_expert", "distinct"])
def test_kernel_adversarial_routings(rng, dtype, kind):
    """Ties in index order; every token to one expert (a group of 16 rows); every choice a distinct
    expert (16 tokens x top-8 over 128 experts: every group one row)."""
    if kind == "ties":
        args = tied(rng, dtype)
    elif kind == "one_expert":
        args = marked(*make(rng, tokens=16, hidden=1024, experts=64, top_k=4, reads_normed=False, dtype=dtype), [[3]])
    else:
        args = marked(*make(rng, tokens=16, hidden=512, experts=128, top_k=8, dtype=dtype),
                      [list(range(8 * t, 8 * t + 8)) for t in range(16)])
    want = reference64(*args)
    got, _ = run(*args)
    check(got, want, dtype, weights_rtol=5e-3)
    sizes = np.asarray(got[2].group_sizes)
    if kind == "ties":
        assert all(list(e[:3]) == [2, 5, 9] for e in np.asarray(got[1].experts))
    if kind == "one_expert":
        assert sizes[3] == 16
    if kind == "distinct":
        assert np.all(sizes == 1)


def gradients(rng, device=None):
    """Gradients of a loss of route_rows' rows and weights to x, the norm scale and the router,
    through route_rows and through the plain JAX reference."""
    x, norm, router = make(rng, tokens=8, hidden=512, experts=64, top_k=6, round_first=False, reads_normed=False,
                           scale_f32=True, router_f32=True)
    rows_ct = jnp.asarray(rng.standard_normal((48, 512)), jnp.bfloat16)
    weights_ct = jnp.asarray(rng.standard_normal((8, 6)), jnp.float32)

    def loss(fn, x, scale, weight):
        rows, routing, _ = fn(x, norm._replace(scale=scale), router._replace(weight=weight))
        return jnp.sum(rows.astype(jnp.float32) * rows_ct) + jnp.sum(routing.weights * weights_ct)

    arrays = (x, norm.scale, router.weight) if device is None else jax.device_put((x, norm.scale, router.weight), device)
    return [jax.jit(jax.grad(lambda *a, f=f: loss(f, *a), argnums=(0, 1, 2)))(*arrays)
            for f in (route_rows.route_rows, route_rows.reference)]


def test_reference_path_gradients(rng):
    """route_rows' own backward (for the routing its forward chose) is JAX's derivative of the reference."""
    got, want = gradients(rng, jax.devices("cpu")[0])
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-6 * float(np.max(np.abs(w))))


@pytest.mark.gpu
def test_kernel_gradients_match_reference(rng):
    """The gradients flow through the kernel's routing as through the reference's (the same choices)."""
    for got, want in zip(*gradients(rng)):
        assert rel_error(got, want) < 2e-2


@pytest.mark.gpu
def test_moe_block_takes_route_rows(rng):
    """At 2 to 16 tokens in device mode moe_block's norm, router GEMM, routing and row gather are one
    route_rows call (no routing kernel, no XLA router GEMM), equal within rounding to its unfused path."""
    x, norm, router = make(rng, tokens=8, hidden=256, experts=64, top_k=6, round_first=False, reads_normed=False,
                           scale_f32=True)
    w_fc1 = jnp.asarray(rng.standard_normal((64, 256, 192)) / 16, jnp.bfloat16)
    w_fc2 = jnp.asarray(rng.standard_normal((64, 96, 256)) / np.sqrt(96), jnp.bfloat16)
    block = lambda x, fuse: moe_block(x, router.weight, w_fc1, w_fc2, top_k=6, norm_scale=norm.scale,
                                      group_sizes_mode="device", fuse=fuse, residual=True)
    hlo = jax.jit(lambda x: block(x, True)).lower(x).as_text()
    assert hlo.count(route_rows.ROUTE_ROWS) == 1 and "@te_async_route(" not in hlo
    fused, unfused = (np.asarray(jax.jit(lambda x, f=f: block(x, f))(x), np.float32) for f in (True, False))
    x32 = np.asarray(x, np.float32)
    assert rel_error(fused - x32, unfused - x32) < TOL[jnp.bfloat16]


@pytest.mark.gpu
def test_kernel_errors(rng):
    """What applies() keeps away from the kernel, the kernel rejects with a message."""
    x, norm, router = make(rng, tokens=4, hidden=96, experts=8, top_k=2)
    assert not route_rows.applies(x, norm, router)
    with pytest.raises(Exception, match="H must be a multiple of 64"):
        jax.block_until_ready(jax.jit(lambda x: route_rows._kernel(x, norm.scale, router.weight,
                                                                   route_rows._static(norm, router)))(x))
    x, norm, router = make(rng, tokens=17, hidden=64, experts=8, top_k=2)
    assert not route_rows.applies(x, norm, router)
