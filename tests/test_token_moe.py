"""te_async.token_moe: one token's MoE sub-layer (norm, router, top-k, routed and shared experts,
residual) in one call, against a float64 reference written here (CPU: the JAX reference path; GPU:
the two kernels, with poisoned outputs in gpu_check.sh's runs): both norm roundings, a router on
x or on norm(x), plain, renormalised and group-limited top-k, DeepSeek's scaling, shared experts,
sizes whose blocks leave tails, bf16 and f16; moe_block's and the models' use of it; the errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from te_async import token_ffn, token_moe
from te_async.moe import moe_block

from reference import rel_error
from test_routing import numpy_routing
from test_token_ffn import TOL, swiglu64


def rounded(v, dtype):
    return np.asarray(jnp.asarray(v, jnp.float64).astype(dtype).astype(jnp.float64))


def route64(logits, router):
    """One token's routing in float64 (test_routing's reference): (experts, weights)."""
    weights, experts = numpy_routing(logits[None], router.top_k, router.renormalize, router.scaling, router.n_group,
                                     router.topk_group)
    return experts[0], weights[0]


def reference(x, norm, router, w_fc1, w_fc2, shared, residual):
    """(y [1, H] in float64, experts, weights, the weights' rtol) of token_moe, from float64 math
    with the roundings the model makes: the normalised x, fc1's output and the activation in x's
    dtype. A weight's relative error is the absolute error of float32 logits, bounded by
    eps * sqrt(H) * sum |x_h w_he| (a random walk of the partial sums' roundings); seen at 0.13 of
    that over 60 seeds of every case."""
    f64 = lambda a: np.asarray(jnp.asarray(a, jnp.float64))
    xf, scale = f64(x)[0], f64(norm.scale)
    y = xf / np.sqrt(np.mean(xf * xf) + norm.eps)
    if norm.round_first:
        xn = rounded(rounded(y, x.dtype) * rounded(scale, x.dtype), x.dtype)
    else:
        xn = rounded(y * scale, x.dtype)
    router_in, router_w = (xn if router.reads_normed else xf), f64(router.weight)
    experts, weights = route64(router_in @ router_w, router)
    weights_rtol = np.finfo(np.float32).eps * np.sqrt(xf.size) * np.max(np.abs(router_in) @ np.abs(router_w))
    out = np.zeros_like(xf)
    for e, w in zip(experts, weights):
        out += w * swiglu64(xn, f64(w_fc1)[e], f64(w_fc2)[e], x.dtype)
    if shared is not None:
        out += swiglu64(xn, f64(shared.w_gate_up), f64(shared.w_down), x.dtype)
    if residual:
        out = xf + rounded(out, x.dtype)
    return out[None], experts, weights, weights_rtol


def make(rng, *, hidden, experts, ffn, top_k, shared_ffn=0, n_group=1, topk_group=1, renormalize=True, scaling=1.0,
         round_first=True, reads_normed=True, scale_f32=False, router_f32=False, dtype=jnp.bfloat16):
    normal = lambda *shape: rng.standard_normal(shape)
    x = jnp.asarray(3 * normal(1, hidden), dtype)  # not unit RMS: the norm must act
    norm = token_moe.Norm(jnp.asarray(1 + 0.3 * normal(hidden), jnp.float32 if scale_f32 else dtype), 1e-6,
                          round_first)
    # Router logits of a few units, so that the top-k is decided well above rounding.
    router_dtype = jnp.float32 if router_f32 else dtype  # the models keep routers in float32
    router = token_moe.Router(jnp.asarray(4 * normal(hidden, experts) / np.sqrt(hidden), router_dtype), top_k, renormalize,
                              scaling, n_group, topk_group, reads_normed)
    w_fc1 = jnp.asarray(normal(experts, hidden, 2 * ffn) / np.sqrt(hidden), dtype)
    w_fc2 = jnp.asarray(normal(experts, ffn, hidden) / np.sqrt(ffn), dtype)
    shared = None
    if shared_ffn:
        shared = token_ffn.Shared(jnp.asarray(normal(hidden, 2 * shared_ffn) / np.sqrt(hidden), dtype),
                                  jnp.asarray(normal(shared_ffn, hidden) / np.sqrt(shared_ffn), dtype))
    return x, norm, router, w_fc1, w_fc2, shared


# DeepSeek-like (group-limited top-k, scaling, shared experts), Qwen3-like (128 experts, top-8),
# Mixtral-like (8 experts, top-2, H past 2048), block tails and an H that is not a multiple of 256,
# moe_block's conventions (router on x, the norm's scale multiplied in float32), and a float32 router
# whose 16-byte vectors do not divide the block's threads and whose slice is longer than the rows the
# routing kernel loads before the norm.
CASES = [
    dict(hidden=256, experts=64, ffn=176, top_k=6, shared_ffn=352, n_group=8, topk_group=3, renormalize=False,
         scaling=16.0, router_f32=True),
    dict(hidden=512, experts=128, ffn=96, top_k=8),
    dict(hidden=4096, experts=8, ffn=64, top_k=2),
    dict(hidden=264, experts=16, ffn=1000, top_k=3, shared_ffn=24),
    dict(hidden=256, experts=32, ffn=64, top_k=4, round_first=False, reads_normed=False, scale_f32=True),
    dict(hidden=2056, experts=200, ffn=8, top_k=5, router_f32=True),
]


def case_id(c):
    return "-".join(f"{k}{v}" for k, v in c.items())


def run(args, residual=False, device=None):
    """token_moe jitted over the arrays of args (Norm and Router hold static numbers too)."""
    x, norm, router, w_fc1, w_fc2, shared = args
    fn = jax.jit(lambda x, scale, weight, w_fc1, w_fc2, shared: token_moe.token_moe(
        x, norm._replace(scale=scale), router._replace(weight=weight), w_fc1, w_fc2, shared, residual=residual))
    arrays = (x, norm.scale, router.weight, w_fc1, w_fc2, shared)
    if device is not None:
        arrays = jax.device_put(arrays, device)
    return fn(*arrays), fn.lower(*arrays).as_text()


def check(got, want, dtype, weights_rtol=None):
    """weights_rtol: the reference's float32 rounding bound where None."""
    y, routing = got
    y64, experts, weights, rounding = want
    weights_rtol = rounding if weights_rtol is None else weights_rtol
    assert y.shape == y64.shape and y.dtype == dtype
    assert np.array_equal(np.asarray(routing.experts)[0], experts)
    np.testing.assert_allclose(np.asarray(routing.weights)[0], weights, rtol=weights_rtol)
    assert rel_error(y, y64) < TOL[dtype]


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_reference_path_against_float64(rng, case):
    """Off the GPU token_moe runs its JAX reference: the same math as the float64 reference."""
    args = make(rng, **case)
    cpu = jax.devices("cpu")[0]
    got, _ = run(args, device=cpu)
    check(got, reference(*args, residual=False), jnp.bfloat16)
    (y, _), _ = run(args, residual=True, device=cpu)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(args[0] + got[0]))


def tied(rng, dtype=jnp.bfloat16):
    """A DeepSeek-like case (float32 router, group-limited top-k) whose router has three identical,
    leading columns (2, 5 and 9, in two groups): their logits tie exactly, and the top-k must take
    them in index order, as a stable sort does."""
    args = make(rng, hidden=256, experts=64, ffn=32, top_k=6, n_group=8, topk_group=3, renormalize=False,
                router_f32=True, dtype=dtype)
    x, norm, router, w_fc1, w_fc2, shared = args
    xf = np.asarray(x, np.float64)[0]
    # A logit near 20 for the three, where the others are a few units.
    col = jnp.asarray(xf * 20 / (xf.size * np.sqrt(np.mean(xf * xf))), jnp.float32)
    weight = router.weight.at[:, 2].set(col).at[:, 5].set(col).at[:, 9].set(col)
    return x, norm, router._replace(weight=weight), w_fc1, w_fc2, shared


def test_reference_path_breaks_ties_by_index(rng):
    args = tied(rng)
    got, _ = run(args, device=jax.devices("cpu")[0])
    want = reference(*args, residual=False)
    assert list(want[1][:3]) == [2, 5, 9]
    check(got, want, jnp.bfloat16)


def test_errors(rng):
    x, norm, router, w_fc1, w_fc2, shared = make(rng, hidden=64, experts=8, ffn=16, top_k=2, shared_ffn=16)
    with pytest.raises(ValueError, match="one token"):
        token_moe.token_moe(jnp.concatenate([x, x]), norm, router, w_fc1, w_fc2)
    with pytest.raises(ValueError, match="without a gate"):
        token_moe.token_moe(x, norm, router, w_fc1, w_fc2, shared._replace(scale=jnp.ones((1,), jnp.float32)))
    with pytest.raises(ValueError, match=r"norm scale must be \[H\]"):
        token_moe.token_moe(x, norm._replace(scale=norm.scale[:1]), router, w_fc1, w_fc2)
    with pytest.raises(ValueError, match=r"\[H, E\]"):
        token_moe.token_moe(x, norm, router._replace(weight=router.weight[1:]), w_fc1, w_fc2)
    with pytest.raises(ValueError, match="top_k"):
        token_moe.token_moe(x, norm, router._replace(top_k=9), w_fc1, w_fc2)
    with pytest.raises(ValueError, match="n_group must divide"):
        token_moe.token_moe(x, norm, router._replace(n_group=3), w_fc1, w_fc2)
    assert not token_moe.applies(x.astype(jnp.float32), norm, router, w_fc1, w_fc2)


def test_moe_block_residual(rng):
    """moe_block(residual=True) is x + moe_block(...) on every path (here the CPU's)."""
    x, norm, router, w_fc1, w_fc2, _ = make(rng, hidden=64, experts=8, ffn=16, top_k=2)
    block = lambda residual: jax.jit(lambda x: moe_block(x, router.weight, w_fc1, w_fc2, top_k=2, norm_scale=norm.scale,
                                                         group_sizes_mode="device", residual=residual))
    for rows in (x, jnp.concatenate([x, -x, 2 * x])):
        np.testing.assert_array_equal(np.asarray(block(True)(rows)), np.asarray(rows + block(False)(rows)))


# ---- GPU ------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_kernels_against_float64(rng, case, dtype):
    args = make(rng, **case, dtype=dtype)
    assert token_moe.applies(*args)
    got, hlo = run(args)
    assert token_moe.TOKEN_MOE in hlo
    # The kernel's rsqrtf may move the normalised x by an ulp of x's dtype here and there, and the
    # router's logits with it (about 1e-3 of a weight): looser than the reference path's 1e-5.
    check(got, reference(*args, residual=False), dtype, weights_rtol=5e-3)
    again, _ = run(args)  # deterministic: bit-identical
    assert np.array_equal(np.asarray(again[0]), np.asarray(got[0]))
    # The residual inside the kernel rounds as x + y in x's dtype does.
    (y, _), _ = run(args, residual=True)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(args[0] + got[0]))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_kernels_break_ties_by_index(rng, dtype):
    """Identical router columns give bit-identical logits in the kernel (each column's sum runs in
    the same order), and the top-k takes tied experts in index order."""
    args = tied(rng, dtype)
    got, _ = run(args)
    want = reference(*args, residual=False)
    assert list(want[1][:3]) == [2, 5, 9]
    check(got, want, dtype, weights_rtol=5e-3)


