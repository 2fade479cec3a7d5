"""Wall-clock timing, GPU time from a profiler trace, the machine's two ceilings and the run's
provenance, shared by every benchmark.

Calls are timed back to back, blocking once per batch, so that XLA's asynchronous dispatch
hides the host's launch cost exactly as it does in a real step; a mode whose calls stall the
host (sync) pays for it here too. Inputs rotate across several sets so that repeated calls do
not measure the L2 cache.
"""

import datetime
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from typing import Callable, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np

from .. import _ffi, cuda_extension_built, host_size_stats
from . import trace


class Timing(NamedTuple):
    median_s: float
    p10_s: float
    p90_s: float
    samples: int

    def as_dict(self) -> dict:
        return {"median_ms": 1e3 * self.median_s, "p10_ms": 1e3 * self.p10_s, "p90_ms": 1e3 * self.p90_s, "samples": self.samples}


def time_calls(fn: Callable, inputs: Sequence[tuple], *, reps: int = 30, inner: int = 5, warmup: int = 3,
               block: Callable = jax.block_until_ready) -> Timing:
    """Seconds per call of fn(*inputs[i]): `reps` batches of `inner` calls, median over batches;
    `block(out)` waits for a batch's last output (torch contenders pass their own)."""
    for i in range(warmup):
        block(fn(*inputs[i % len(inputs)]))
    per_call = []
    for r in range(reps):
        t0 = time.perf_counter()
        out = None
        for i in range(inner):
            out = fn(*inputs[(r * inner + i) % len(inputs)])
        block(out)
        per_call.append((time.perf_counter() - t0) / inner)
    q = np.percentile(per_call, [10, 90])
    return Timing(statistics.median(per_call), float(q[0]), float(q[1]), reps)


def chained_calls(fn: Callable, const, state, *, steps: int = 50, warmup: int = 3) -> float:
    """Seconds per call of state = fn(const, state), the state donated, the calls dispatched back
    to back and blocked on once: a decode loop's rate, as models.generate runs its steps, where a
    step's buffers keep their addresses from call to call (time_calls' rotated inputs and fresh
    outputs move them, and XLA re-records a CUDA graph whose buffers moved)."""
    run = jax.jit(fn, donate_argnums=1)
    state = jax.tree_util.tree_map(jnp.array, state)  # copies: the caller's arrays are not donated
    for _ in range(warmup):
        state = run(const, state)
    jax.block_until_ready(state)
    t0 = time.perf_counter()
    for _ in range(steps):
        state = run(const, state)
    jax.block_until_ready(state)
    return (time.perf_counter() - t0) / steps


_CALL = "te_async_timed_call"


def device_times(fn: Callable, inputs: Sequence[tuple], *, calls: int = 10) -> Optional[dict]:
    """GPU time of a call, medians over `calls` calls of a jax.profiler trace, two ways: `busy_s`,
    the union of its kernel (and copy) intervals, and `span_s`, from its first kernel's start to its
    last kernel's end, the idle gaps between kernels included. Neither counts the host's dispatch
    before the first kernel or its wait after the last, which the wall clock of a short call
    includes and a real step hides. None where the trace has no GPU events (the CPU backend)."""
    jax.block_until_ready(fn(*inputs[0]))
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d):
            for i in range(calls):
                with jax.profiler.StepTraceAnnotation(_CALL, step_num=i):
                    jax.block_until_ready(fn(*inputs[i % len(inputs)]))
        per_call = [trace.window_stats(s["events"]) for s in trace.steps(trace.load_events(d), _CALL) if s["events"]]
    if not per_call:
        return None
    return {"busy_s": 1e-6 * statistics.median(c["busy_us"] for c in per_call),
            "span_s": 1e-6 * statistics.median(c["window_us"] for c in per_call)}


def device_time_s(fn: Callable, inputs: Sequence[tuple], *, calls: int = 10) -> Optional[float]:
    """GPU seconds per call: `busy_s` of device_times."""
    times = device_times(fn, inputs, calls=calls)
    return None if times is None else times["busy_s"]


