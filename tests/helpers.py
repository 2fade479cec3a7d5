"""Shared test helpers: tolerances, random operands, device placement. The float64 references
are in reference.py; tests import both as top-level modules (pytest puts tests/ on sys.path)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from reference import SIZE_KINDS, random_group_sizes
from te_async.bench.lowered import allocated_buffers, cuda_stablehlo, row_scatter_adds  # noqa: F401 (the tests import them from here)

# grouped_gemm against float64. Inputs are rounded to their dtype before the reference sees them
# and every backend accumulates in float32, so the only error left is the accumulation order (f32)
# or the one rounding of the output (bf16/f16: 2^-8 / 2^-11).
TOL = {jnp.float32: 1e-5, jnp.bfloat16: 8e-3, jnp.float16: 1e-3}

# The three grouped-GEMM forms as (ragged, transpose_rhs): forward, forward with rhs [G,N,K], wgrad.
FORMS = [("m", False), ("m", True), ("k", False)]

GATED = {"swiglu", "geglu"}

def four_device_mesh(axis: str, axis_type=None):
    """A 1-D mesh over the first 4 devices (the CPU tests make 4 host devices), or a skip where
    fewer are present (a one-GPU machine)."""
    import pytest
    from jax.sharding import AxisType

    if jax.device_count() < 4:
        pytest.skip("needs 4 devices (the CPU tests make 4)")
    return jax.make_mesh((4,), (axis,), axis_types=(axis_type or AxisType.Auto,), devices=jax.devices()[:4])


def gpu_available() -> bool:
    """te_async's CUDA extension is built and JAX sees a GPU: what tests marked `gpu` need."""
    import te_async

    try:
        return te_async.cuda_extension_built() and bool(jax.devices("gpu"))
    except RuntimeError:
        return False


def on_gpu(a):
    return jax.device_put(a, jax.devices("gpu")[0])


def cutlass_runs() -> bool:
    """The CUTLASS sm_90a kernels are built and GPU 0 is a Hopper GPU: where device mode plans
    cutlass_sm90 for eligible shapes (csrc/device_kernel_choice.h)."""
    from te_async import _ffi

    cuda = _ffi.cuda_module()
    return cuda is not None and bool(cuda.CUTLASS_BUILT) and jax.devices("gpu")[0].compute_capability == "9.0"


def device_plan(groups, rows, k, n, ragged, transpose_rhs, dtype, out_dtype=None):
    """te_async.plan's DevicePlan for a device-mode grouped_gemm call of these static shapes."""
    from te_async.plan import GemmShape, plan_device_gemm

    out = None if out_dtype is None else jnp.dtype(out_dtype).name
    shape = GemmShape(groups, rows, k, n, ragged_k=ragged == "k", transpose_rhs=transpose_rhs,
                      dtype=jnp.dtype(dtype).name, out_dtype=out)
    return plan_device_gemm(shape)


def small_groups_slices(groups, rows, k, n, dtype, transpose_rhs=False) -> int:
    """The most K slices (one thread-block cluster per item) small_groups plans for these shapes on GPU
    0, 1 for no split (the launch takes fewer where the clusters would not all be resident)."""
    from te_async import _ffi

    major, minor = jax.devices("gpu")[0].compute_capability.split(".")
    sms = _ffi.cuda_module().device_info(0)[1]
    return _ffi.cuda_module().small_groups_slices(groups, rows, k, n, transpose_rhs, jnp.dtype(dtype).name,
                                                   10 * int(major) + int(minor), sms)


def fake_gpu_trace(annotation: str, steps: int = 3):
    """A stand-in for trace.load_events: `steps` annotated steps of two kernels with a 20 us
    bubble, as a GPU trace would show them (CPU traces have no GPU events)."""
    meta = [{"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/device:GPU:0"}},
            {"ph": "M", "pid": 1, "tid": 7, "name": "thread_name", "args": {"name": "Stream #7(Compute)"}}]
    x = lambda pid, ts, dur, name: {"ph": "X", "pid": pid, "tid": 7, "ts": ts, "dur": dur, "name": name}
    events = [e for i in range(steps)
              for e in (x(2, 100 * i, 90, annotation), x(1, 100 * i + 10, 30, "gemm"), x(1, 100 * i + 60, 20, "fusion"))]
    return lambda path: meta + events


def on_cpu(*arrays):
    """On the first CPU device, whatever the default backend: for the CPU handlers' behaviour."""
    return jax.device_put(arrays, jax.devices("cpu")[0])


def random_kind(rng) -> str:
    return SIZE_KINDS[int(rng.integers(len(SIZE_KINDS)))]


def layer_group_sizes(rng, layers: int, groups: int, rows: int) -> np.ndarray:
    """int32 [layers, groups]: different sizes per layer, cycling through every kind."""
    return np.stack([random_group_sizes(rng, groups, rows, SIZE_KINDS[i % len(SIZE_KINDS)]) for i in range(layers)])


