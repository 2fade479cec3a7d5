"""te_async.token_ffn: one token's routed and shared experts in one kernel, against a float64
reference (CPU: the JAX reference path; GPU: the kernel, with poisoned outputs in gpu_check.sh's
runs), on random routings, repeated experts, sizes whose unit blocks leave tails, bf16 and f16,
Qwen2-MoE's shared scale; each item's units over a thread-block cluster; the plan of units and
slices; the errors for what it cannot run."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from te_async import plan
from te_async import token_ffn as tf
from te_async.routing import route

from helpers import on_cpu
from reference import rel_error

TOL = {jnp.bfloat16: 1.5e-2, jnp.float16: 2e-3}


def swiglu64(x, w1, w2, dtype):
    """down(silu(gate) * linear) in float64, fc1's output and the activation rounded to dtype."""
    rnd = lambda v: np.asarray(jnp.asarray(v).astype(dtype).astype(jnp.float64))
    h = rnd(x @ w1)
    gate, lin = np.split(h, 2, axis=-1)
    return rnd(gate / (1 + np.exp(-gate)) * lin) @ w2


def reference(x, routed, shared):
    f64 = lambda a: np.asarray(jnp.asarray(a, jnp.float64))
    out = np.zeros(x.shape[1], np.float64)
    if routed is not None:
        for e, w in zip(np.asarray(routed.experts)[0], np.asarray(routed.weights)[0]):
            out += float(w) * swiglu64(f64(x)[0], f64(routed.w_fc1)[e], f64(routed.w_fc2)[e], x.dtype)
    if shared is not None:
        scale = 1.0 if shared.scale is None else float(np.asarray(shared.scale).reshape(()))
        out += scale * swiglu64(f64(x)[0], f64(shared.w_gate_up), f64(shared.w_down), x.dtype)
    return out[None]


def make(rng, *, hidden, experts=0, ffn=0, top_k=0, shared_ffn=0, dtype=jnp.bfloat16, gated=False, repeat=False):
    x = jnp.asarray(rng.standard_normal((1, hidden)), dtype)
    routed = shared = None
    if top_k:
        chosen = rng.choice(experts, top_k, replace=False)
        if repeat:  # the same expert twice: the kernel must not assume distinct choices
            chosen[-1] = chosen[0]
        routed = tf.Routed(jnp.asarray(chosen[None], jnp.int32), jnp.asarray(rng.random((1, top_k)), jnp.float32),
                           jnp.asarray(rng.standard_normal((experts, hidden, 2 * ffn)) / np.sqrt(hidden), dtype),
                           jnp.asarray(rng.standard_normal((experts, ffn, hidden)) / np.sqrt(ffn), dtype))
    if shared_ffn:
        scale = jnp.asarray(rng.random((1, 1)), jnp.float32) if gated else None
        shared = tf.Shared(jnp.asarray(rng.standard_normal((hidden, 2 * shared_ffn)) / np.sqrt(hidden), dtype),
                           jnp.asarray(rng.standard_normal((shared_ffn, hidden)) / np.sqrt(shared_ffn), dtype), scale)
    return x, routed, shared