CMDBUF_FLAG = "--xla_enable_command_buffers_during_profiling=true"
PROFILE_KEYS = ("busy_us", "idle_us", "idle_fraction", "n_host_syncs", "n_graph_launches", "n_kernels")


def cmdbuf_during_profiling() -> bool:
    """Whether XLA_FLAGS asks XLA to keep its command buffers (CUDA graphs) while profiling. Without
    it a profiled step runs without graphs, so its GPU idle is no longer that of the timed step."""
    return CMDBUF_FLAG in os.environ.get("XLA_FLAGS", "")


def add_xla_flags(flags: Sequence[str]) -> bool:
    """Appends to XLA_FLAGS each of `flags` whose name (before "=") it does not set yet, where the
    backend has not started (XLA reads its flags once, then); an explicit setting is kept. Returns
    whether the backend had not started."""
    try:
        from jax._src import xla_bridge
        started = xla_bridge.backends_are_initialized()
    except (ImportError, AttributeError):
        started = True  # cannot tell: leave XLA_FLAGS as it is
    if started:
        return False
    current = os.environ.get("XLA_FLAGS", "")
    missing = [f for f in flags if f.split("=")[0] not in current]
    if missing:
        os.environ["XLA_FLAGS"] = " ".join([current, *missing]).strip()
    return True


def counted_call(f: Callable, *args) -> tuple:
    """(f(*args), blocked on; how far it moved each of te_async's host-size counters on GPU 0)."""
    before = host_size_stats(0)
    out = jax.block_until_ready(f(*args))
    after = host_size_stats(0)
    return out, {k: after[k] - before[k] for k in after}


def host_syncs(device: int = 0) -> int:
    """te_async's count of synchronous group-sizes reads on `device` so far (sync reads and async
    fallbacks). A GPU trace shows no cudaStreamSynchronize for them (CUPTI records only
    cuLaunchHostFunc on the host there), so a step's host syncs come from these counters."""
    stats = host_size_stats(device)
    return stats["sync_reads"] + stats["fallback_reads"]


def profile_steps(run_step: Callable[[int], object], log_dir, *, steps: int = 3, annotation: str = "step") -> tuple:
    """Bubble figures of the median of `steps` profiled steps, and that step's device window.

    run_step(i) runs step i and returns what to block on; each step runs inside its own
    StepTraceAnnotation and is blocked on there, so its kernels stay inside its annotation.
    Returns (fields, window): fields maps PROFILE_KEYS to that step's figures (n_host_syncs from
    te_async's counters, per step); window is its (start_us, end_us) on the trace's clock, for
    trace.timeline_intervals. On a backend without GPU events (the CPU) every field is None and
    the window is None: zeros would read as "no bubble".
    """
    syncs_before = host_syncs()
    with jax.profiler.trace(str(log_dir), create_perfetto_trace=True):
        for i in range(steps):
            with jax.profiler.StepTraceAnnotation(annotation, step_num=i):
                jax.block_until_ready(run_step(i))
    syncs = (host_syncs() - syncs_before) / steps
    analysis = trace.analyze_trace(str(log_dir), annotation=annotation)
    summary = analysis["summary"]
    if summary["no_gpu_events"]:
        return dict.fromkeys(PROFILE_KEYS), None
    s = analysis["steps"][summary["step"]]
    return {**{k: summary[k] for k in PROFILE_KEYS}, "n_host_syncs": syncs}, (s["start_us"], s["end_us"])


COLD_BYTES = 256 * 2**20  # more than any GPU's L2 several times over (H100 50 MB, H200 60 MB)


