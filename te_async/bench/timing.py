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


def device_time_s(fn: Callable, inputs: Sequence[tuple], *, calls: int = 10) -> Optional[float]:
    """GPU seconds per call: the union of the kernel (and copy) intervals that a jax.profiler trace
    records, over `calls` calls. This is the kernels' own time, without the host's dispatch and
    synchronisation, which the wall clock of a single op includes and a real step hides. None
    where the trace has no GPU events (the CPU backend)."""
    jax.block_until_ready(fn(*inputs[0]))
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d):
            for i in range(calls):
                jax.block_until_ready(fn(*inputs[i % len(inputs)]))
        events = trace.device_events(trace.load_events(d))
    if not events:
        return None
    return 1e-6 * trace.window_stats(events)["busy_us"] / calls


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