# hidden, experts, ffn, top_k, shared_ffn: DeepSeek-like (shared = 2 experts' width), routed only,
# shared only (a dense MLP), block tails (F not a multiple of the planned units), Qwen3-like.
CASES = [
    dict(hidden=256, experts=16, ffn=176, top_k=6, shared_ffn=352),
    dict(hidden=512, experts=8, ffn=136, top_k=2),
    dict(hidden=2048, shared_ffn=2816),
    dict(hidden=264, experts=5, ffn=1000, top_k=3, shared_ffn=24),
    dict(hidden=128, experts=128, ffn=96, top_k=8),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_reference_path_against_float64(rng, case):
    """Off the GPU token_ffn runs its JAX reference: the same math as the float64 reference."""
    x, routed, shared = make(rng, **case, gated=True)
    y = jax.jit(tf.token_ffn)(*on_cpu(x, routed, shared))
    assert y.shape == (1, case["hidden"]) and y.dtype == x.dtype
    assert rel_error(y, reference(x, routed, shared)) < TOL[jnp.bfloat16]


PLAN_SHAPES = [(6, 1408, 2816, 2048), (6, 1408, 0, 2048), (0, 0, 2816, 2048), (0, 0, 10944, 2048), (8, 768, 0, 2048),
               (2, 14336, 0, 4096), (3, 1000, 24, 264), (0, 0, 8, 8)]


@pytest.mark.parametrize("clusters", [False, True])
def test_plan_split(clusters):
    """Multiples of 8, none past the widest F; slices of SLICES, 1 without clusters, at most H / 8;
    one wave of two blocks per SM, filled to FILL where the units allow it."""
    slots = tf.BLOCKS_PER_SM * 132
    for top_k, ffn, shared_ffn, hidden in PLAN_SHAPES:
        units, slices = tf.plan_split(top_k, ffn, shared_ffn, hidden, 132, clusters)
        assert units % 8 == 0 and 8 <= units <= min(tf.MAX_UNITS, max(ffn, shared_ffn)), (top_k, ffn, shared_ffn, units)
        assert slices in tf.SLICES and slices <= hidden // 8 and (clusters or slices == 1)
        grid = tf.blocks(top_k, ffn, shared_ffn, units) * slices
        assert grid <= slots, (top_k, ffn, shared_ffn, units, slices)
        if tf.blocks(top_k, ffn, shared_ffn, 8) * max(tf.SLICES if clusters else (1,)) >= slots:
            assert grid >= tf.FILL * slots, (top_k, ffn, shared_ffn, units, slices)


def test_plan_split_measured_choice():
    """On 132 SMs with clusters DeepSeek-V2-Lite's routed and shared experts get the split measured
    fastest on an H100 (plan_split's docstring): 128 units in clusters of 2."""
    assert tf.plan_split(6, 1408, 2816, 2048, 132, True) == (128, 2)
    assert tf.plan_split(6, 1408, 2816, 2048, 132, False).slices == 1


def test_errors(rng):
    x, routed, shared = make(rng, hidden=64, experts=4, ffn=16, top_k=2, shared_ffn=32)
    with pytest.raises(ValueError, match="routed experts, shared experts or both"):
        tf.token_ffn(x)
    with pytest.raises(ValueError, match="one token"):
        tf.token_ffn(jnp.concatenate([x, x]), routed)
    with pytest.raises(ValueError, match=r"\[1, k\]"):
        tf.token_ffn(x, routed._replace(experts=routed.experts[0]))
    with pytest.raises(TypeError, match="integer expert ids"):
        tf.token_ffn(x, routed._replace(experts=routed.experts.astype(jnp.float32)))
    with pytest.raises(ValueError, match=r"w_fc1 \[E, H, 2F\]"):
        tf.token_ffn(x, routed._replace(w_fc1=routed.w_fc1[:, :, :-2]))
    with pytest.raises(ValueError, match=r"w_gate_up \[H, 2Fs\]"):
        tf.token_ffn(x, shared=shared._replace(w_down=shared.w_down[:-1]))
    with pytest.raises(ValueError, match="one entry"):
        tf.token_ffn(x, shared=shared._replace(scale=jnp.ones((2,), jnp.float32)))
    with pytest.raises(TypeError, match="share one dtype"):
        tf.token_ffn(x.astype(jnp.float16), shared=shared)
    assert tf.applies(x, routed, shared) == plan.on_gpu()  # the kernel runs on the GPU only


# ---- GPU ------------------------------------------------------------------------------------


def _hlo(fn, *args):
    return jax.jit(fn).lower(*args).as_text()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_kernel_against_float64(rng, case, dtype):
    x, routed, shared = make(rng, **case, dtype=dtype, gated=True)
    assert tf.applies(x, routed, shared)
    fn = jax.jit(tf.token_ffn)
    assert tf.TOKEN_FFN in _hlo(tf.token_ffn, x, routed, shared)
    y = fn(x, routed, shared)
    assert rel_error(y, reference(x, routed, shared)) < TOL[dtype]
    assert np.array_equal(np.asarray(fn(x, routed, shared)), np.asarray(y))  # deterministic: bit-identical


@pytest.mark.gpu
def test_kernel_sums_more_items_than_a_reduce_block_has_threads(rng, monkeypatch):
    """8 units a block: 378 partials, so the reduce kernel's threads take two items each."""
    case = dict(hidden=264, experts=5, ffn=1000, top_k=3, shared_ffn=24)
    x, routed, shared = make(rng, **case, gated=True)
    monkeypatch.setattr(tf, "plan_split", lambda *args: tf.Split(8, 1))
    assert tf.plan_call(x, 3, 1000, 24)[1][1].shape == (378, 264)
    fn = _kernel_jit()
    y = fn(x, routed, shared)
    assert rel_error(y, reference(x, routed, shared)) < TOL[jnp.bfloat16]
    assert np.array_equal(np.asarray(fn(x, routed, shared)), np.asarray(y))


@pytest.mark.gpu
@pytest.mark.parametrize("split", [(8, 2), (48, 4), (128, 8), (256, 8), (24, 3)], ids=str)
@pytest.mark.parametrize("case", [CASES[0], CASES[3], CASES[4]], ids=["deepseek", "tails", "qwen3"])
def test_kernel_with_forced_splits(rng, monkeypatch, case, split):
    """Each item's units over a cluster of blocks, at every cluster size the kernel takes and one it
    takes but plan_split never picks (3): the shares of H's rows and column vectors uneven (H = 264:
    33 vectors), units past F (the tails), more experts than units. A cluster of 3 blocks is within the
    kernel's limits (it checks 1..8), so it is run here, with its 3-block shares."""
    if not _clusters():
        pytest.skip("thread-block clusters need compute capability 9.0")
    x, routed, shared = make(rng, **case, gated=True)
    monkeypatch.setattr(tf, "plan_split", lambda *args: tf.Split(*split))
    fn = _kernel_jit()
    y = fn(x, routed, shared)
    assert rel_error(y, reference(x, routed, shared)) < TOL[jnp.bfloat16]
    assert np.array_equal(np.asarray(fn(x, routed, shared)), np.asarray(y))
    bad = routed._replace(experts=routed.experts.at[0, 0].set(routed.w_fc1.shape[0]))  # every block of the item's cluster
    assert np.isnan(np.asarray(fn(x, bad, shared), np.float32)).all()


@pytest.mark.gpu
def test_kernel_refuses_a_bad_split(rng, monkeypatch):
    x, routed, shared = make(rng, **CASES[3])
    for split, why in [((8, 9), "slices must be in"), ((8, 0), "slices must be in"), ((264, 1), "units must be")]:
        monkeypatch.setattr(tf, "plan_split", lambda *args, s=split: tf.Split(*s))
        with pytest.raises(Exception, match=why):
            _kernel_jit()(x, routed, shared).block_until_ready()
    x, _, shared = make(rng, hidden=16, shared_ffn=16)  # two column vectors: at most two slices
    monkeypatch.setattr(tf, "plan_split", lambda *args: tf.Split(16, 4))
    with pytest.raises(Exception, match=r"slices must be in \[1, min\(8, H / 8\)\]"):
        _kernel_jit()(x, None, shared).block_until_ready()


def _kernel_jit():
    """The kernel's branch itself (platform_dependent keeps the branches it traced), jitted anew, so
    that the plan patched in is read: jax reuses a jitted function's trace for the same shapes."""
    return jax.jit(lambda *args: tf._kernel(*args))


def _clusters():
    return min(cc for cc, _ in plan.local_gpu_kinds()) >= 90


@pytest.mark.gpu
def test_kernel_repeated_expert_and_routing_kernel(rng):
    """Two choices of one expert; and the routing kernel's experts and weights read on the GPU."""
    x, routed, shared = make(rng, hidden=256, experts=16, ffn=64, top_k=4, shared_ffn=128, repeat=True)
    assert rel_error(jax.jit(tf.token_ffn)(x, routed, shared), reference(x, routed, shared)) < TOL[jnp.bfloat16]
    logits = jnp.asarray(rng.standard_normal((1, 16)), jnp.float32)

    def block(x, logits, w_fc1, w_fc2):
        routing, _ = route(logits, 4, renormalize=True)
        return tf.token_ffn(x, tf.Routed(routing.experts, routing.weights, w_fc1, w_fc2))

    routing, _ = route(logits, 4, renormalize=True)
    want = reference(x, tf.Routed(routing.experts, routing.weights, routed.w_fc1, routed.w_fc2), None)
    assert rel_error(jax.jit(block)(x, logits, routed.w_fc1, routed.w_fc2), want) < TOL[jnp.bfloat16]


@pytest.mark.gpu
def test_kernel_bad_expert_gives_nan(rng):
    """An expert id out of range cannot be raised inside a graph: the token's output is NaN."""
    x, routed, _ = make(rng, hidden=128, experts=4, ffn=32, top_k=2)
    y = jax.jit(tf.token_ffn)(x, routed._replace(experts=jnp.asarray([[1, 7]], jnp.int32)))
    assert np.isnan(np.asarray(y, np.float32)).all()


@pytest.mark.gpu
def test_kernel_gradients_are_the_reference_s(rng):
    x, routed, shared = make(rng, hidden=128, experts=4, ffn=32, top_k=2, shared_ffn=64)
    loss = lambda f: lambda x, w1, w2, s1: f(x, routed._replace(w_fc1=w1, w_fc2=w2), shared._replace(w_gate_up=s1)).astype(jnp.float32).sum()
    got = jax.grad(loss(tf.token_ffn), argnums=(0, 1, 2, 3))(x, routed.w_fc1, routed.w_fc2, shared.w_gate_up)
    want = jax.grad(loss(tf.reference), argnums=(0, 1, 2, 3))(x, routed.w_fc1, routed.w_fc2, shared.w_gate_up)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w, np.float32), rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
def test_kernel_refuses_what_it_cannot_run(rng):
    """f32 and an H past MAX_HIDDEN: applies() says no, and the handler names the problem."""
    x, _, shared = make(rng, hidden=64, shared_ffn=32, dtype=jnp.float32)
    assert not tf.applies(x, shared=shared)
    with pytest.raises(Exception, match="bfloat16 or float16"):
        jax.jit(tf.token_ffn)(x, None, shared).block_until_ready()
    x, _, shared = make(rng, hidden=tf.MAX_HIDDEN + 8, shared_ffn=8)
    assert not tf.applies(x, shared=shared)