@pytest.mark.gpu
def test_moe_block_takes_token_moe(rng):
    """At one token in device mode moe_block is one token_moe call (no routing kernel, no XLA
    router GEMM), equal within rounding to its unfused path."""
    x, norm, router, w_fc1, w_fc2, _ = make(rng, hidden=256, experts=64, ffn=96, top_k=6, round_first=False,
                                            reads_normed=False, scale_f32=True)
    block = lambda x, fuse: moe_block(x, router.weight, w_fc1, w_fc2, top_k=6, norm_scale=norm.scale,
                                      group_sizes_mode="device", fuse=fuse, residual=True)
    hlo = jax.jit(lambda x: block(x, True)).lower(x).as_text()
    assert hlo.count(token_moe.TOKEN_MOE) == 1 and "te_async_route" not in hlo and "dot_general" not in hlo
    fused, unfused = (np.asarray(jax.jit(lambda x, f=f: block(x, f))(x), np.float32) for f in (True, False))
    assert rel_error(fused - np.asarray(x, np.float32), unfused - np.asarray(x, np.float32)) < TOL[jnp.bfloat16]


@pytest.mark.gpu
def test_models_moe_sublayer_takes_token_moe():
    """A bf16 DeepSeek-V2 layer (float32 router, group-limited top-k, routed scaling, a shared
    expert) at one token in device mode: the MoE sub-layer is one token_moe call, and it matches the
    unfused sub-layer (x + moe_block(rms_norm(x))) within bf16 rounding, with the same experts."""
    from te_async.models.moe_layer import moe_sublayer
    from test_models import random_params, tiny
    import te_async.models as models

    config = tiny("deepseek_v2")
    params = random_params(config)
    layer = next(layer for layer in models.per_layer(params["layers"]) if "moe" in layer)
    to_bf16 = lambda path, a: a if path[-1].key == "router" else a.astype(jnp.bfloat16)
    p = jax.tree_util.tree_map_with_path(to_bf16, layer["moe"])
    norm = layer["mlp_norm"].astype(jnp.bfloat16)
    x = jnp.asarray(np.random.default_rng(5).standard_normal((1, 1, config.hidden_size)), jnp.bfloat16)
    sub = lambda experts: jax.jit(lambda p, norm, x: moe_sublayer(p, norm, config, x, group_sizes_mode="device",
                                                                  experts=experts, return_routing=True))
    hlo = sub("te_async").lower(p, norm, x).as_text()
    assert hlo.count(token_moe.TOKEN_MOE) == 1 and "te_async_route" not in hlo
    (y, chosen), (y_ref, chosen_ref) = sub("te_async")(p, norm, x), sub("te_async_unfused")(p, norm, x)
    assert np.array_equal(np.asarray(chosen), np.asarray(chosen_ref))
    x32 = np.asarray(x, np.float32)
    assert rel_error(np.asarray(y, np.float32) - x32, np.asarray(y_ref, np.float32) - x32) < TOL[jnp.bfloat16]
