"""Wall-clock timing and the machine's two ceilings, shared by every benchmark.

Calls are timed back to back, blocking once per batch, so that XLA's asynchronous dispatch
hides the host's launch cost exactly as it does in a real step; a mode whose calls stall the
host (sync) pays for it here too. Inputs rotate across several sets so that repeated calls do
not measure the L2 cache.
"""

import datetime
import statistics
import time
from typing import Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np


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


def hbm_bandwidth(gib: float = 2.0) -> float:
    """Bytes per second of a large device copy, counting bytes read plus bytes written."""
    n = int(gib * 2**30) // 4
    x = jnp.arange(n, dtype=jnp.float32)
    copy = jax.jit(lambda a: a * 1.0001)
    t = time_calls(copy, [(x,)], reps=10, inner=3)
    return 2 * n * 4 / t.median_s


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
