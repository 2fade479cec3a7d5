"""Device-mode planning (te_async.plan): the kernel rule for any target, the settings read from the
environment at trace time, and the default mode chosen from every GEMM a call runs."""

import jax
import jax.numpy as jnp
import pytest

import te_async
from te_async import plan
from te_async.mlp import gemm_shapes, resolve_mlp_mode
from helpers import TOL, cutlass_runs, gemm_operands, gpu_available, on_gpu
from reference import grouped_gemm_reference, random_group_sizes, rel_error

DEEPSEEK = dict(groups=64, hidden=2048, ffn=1408)


@pytest.mark.parametrize(
    "shape, cc, cutlass, expected",
    [
        (plan.GemmShape(64, 6, 2048, 2816), 90, True, "small_groups"),  # decode T=1, top-6
        (plan.GemmShape(64, 128, 2048, 2816), 90, True, "small_groups"),  # 2 rows per group
        (plan.GemmShape(64, 129, 2048, 2816), 90, True, "cutlass_sm90"),  # past 2 rows per group
        (plan.GemmShape(64, 512, 2048, 2816), 80, True, "small_groups"),  # no CUTLASS on sm_80
        (plan.GemmShape(64, 513, 2048, 2816), 80, True, "portable"),
        (plan.GemmShape(64, 24576, 2048, 2816), 90, True, "cutlass_sm90"),
        (plan.GemmShape(64, 24576, 2048, 2816), 90, False, "portable"),
        (plan.GemmShape(64, 24576, 2048, 2820), 90, True, "portable"),  # N % 8 != 0
        (plan.GemmShape(64, 6, 2048, 2816, ragged_k=True), 90, True, "cutlass_sm90"),  # wgrad: never small_groups
        (plan.GemmShape(64, 6, 2048, 2816, ragged_k=True), 80, True, "portable"),
        (plan.GemmShape(64, 24576, 2048, 2816, dtype="float32"), 90, True, "portable"),
    ],
)
def test_kernel_rule(shape, cc, cutlass, expected):
    assert plan.kernel_rule(shape, compute_capability=cc, cutlass_built=cutlass) == expected


def test_small_groups_rows_setting(monkeypatch):
    decode = plan.GemmShape(64, 300, 2048, 2816)
    assert plan.kernel_rule(decode, compute_capability=80, cutlass_built=False) == "small_groups"
    monkeypatch.setenv(plan.SMALL_GROUPS_MAX_ROWS_ENV, "256")
    assert plan.read_settings().small_groups_max_rows == 256
    assert plan.kernel_rule(decode, compute_capability=80, cutlass_built=False) == "portable"


@pytest.mark.parametrize("value", ["", "12x", "-3", "5.5"])
def test_bad_small_groups_rows_setting_names_the_variable(monkeypatch, value):
    monkeypatch.setenv(plan.SMALL_GROUPS_MAX_ROWS_ENV, value)
    with pytest.raises(ValueError, match=plan.SMALL_GROUPS_MAX_ROWS_ENV):
        plan.read_settings()


def test_bad_cutlass_config_setting_names_the_variable(monkeypatch):
    monkeypatch.setenv(plan.CUTLASS_CONFIG_ENV, "cutlass_sm90_coop_128x265x64_c1x1")  # a typo
    with pytest.raises(ValueError, match=plan.CUTLASS_CONFIG_ENV):
        plan.read_settings()


def test_mlp_default_mode_asks_about_all_six_gemms(monkeypatch):
    """fc1's forward alone does not decide: the rule is asked about every GEMM of the layer."""
    asked = []
    monkeypatch.setattr(plan, "device_mode_is_fast", lambda shapes: asked.extend(shapes) or False)
    w_fc1, w_fc2 = jnp.zeros((8, 64, 192), jnp.float32), jnp.zeros((8, 96, 64), jnp.float32)
    assert resolve_mlp_mode(None, False, None, groups=8, rows=40, w_fc1=w_fc1, w_fc2=w_fc2) == "async"
    assert asked == list(gemm_shapes(8, 40, 64, 192, 96, jnp.float32))
    forms = {(s.k, s.n, s.ragged_k, s.transpose_rhs) for s in asked}
    assert forms == {(64, 192, False, False), (96, 64, False, False), (64, 96, False, True),
                     (192, 64, False, True), (96, 64, True, False), (64, 192, True, False)}