def hbm_bandwidth(gib: Optional[float] = None) -> float:
    """HBM read bandwidth, bytes per second: a sum over `gib` GiB, on its GPU time where there is one
    (the floor of a weight-reading kernel is its bytes over this). By default 2 GiB on a GPU and
    1/32 elsewhere, where the floor means little and a large probe is slow. A buffer smaller than
    COLD_BYTES is one of as many copies as fill it, read in turn, so that no read finds its bytes
    in L2 from the read before (a decode kernel's weights are cold too)."""
    gib = gib or (2.0 if jax.default_backend() == "gpu" else 1 / 32)
    n = int(gib * 2**30) // 4
    copies = [(jnp.full(n, 1.0 + i, dtype=jnp.float32),) for i in range(max(1, -(-COLD_BYTES // (4 * n))))]
    total = jax.jit(jnp.sum)
    calls = max(5, min(len(copies), 32))
    seconds = device_time_s(total, copies, calls=calls) or time_calls(total, copies, reps=10, inner=3).median_s
    return n * 4 / seconds


def dense_rate(m: int = 8192, n: int = 8192, k: int = 8192, dtype=jnp.bfloat16) -> float:
    """FLOP/s of a large dense GEMM through XLA, on random data."""
    key = jax.random.key(0)
    a = jax.random.normal(key, (m, k), dtype)
    b = jax.random.normal(jax.random.fold_in(key, 1), (k, n), dtype)
    t = time_calls(jax.jit(jnp.dot), [(a, b)], reps=10, inner=3)
    return 2 * m * n * k / t.median_s


def environment() -> dict:
    """Where a result came from, recorded in every benchmark's JSON: when, which source commit and
    build of te_async, which jax, backend, GPU and driver, and the XLA flags of the run."""
    dev = jax.devices()[0]
    cuda = _ffi.cuda_module()
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        **source_commit(),
        "cuda_extension_built": cuda_extension_built(),
        "cutlass_built": None if cuda is None else bool(cuda.CUTLASS_BUILT),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "backend": jax.default_backend(),
        "device": getattr(dev, "device_kind", str(dev)),
        "gpu_driver": _gpu_driver(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }


def _git(folder: str, *args: str) -> str:
    return subprocess.run(["git", "-C", folder, *args], capture_output=True, text=True, check=True, timeout=30).stdout.strip()


def source_commit() -> dict:
    """{"commit", "dirty", "tree"} of the te_async source tree. "tree" is git's id of its files as
    they are (tracked and untracked, ignored ones left out), which `git rev-parse <commit>^{tree}`
    matches: it names what ran even where the checkout's HEAD does not, as on the GPU machine,
    whose copy of the working tree carries an older .git. The checkout is the one holding the
    current directory (the GPU machine runs an installed wheel from the repository root), else
    the one holding this file (an editable install); it counts only if it is te_async's.
    TE_ASYNC_COMMIT, where set, names the commit (a copy without .git). "unknown" where neither
    is found."""
    found = {"commit": "unknown", "dirty": None, "tree": None}
    for folder in (os.getcwd(), os.path.dirname(__file__)):
        try:
            top = _git(folder, "rev-parse", "--show-toplevel")
            if os.path.exists(os.path.join(top, "te_async", "bench", "timing.py")):
                found = {"commit": _git(top, "rev-parse", "HEAD"),
                         "dirty": bool(_git(top, "status", "--porcelain")),  # untracked files too
                         "tree": _tree_id(top)}
                break
        except (OSError, subprocess.SubprocessError):
            continue
    if os.environ.get("TE_ASYNC_COMMIT"):
        found.update(commit=os.environ["TE_ASYNC_COMMIT"], dirty=None)
    return found


def _tree_id(top: str) -> str:
    """git's tree id of the checkout's files as they are, through a scratch index (the checkout's
    own index and HEAD stay as they were)."""
    with tempfile.TemporaryDirectory() as d:
        env = {**os.environ, "GIT_INDEX_FILE": os.path.join(d, "index")}
        subprocess.run(["git", "-C", top, "add", "-A"], env=env, capture_output=True, check=True, timeout=120)
        return subprocess.run(["git", "-C", top, "write-tree"], env=env, capture_output=True, text=True, check=True,
                              timeout=30).stdout.strip()


def _gpu_driver() -> Optional[str]:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    return out[0] if out else None
