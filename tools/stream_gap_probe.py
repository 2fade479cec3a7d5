"""Where a stream of back-to-back grouped GEMM calls spends the time that its kernels do not: a
profiler trace of 12 calls dispatched without blocking (bench prefill's stream measure), each
kernel with its duration and the idle time before it, for te_async's device mode and XLA's dense
GEMM of the same FLOPs, at DeepSeek-V2-Lite's fc1 and Qwen3-30B-A3B's fc2 (even splits).
Usage: python3 -P tools/stream_gap_probe.py"""
import tempfile

import jax
import jax.numpy as jnp

from te_async import grouped_gemm
from te_async.bench import trace

CASES = {"deepseek fc1": (64, 384, 2048, 2816), "qwen3 fc2": (128, 256, 768, 2048)}  # experts, rows each, K, N
CALLS = 12


def stream_trace(fn, sets):
    for i in range(3):
        jax.block_until_ready(fn(*sets[i % len(sets)]))
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d):
            out = [fn(*sets[i % len(sets)]) for i in range(CALLS)]
            jax.block_until_ready(out)
        return sorted(trace.timeline_intervals(trace.find_trace(d)), key=lambda iv: iv[1])


for case, (g, r, k, n) in CASES.items():
    key = jax.random.key(0)
    rhs = jax.random.normal(key, (g, k, n), jnp.bfloat16) / k ** 0.5
    sizes = jnp.full((g,), r, jnp.int32)
    sets = [(jax.random.normal(jax.random.fold_in(key, i), (g * r, k), jnp.bfloat16), rhs, sizes) for i in range(2)]
    fns = {"te_async device": jax.jit(lambda a, b, s: grouped_gemm(a, b, s, group_sizes_mode="device")),
           "XLA dense dot": jax.jit(lambda a, b, s: jnp.dot(a, b[0]))}
    for name, fn in fns.items():
        ivs = stream_trace(fn, sets)
        if not ivs:
            raise SystemExit("no GPU events in the trace: run it on a GPU")
        span = ivs[-1][1] + ivs[-1][2] - ivs[0][1]
        busy = sum(dur for _, _, dur, _ in ivs)
        print(f"== {case}, {name}: {len(ivs)} kernels in {CALLS} calls, span {span / CALLS:.1f} us a call, "
              f"kernels {busy / CALLS:.1f} us a call", flush=True)
        for kernel, dur, idle in list(trace.launches(ivs))[-8:]:
            print(f"   {kernel[:50]:50s} {dur:8.1f} us, idle before {idle:6.1f} us")
