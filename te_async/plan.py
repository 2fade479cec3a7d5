"""Device-mode plans: the kernel, CUTLASS config and workspace of a device-mode grouped GEMM.

A plan is made once, when the call is traced, from its static shape, the local GPUs and two
settings from the environment (read and validated here, nowhere else). The handler receives it
as FFI attributes plus a workspace result and only checks that it fits the device it runs on, so
a call never decides anything at run time and can sit in a CUDA graph. Nothing is cached: a
setting changed between two traces applies to the second.

The kernel rule itself is C++ (csrc/device_kernel_choice.h; the CUTLASS config heuristic is in
csrc/cuda/cutlass_grouped_gemm.cu), one rule for every caller.
"""

import functools
import os
from typing import Iterable, NamedTuple, Optional

import jax

from . import _ffi

SMALL_GROUPS_MAX_ROWS_ENV = "TE_ASYNC_SMALL_GROUPS_MAX_ROWS"
CUTLASS_CONFIG_ENV = "TE_ASYNC_CUTLASS_CONFIG"
FORMS = ("m", "mt", "k")  # ragged m, ragged m with rhs transposed, ragged k


class GemmShape(NamedTuple):
    """A grouped GEMM as trace time knows it (dtype names as numpy spells them)."""

    groups: int
    rows: int
    k: int
    n: int
    ragged_k: bool = False
    transpose_rhs: bool = False
    dtype: str = "bfloat16"
    out_dtype: Optional[str] = None

    def static_args(self) -> tuple:
        return (self.groups, self.rows, self.k, self.n, self.ragged_k, self.transpose_rhs, self.dtype,
                self.out_dtype or self.dtype)


class DevicePlan(NamedTuple):
    kernel: str  # "small_groups", "cutlass_sm90", "portable"; "cpu" where no GPU runs the call
    config: str  # the CUTLASS config name, "" for the other kernels
    workspace_bytes: int

    @property
    def label(self) -> str:
        """The CUTLASS config where there is one, else the kernel: what benchmarks print."""
        return self.config or self.kernel


class Settings(NamedTuple):
    small_groups_max_rows: int  # ragged rows up to which decode's small_groups kernel is used
    cutlass_config: str  # "" (the heuristic) or a CUTLASS config name


def cutlass_configs(form: str) -> list:
    """The CUTLASS configs a form ("m", "mt", "k") can run, the values TE_ASYNC_CUTLASS_CONFIG
    accepts; empty where CUTLASS is not built."""
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, got {form!r}")
    module = _ffi.cuda_module()
    return list(module.CUTLASS_CONFIGS.get(form, [])) if module is not None else []


def kernel_setting(env: str, kernels: tuple) -> str:
    """The kernel that environment variable `env` asks for, "auto" where it is unset; a value
    outside `kernels` is an error naming them."""
    kernel = os.environ.get(env, "auto")
    if kernel not in kernels:
        raise ValueError(f"{env}={kernel!r}: expected one of {kernels}")
    return kernel


def read_settings() -> Settings:
    """The two planning settings from the environment, each checked here with an error naming it."""
    rows_text = os.environ.get(SMALL_GROUPS_MAX_ROWS_ENV)
    if rows_text is None:
        rows = _ffi.SMALL_GROUPS_MAX_ROWS
    elif rows_text.strip().isdigit():
        rows = int(rows_text)
    else:
        raise ValueError(f"{SMALL_GROUPS_MAX_ROWS_ENV}={rows_text!r}: expected a non-negative whole number of rows")
    config = os.environ.get(CUTLASS_CONFIG_ENV, "")
    known = sorted({c for form in FORMS for c in cutlass_configs(form)})
    if config and config not in known:
        built = f"the configs are {', '.join(known)}" if known else "te_async was built without the CUTLASS kernels"
        raise ValueError(f"{CUTLASS_CONFIG_ENV}={config!r} is not a CUTLASS config: {built}")
    return Settings(rows, config)


def kernel_rule(shape: GemmShape, *, compute_capability: int, cutlass_built: bool,
                small_groups_max_rows: Optional[int] = None) -> str:
    """The device-mode kernel rule for any target, with or without a GPU here (for tests and docs)."""
    rows = read_settings().small_groups_max_rows if small_groups_max_rows is None else small_groups_max_rows
    return _ffi.kernel_rule(*shape.static_args(), compute_capability, cutlass_built, rows)


@functools.lru_cache(maxsize=None)
def _device_kind(hardware_id: int) -> tuple:
    """(compute capability, SM count) of a local GPU: hardware facts, so the id is the whole key."""
    return tuple(_ffi.cuda_module().device_info(hardware_id))


def local_gpu_kinds() -> set:
    """{(compute capability, SM count)} of the local GPUs."""
    return {_device_kind(d.local_hardware_id) for d in jax.local_devices(backend="gpu")}


def local_sm_count() -> int:
    """SMs of the largest local GPU: what the decode kernels size their key splits by."""
    return max(sms for _, sms in local_gpu_kinds())


def on_gpu() -> bool:
    return _ffi.gpu_present() and jax.default_backend() == "gpu"


def _plan(shape: GemmShape, settings: Settings) -> DevicePlan:
    plans = {DevicePlan(*_ffi.cuda_module().plan_device_gemm(*shape.static_args(), cc, sms, *settings))
             for cc, sms in sorted(local_gpu_kinds())}
    if len({(p.kernel, p.config) for p in plans}) > 1:
        raise ValueError(f"the local GPUs are of different kinds and would run {shape} with different "
                         f"device-mode kernels ({sorted(p.label for p in plans)}); use one kind of GPU per process")
    return max(plans, key=lambda p: p.workspace_bytes)


def plan_device_gemm(shape: GemmShape) -> DevicePlan:
    """The plan for every local GPU (one plan: GPUs of different kinds must agree on the kernel
    and config; the workspace is the largest any of them needs). ("cpu", "", 0) off the GPU."""
    return _plan(shape, read_settings()) if on_gpu() else DevicePlan("cpu", "", 0)


def device_mode_is_fast(shapes: Iterable[GemmShape]) -> bool:
    """Whether device mode has a fast kernel for every GEMM a call will run (forward, dgrad and
    wgrad shapes alike): small_groups, CUTLASS, or the portable kernel at decode sizes, where its
    work is small; off the GPU every mode runs the same reference, so device mode always is. The
    settings are read once for all the shapes."""
    if not on_gpu():
        return True
    settings = read_settings()
    return all(_plan(s, settings).kernel != "portable" or s.rows <= settings.small_groups_max_rows for s in shapes)
