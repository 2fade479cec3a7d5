"""te_async.scan against jax.lax.scan: values, gradients, errors, and what its gradient allocates."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import te_async
from helpers import allocated_buffers, cuda_stablehlo, four_device_mesh, mlp_layer_stack
from reference import rel_error


def _stack(rng, layers=5, rows=3, hidden=4):
    """Stacked weights and biases of `layers` tanh layers, a float64 input, and one shared vector."""
    normal = lambda *shape: jnp.asarray(rng.standard_normal(shape))
    return dict(w=normal(layers, hidden, hidden) / 2, b=normal(layers, hidden), x=normal(rows, hidden),
                shared=normal(hidden))


def _layers(shared):
    """A step with float and integer xs, float and integer ys, closed over `shared` (a differentiated
    value, which te_async.scan hoists)."""
    def step(c, p):
        w, b, i = p
        h = jnp.tanh(c @ w + b + shared * (i + 1))
        return c + h, (jnp.sum(h * h, axis=1), i)

    return step


def _loss(scan, x, w, b, shared, **kw):
    c, (ys, idx) = scan(_layers(shared), x, (w, b, jnp.arange(w.shape[0])), **kw)
    return jnp.sum(jnp.sin(c)) + jnp.sum(ys**3) + jnp.sum(idx)


@pytest.mark.parametrize("reverse,unroll", [(False, 1), (True, 1), (False, 2), (True, 3)])
def test_values_and_gradients_match_lax_scan(rng, reverse, unroll):
    a = _stack(rng, layers=int(rng.integers(1, 7)))
    args = (a["x"], a["w"], a["b"], a["shared"])
    grad = lambda scan: jax.jit(jax.value_and_grad(lambda *v: _loss(scan, *v, reverse=reverse, unroll=unroll),
                                                   argnums=(0, 1, 2, 3)))(*args)
    (v_ours, g_ours), (v_ref, g_ref) = grad(te_async.scan), grad(jax.lax.scan)
    assert abs(float(v_ours) - float(v_ref)) <= 1e-12 * abs(float(v_ref))
    for ours, ref in zip(g_ours, g_ref):
        assert ours.dtype == ref.dtype == jnp.float64 and ours.shape == ref.shape
        assert float(jnp.max(jnp.abs(ref))) > 0
        assert rel_error(ours, ref) < 1e-12
    carry, ys = jax.jit(lambda *v: te_async.scan(_layers(v[3]), v[0], (v[1], v[2], jnp.arange(v[1].shape[0])),
                                                 reverse=reverse))(*args)
    ref_carry, ref_ys = jax.lax.scan(_layers(a["shared"]), a["x"], (a["w"], a["b"], jnp.arange(a["w"].shape[0])),
                                     reverse=reverse)
    assert rel_error(carry, ref_carry) < 1e-12 and rel_error(ys[0], ref_ys[0]) < 1e-12
    np.testing.assert_array_equal(ys[1], ref_ys[1])


def test_length_without_xs_and_rematerialised_steps(rng):
    """xs=None with a length, a jax.checkpoint step (whose residuals are its inputs alone), and
    xs of length 0."""
    a = _stack(rng)
    w0 = a["w"][0]
    step = jax.checkpoint(lambda c, _: (jnp.tanh(c @ w0) + c, c[0]))

    def loss(scan, x):
        c, ys = scan(step, x, None, length=4)
        return jnp.sum(c**2) + jnp.sum(jnp.cos(ys))

    for ours, ref in zip(jax.value_and_grad(lambda x: loss(te_async.scan, x))(a["x"]),
                         jax.value_and_grad(lambda x: loss(jax.lax.scan, x))(a["x"])):
        assert rel_error(ours, ref) < 1e-12
    carry, ys = te_async.scan(step, a["x"], a["w"][:0])  # length 0: the input carry, no rows
    np.testing.assert_array_equal(carry, a["x"])
    assert ys.shape == (0, a["x"].shape[1])


def test_vmap_of_the_gradient(rng):
    a = _stack(rng)
    xs = jnp.stack([a["x"], 2 * a["x"]])
    grad = lambda scan: jax.vmap(jax.grad(lambda x, w: _loss(scan, x, w, a["b"], a["shared"]), argnums=(0, 1)),
                                 in_axes=(0, None))(xs, a["w"])
    for ours, ref in zip(grad(te_async.scan), grad(jax.lax.scan)):
        assert rel_error(ours, ref) < 1e-12


def test_grouped_mlp_layer_stack(rng):
    """The training step of stacked grouped_mlp layers, each with its own group sizes: the gradients
    of jax.lax.scan over the same layers."""
    sizes, w1, w2, x0 = mlp_layer_stack(rng, 4, groups=5, rows=37, hidden=8, ffn=6)

    def loss(scan, x, w1, w2):
        layer = lambda x, p: (x + te_async.grouped_mlp(x, p[2], p[0], p[1]), None)
        return jnp.sum(scan(layer, x, (w1, w2, jnp.asarray(sizes)))[0] ** 2)

    grad = lambda scan: jax.jit(jax.value_and_grad(lambda *v: loss(scan, *v), argnums=(0, 1, 2)))(x0, w1, w2)
    (v_ours, g_ours), (v_ref, g_ref) = grad(te_async.scan), grad(jax.lax.scan)
    assert abs(float(v_ours) - float(v_ref)) <= 1e-6 * abs(float(v_ref))
    for ours, ref in zip(g_ours, g_ref):
        assert ours.dtype == jnp.float32 and rel_error(ours, ref) < 1e-5


@pytest.mark.parametrize("case", ["leading dims", "carry type", "no length"])
def test_errors_are_lax_scans(rng, case):
    a = _stack(rng)
    step = lambda c, p: (c @ p[0] + p[1], None)
    args = {
        "leading dims": (step, a["x"], (a["w"], a["b"][:2])),
        "carry type": (lambda c, w: ((c @ w).astype(jnp.float32), None), a["x"], a["w"]),
        "no length": (step, a["x"], None),
    }[case]
    with pytest.raises(Exception) as ref:
        jax.lax.scan(*args)
    with pytest.raises(type(ref.value)) as ours:
        te_async.scan(*args)
    assert str(ours.value) == str(ref.value)


@pytest.mark.parametrize("setting", ["auto", "explicit", "shard_map"])
def test_sharded_stacks(rng, setting):
    """Over 4 devices, the stacked weights sharded by expert: under jit with XLA's sharding (auto
    mesh axes), with sharding in types (explicit axes: the stacks must carry the rows' sharding)
    and inside shard_map (the stacks must vary over the manual axis as the rows do), te_async.scan
    gives jax.lax.scan's gradients, sharded as lax.scan's are."""
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

    layers, experts, rows, hidden = 3, 8, 5, 16
    w = np.asarray(rng.standard_normal((layers, experts, hidden, hidden)) / 4, np.float32)
    x = np.asarray(rng.standard_normal((experts, rows, hidden)), np.float32)
    shared = np.asarray(rng.standard_normal(hidden), np.float32)

    def loss(scan, x, w, shared):
        step = lambda c, w_l: (c + jnp.tanh(jnp.einsum("erh,ehk->erk", c, w_l)) * shared, jnp.sum(c))
        c, ys = scan(step, x, w)
        return jnp.sum(c**2) + jnp.sum(ys)

    mesh = four_device_mesh("e", AxisType.Explicit if setting == "explicit" else AxisType.Auto)
    got = {}
    for name, grad in _gradients(loss, argnums=(1, 2)).items():
        if setting == "shard_map":  # the gradient per device: an expert slice of w, all of shared's
            got[name] = jax.jit(jax.shard_map(grad, mesh=mesh, in_specs=(P("e"), P(None, "e"), P()),
                                              out_specs=(P(None, "e"), P())))(x, w, shared)
        else:
            with jax.set_mesh(mesh):
                args = (jax.device_put(x, NamedSharding(mesh, P("e"))),
                        jax.device_put(w, NamedSharding(mesh, P(None, "e"))), shared)
                got[name] = grad(*args)
    for ours, ref in zip(got["te_async"], got["lax"]):
        assert float(jnp.max(jnp.abs(ref))) > 0 and rel_error(ours, ref) < 1e-5
        assert ours.sharding.is_equivalent_to(ref.sharding, ours.ndim)


def _gradients(loss, argnums) -> dict:
    """{"lax": jitted gradient of loss(jax.lax.scan, *args), "te_async": of loss(te_async.scan, *args)}."""
    return {name: jax.jit(jax.grad(functools.partial(loss, scan), argnums=argnums))
            for name, scan in (("lax", jax.lax.scan), ("te_async", te_async.scan))}


def _scalar_fills(text: str, shape: str) -> int:
    """Broadcasts of a scalar to `shape` (e.g. "5x4x4xf32") in StableHLO text: zero fills."""
    return len(re.findall(r"broadcast_in_dim %\S+, dims = \[\] : \(tensor<\w+>\) -> tensor<" + shape + ">", text))


def test_gradient_for_the_gpu_fills_no_stack(rng):
    """Lowered for CUDA, lax.scan's gradient zero-fills the stacked residuals and the stacked weights'
    gradient; te_async.scan's allocates them (AllocateBuffer) and fills neither. The stacked weights
    are not saved as a residual: one [L, H, H] buffer, their gradient."""
    layers, rows, hidden = 5, 16, 32
    w = jnp.asarray(rng.standard_normal((layers, hidden, hidden)), jnp.float32)
    x = jnp.asarray(rng.standard_normal((rows, hidden)), jnp.float32)
    step = lambda c, w_l: (c + jnp.tanh(c @ w_l), None)
    lowered = {}
    for name, scan in (("lax", jax.lax.scan), ("te_async", te_async.scan)):
        lowered[name] = cuda_stablehlo(jax.grad(lambda x, w: jnp.sum(scan(step, x, w)[0] ** 2), argnums=(0, 1)), x, w)
    stacked_w, stacked_rows = f"{layers}x{hidden}x{hidden}xf32", f"{layers}x{rows}x{hidden}xf32"
    assert _scalar_fills(lowered["lax"], stacked_w) == 1 and _scalar_fills(lowered["lax"], stacked_rows) >= 1
    assert _scalar_fills(lowered["te_async"], stacked_w) == 0 and _scalar_fills(lowered["te_async"], stacked_rows) == 0
    allocated = allocated_buffers(lowered["te_async"])
    assert allocated.count(stacked_w) == 1
    assert allocated.count(stacked_rows) == _scalar_fills(lowered["lax"], stacked_rows)


def test_closed_over_values_are_passed_not_stacked(rng):
    """Values the step closes over are passed again to each step's pullback, as jax.lax.scan does:
    the group sizes every layer shares (a residual of grouped_mlp) are not stacked per layer
    (jax.closure_convert alone would leave them to be saved, being integers), and a closed-over
    float (the norm scale) gets the sum of its layers' gradients."""
    layers, groups, rows, hidden = 4, 3, 20, 8
    sizes, w1, w2, x = mlp_layer_stack(rng, layers, groups=groups, rows=rows, hidden=hidden, ffn=5)
    gs = jnp.asarray(sizes[0])
    scale = jnp.asarray(1 + 0.1 * rng.standard_normal(hidden), jnp.float32)

    def loss(scan, x, w1, w2, scale, gs):
        step = lambda c, w: (c + te_async.grouped_mlp(c, gs, w[0], w[1], norm_scale=scale), None)
        return jnp.sum(scan(step, x, (w1, w2))[0] ** 2)

    grads = _gradients(loss, argnums=(0, 1, 2, 3))
    for ours, ref in zip(grads["te_async"](x, w1, w2, scale, gs), grads["lax"](x, w1, w2, scale, gs)):
        assert rel_error(ours, ref) < 1e-5
    lowered = cuda_stablehlo(grads["te_async"], x, w1, w2, scale, gs)
    allocated = allocated_buffers(lowered)
    assert f"{layers}x{rows}x{hidden}xf32" in allocated and f"{layers}x{groups}xi32" not in allocated


def test_residuals_that_do_not_change_are_computed_once(rng):
    """A residual the step computes from closed-over values alone (here a causal mask from the
    positions and a float table from a closed-over vector) is computed once, before the loop, as
    jax.lax.scan hoists it: no [L, ...] buffer of it; the gradients are jax.lax.scan's."""
    layers, rows, hidden = 5, 12, 16
    w = jnp.asarray(rng.standard_normal((layers, hidden, hidden)) / 4, jnp.float32)
    x = jnp.asarray(rng.standard_normal((rows, hidden)), jnp.float32)
    positions = jnp.arange(rows)
    freq = jnp.asarray(rng.standard_normal(hidden), jnp.float32)

    def loss(scan, x, w, freq):
        def step(c, w_l):
            causal = (positions[:, None] >= positions[None, :]).astype(jnp.float32)
            table = jnp.cos(positions[:, None] * freq)  # [rows, hidden], differentiable in freq
            return c + causal @ jnp.tanh(c @ w_l) * table, None

        return jnp.sum(scan(step, x, w)[0] ** 2)

    grads = _gradients(loss, argnums=(0, 1, 2))
    for ours, ref in zip(grads["te_async"](x, w, freq), grads["lax"](x, w, freq)):
        assert float(jnp.max(jnp.abs(ref))) > 0 and rel_error(ours, ref) < 1e-5
    lowered = cuda_stablehlo(grads["te_async"], x, w, freq)
    allocated = allocated_buffers(lowered)
    assert f"{layers}x{rows}x{hidden}xf32" in allocated  # the carry and the tanh: they change
    assert f"{layers}x{rows}x{rows}xf32" not in allocated


@pytest.mark.gpu
def test_compiled_training_step_fills_no_stack_on_the_gpu(rng):
    """What XLA's GPU compiler keeps: no fusion of the scanned grouped_mlp step broadcasts into a
    stacked weight's shape (jax.lax.scan's gradient zero-fills both, 1.6 of 7.3 ms of a 2-layer
    DeepSeek-V2-Lite step on an H200) and none copies one (as XLA would, were two allocations
    merged into one buffer), the six grouped GEMMs a layer, and lax.scan's gradients."""
    layers = 3
    sizes, w1, w2, x0 = mlp_layer_stack(rng, layers, groups=4, rows=40, hidden=16, ffn=8, dtype=jnp.bfloat16)
    layer = lambda x, p: (x + te_async.grouped_mlp(x, p[2], p[0], p[1], norm=None, group_sizes_mode="device"), None)
    loss = lambda scan, x, w1, w2: jnp.sum(scan(layer, x, (w1, w2, jnp.asarray(sizes)))[0].astype(jnp.float32) ** 2)
    steps = _gradients(loss, argnums=(0, 1, 2))
    compiled = {name: f.lower(x0, w1, w2).compile().as_text() for name, f in steps.items()}
    shape = lambda w: r"bf16\[" + ",".join(map(str, w.shape)) + r"\]"
    fills = lambda text, w: len(re.findall(r"%\S*broadcast\S* = " + shape(w), text))
    copies = lambda text, w: len(re.findall(r"= " + shape(w) + r"\{[0-9,]*\} copy\(", text))
    assert fills(compiled["lax"], w1) + fills(compiled["lax"], w2) >= 1  # what the test looks for exists
    assert fills(compiled["te_async"], w1) == fills(compiled["te_async"], w2) == 0
    assert copies(compiled["te_async"], w1) == copies(compiled["te_async"], w2) == 0  # no buffer copied in its place
    assert compiled["te_async"].count('custom_call_target="te_async_grouped_gemm_device"') == 6
    for ours, ref in zip(steps["te_async"](x0, w1, w2), steps["lax"](x0, w1, w2)):
        assert rel_error(ours.astype(jnp.float32), ref.astype(jnp.float32)) < 1e-2