def test_cpu_plans_the_reference():
    shape = plan.GemmShape(64, 24576, 2048, 2816)
    if gpu_available():
        pytest.skip("a GPU is the default backend here")
    assert plan.plan_device_gemm(shape) == plan.DevicePlan("cpu", "", 0)
    assert plan.device_mode_is_fast(gemm_shapes(64, 24576, 2048, 2816, 1408, jnp.bfloat16))


@pytest.mark.gpu
def test_plans_on_this_gpu():
    decode = plan.plan_device_gemm(plan.GemmShape(64, 6, 2048, 2816))
    assert decode == plan.DevicePlan("small_groups", "", 0)
    prefill = plan.plan_device_gemm(plan.GemmShape(64, 24576, 2048, 2816))
    if cutlass_runs():
        assert prefill.kernel == "cutlass_sm90" and prefill.config in plan.cutlass_configs("m")
        assert prefill.workspace_bytes > 0
    else:
        assert prefill == plan.DevicePlan("portable", "", 0)


@pytest.mark.gpu
def test_default_mode_leaves_device_mode_when_a_backward_gemm_is_slow():
    """ffn 1412 (not a multiple of 8) with 2*ffn = 2824 (one): fc1's forward runs on CUTLASS, but
    fc2's and the dgrad of fc1 would take the portable kernel at prefill size, so the default is
    async; at decode size the portable kernel's work is small and device mode stays."""
    if not cutlass_runs():
        pytest.skip("needs the CUTLASS kernels on a Hopper GPU")
    w_fc1, w_fc2 = jnp.zeros((64, 2048, 2824), jnp.bfloat16), jnp.zeros((64, 1412, 2048), jnp.bfloat16)
    mode = lambda rows: resolve_mlp_mode(None, False, None, groups=64, rows=rows, w_fc1=w_fc1, w_fc2=w_fc2)
    assert plan.plan_device_gemm(plan.GemmShape(64, 24576, 2048, 2824)).kernel == "cutlass_sm90"
    assert mode(24576) == "async"
    assert mode(48) == "device"


@pytest.mark.gpu
def test_cutlass_config_setting_applies_at_the_next_trace(monkeypatch, rng):
    """TE_ASYNC_CUTLASS_CONFIG is read when a call is traced: a fresh trace after a change runs the
    new config, with the same values."""
    if not cutlass_runs():
        pytest.skip("needs the CUTLASS kernels on a Hopper GPU")
    groups, rows, k, n = 8, 1000, 256, 128
    sizes = random_group_sizes(rng, groups, rows, "random")
    lhs, rhs = gemm_operands(rng, jnp.bfloat16, groups, rows, k, n)
    want = grouped_gemm_reference(lhs, rhs, sizes)
    shape = plan.GemmShape(groups, rows, k, n)
    for config in plan.cutlass_configs("m"):
        monkeypatch.setenv(plan.CUTLASS_CONFIG_ENV, config)
        assert plan.plan_device_gemm(shape).config == config
        gemm = lambda a, b, s: te_async.grouped_gemm(a, b, s, group_sizes_mode="device")
        out = jax.jit(gemm)(on_gpu(lhs), on_gpu(rhs), on_gpu(jnp.asarray(sizes)))
        assert rel_error(out, want) < TOL[jnp.bfloat16], config
    monkeypatch.delenv(plan.CUTLASS_CONFIG_ENV)
    heuristic = plan.plan_device_gemm(shape).config
    k_only = [c for c in plan.cutlass_configs("k") if c not in plan.cutlass_configs("m")]
    monkeypatch.setenv(plan.CUTLASS_CONFIG_ENV, k_only[0])  # another form's config leaves ragged m alone
    assert plan.plan_device_gemm(shape).config == heuristic