def gemm_operands(rng, dtype, groups, rows, k, n, ragged="m", transpose_rhs=False):
    """lhs [rows, k] and rhs [groups, k, n] ([groups, n, k] transposed; [rows, n] for ragged k)."""
    lhs = jnp.asarray(rng.standard_normal((rows, k)), dtype)
    if ragged == "k":
        return lhs, jnp.asarray(rng.standard_normal((rows, n)), dtype)
    shape = (groups, n, k) if transpose_rhs else (groups, k, n)
    return lhs, jnp.asarray(rng.standard_normal(shape), dtype)


def gemm_layer_stack(rng, layers, groups, rows, d, dtype=jnp.float32):
    """Per-layer sizes [L, G], square weights [L, G, d, d] scaled to keep a chain of layers O(1),
    and the first layer's input [rows, d]."""
    sizes = layer_group_sizes(rng, layers, groups, rows)
    w = jnp.asarray(rng.standard_normal((layers, groups, d, d)) / np.sqrt(d), dtype)
    return sizes, w, jnp.asarray(rng.standard_normal((rows, d)), dtype)


def mlp_layer_stack(rng, layers, groups, rows, hidden, ffn, dtype=jnp.float32):
    """Per-layer sizes [L, G], swiglu weights w_fc1 [L, G, H, 2F] and w_fc2 [L, G, F, H], and the
    first layer's input [rows, H]."""
    sizes = layer_group_sizes(rng, layers, groups, rows)
    w1 = jnp.asarray(rng.standard_normal((layers, groups, hidden, 2 * ffn)) / np.sqrt(hidden), dtype)
    w2 = jnp.asarray(rng.standard_normal((layers, groups, ffn, hidden)) / np.sqrt(ffn), dtype)
    return sizes, w1, w2, jnp.asarray(rng.standard_normal((rows, hidden)), dtype)


def mlp_inputs(rng, *, groups, rows, hidden, ffn, activation, norm, dtype=jnp.float32, kind="random"):
    """Sizes of `kind` and grouped_mlp's keyword operands (x, w_fc1, w_fc2, norm_scale, norm_bias;
    the norm parameters float32, None where `norm` takes none)."""
    sizes = random_group_sizes(rng, groups, rows, kind)
    f1 = 2 * ffn if activation in GATED else ffn
    arrays = dict(
        x=jnp.asarray(rng.standard_normal((rows, hidden)), dtype),
        w_fc1=jnp.asarray(rng.standard_normal((groups, hidden, f1)) / np.sqrt(hidden), dtype),
        w_fc2=jnp.asarray(rng.standard_normal((groups, ffn, hidden)) / np.sqrt(ffn), dtype),
        norm_scale=None if norm is None else jnp.asarray(1 + 0.1 * rng.standard_normal(hidden), jnp.float32),
        norm_bias=jnp.asarray(0.1 * rng.standard_normal(hidden), jnp.float32) if norm == "layernorm" else None,
    )
    return sizes, arrays


def moe_params(rng, experts, hidden, ffn):
    """float32 router [H, E] and swiglu experts w_fc1 [E, H, 2F], w_fc2 [E, F, H]."""
    return dict(
        router=jnp.asarray(rng.standard_normal((hidden, experts)) / np.sqrt(hidden), jnp.float32),
        w_fc1=jnp.asarray(rng.standard_normal((experts, hidden, 2 * ffn)) / np.sqrt(hidden), jnp.float32),
        w_fc2=jnp.asarray(rng.standard_normal((experts, ffn, hidden)) / np.sqrt(ffn), jnp.float32),
    )


def sgd_losses(loss, params, steps: int, lr: float) -> list:
    """The loss before each of `steps` jitted plain-SGD steps on loss(params)."""
    @jax.jit
    def step(p):
        value, grads = jax.value_and_grad(loss)(p)
        return value, jax.tree.map(lambda w, g: w - lr * g, p, grads)

    losses = []
    for _ in range(steps):
        value, params = step(params)
        losses.append(float(value))
    return losses


def random_top_k(rng, tokens: int, experts: int, top_k: int) -> jax.Array:
    """int32 [tokens, top_k]: distinct random experts per token, as a top-k routing chooses them."""
    return jnp.asarray(np.stack([rng.permutation(experts)[:top_k] for _ in range(tokens)]), jnp.int32)


def bf16_bits(values: np.ndarray) -> np.ndarray:
    """The uint16 bit patterns of `values` rounded once to bfloat16 (through float32)."""
    return np.asarray(jnp.asarray(values.astype(np.float32), jnp.bfloat16).view(jnp.uint16))


def assert_bad_setting_refused(module, monkeypatch):
    """module.KERNEL_ENV set to an unknown kernel: module.default_kernel() raises a ValueError
    naming the variable and the value (its cache cleared around, so later tests read the real one)."""
    monkeypatch.setenv(module.KERNEL_ENV, "fast")
    module.default_kernel.cache_clear()
    try:
        with pytest.raises(ValueError, match=f"{module.KERNEL_ENV}='fast'"):
            module.default_kernel()
    finally:
        monkeypatch.delenv(module.KERNEL_ENV)
        module.default_kernel.cache_clear()
