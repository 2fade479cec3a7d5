"""Wall-clock timing, GPU time from a profiler trace, and the machine's two ceilings, shared by
every benchmark.

Calls are timed back to back, blocking once per batch, so that XLA's asynchronous dispatch
hides the host's launch cost exactly as it does in a real step; a mode whose calls stall the
host (sync) pays for it here too. Inputs rotate across several sets so that repeated calls do
not measure the L2 cache.
"""

import datetime
import statistics
import tempfile
import time
from typing import Callable, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from . import trace


class Timing(NamedTuple):
    median_s: float
    p10_s: float
    p90_s: float
    samples: int

    def as_dict(self) -> dict:
        return {"median_ms": 1e3 * self.median_s, "p10_ms": 1e3 * self.p10_s, "p90_ms": 1e3 * self.p90_s, "samples": self.samples}


def time_calls(fn: Callable, inputs: Sequence[tuple], *, reps: int = 30, inner: int = 5, warmup: int = 3) -> Timing:
    """Seconds per call of fn(*inputs[i]): `reps` batches of `inner` calls, median over batches."""
    for i in range(warmup):
        jax.block_until_ready(fn(*inputs[i % len(inputs)]))
    per_call = []
    for r in range(reps):
        t0 = time.perf_counter()
        out = None
        for i in range(inner):
            out = fn(*inputs[(r * inner + i) % len(inputs)])
        jax.block_until_ready(out)
        per_call.append((time.perf_counter() - t0) / inner)
    q = np.percentile(per_call, [10, 90])
    return Timing(statistics.median(per_call), float(q[0]), float(q[1]), reps)


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


def hbm_bandwidth(gib: float = 2.0) -> float:
    """HBM read bandwidth, bytes per second: a sum over `gib` GiB, on its GPU time where there is one
    (the floor of a weight-reading kernel is its bytes over this)."""
    n = int(gib * 2**30) // 4
    x = jnp.ones(n, dtype=jnp.float32)
    total = jax.jit(jnp.sum)
    seconds = device_time_s(total, [(x,)], calls=5) or time_calls(total, [(x,)], reps=10, inner=3).median_s
    return n * 4 / seconds


def dense_rate(m: int = 8192, n: int = 8192, k: int = 8192, dtype=jnp.bfloat16) -> float:
    """FLOP/s of a large dense GEMM through XLA, on random data."""
    key = jax.random.key(0)
    a = jax.random.normal(key, (m, k), dtype)
    b = jax.random.normal(jax.random.fold_in(key, 1), (k, n), dtype)
    t = time_calls(jax.jit(jnp.dot), [(a, b)], reps=10, inner=3)
    return 2 * m * n * k / t.median_s


def environment() -> dict:
    dev = jax.devices()[0]
    return {
        "date": datetime.date.today().isoformat(),
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "device": getattr(dev, "device_kind", str(dev)),
    }
