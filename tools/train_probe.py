"""Where a grouped_mlp training step's time goes, per layer, beyond what bench train reports: for
each case (split; unrolled layers, or a jax.lax.scan or te_async.scan over them; depth) the jitted
forward + backward of bench train in device mode, timed four ways — bench train's measure
(median of 3-call batches), 12 calls dispatched back to back, 12 batches of about 40 layers'
worth of calls back to back (the sustained rate: long enough for the GPU to reach its power cap)
and the profiler's GPU busy time of single calls — with the profiled call's GPU time per kernel (kernels_<case>.md), its timeline
(timeline_<case>.json) and train_probe.json (with the run's environment) written to --out.
Run `nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_event_reasons.active
--format=csv -lms 100` beside it to see the clocks.

    python3 -P tools/train_probe.py [--preset deepseek-v2-lite] --out DIR even:unrolled:1 even:unrolled:4 even:scan:2 even:te_async_scan:2 skewed:unrolled:4
"""
import argparse
import json
import math
import pathlib
import tempfile
import time
from typing import Optional

import jax
import jax.numpy as jnp

from te_async.bench import presets, timing, trace, train
from te_async.bench.prefill import splits

STACKS = {"unrolled": None, "scan": "lax", "te_async_scan": "te_async"}  # a case's stack: bench train's scan


def _weights(model, depth: int, scan: Optional[str]):
    key = jax.random.key(0)
    normal = lambda i, shape, scale: jax.random.normal(jax.random.fold_in(key, i), shape, jnp.bfloat16) * scale
    w = [(normal(100 + 3 * i, (model.experts, model.hidden, 2 * model.ffn), 1 / math.sqrt(model.hidden)),
          normal(101 + 3 * i, (model.experts, model.ffn, model.hidden), 1 / math.sqrt(model.ffn)),
          1 + 0.1 * jax.random.normal(jax.random.fold_in(key, 102 + 3 * i), (model.hidden,), jnp.float32))
         for i in range(depth)]
    return tuple(jnp.stack(t) for t in zip(*w)) if scan else w


def _profile(f, inputs, out: pathlib.Path, name: str) -> dict:
    """bench's profile of the median of 5 calls (timing.profile_steps), with its GPU time per kernel
    and timeline written beside; empty where the backend has no GPU events."""
    with tempfile.TemporaryDirectory() as d:
        fields, window = timing.profile_steps(lambda i: f(*inputs[i % len(inputs)]), d, steps=5, annotation="probe")
        if window is None:
            return fields
        intervals = trace.timeline_intervals(d, window=window)
    (out / f"kernels_{name}.md").write_text(trace.kernel_markdown({name: intervals}, top=40))
    (out / f"timeline_{name}.json").write_text(json.dumps(intervals))
    return fields


def case_arg(case: str) -> str:
    """split:unrolled|scan|te_async_scan:depth, checked (argparse's type)."""
    parts = case.split(":")
    if (len(parts) != 3 or parts[0] not in ("even", "skewed") or parts[1] not in STACKS
            or not parts[2].isdigit() or int(parts[2]) < 1):
        raise argparse.ArgumentTypeError(f"a case is split:unrolled|scan|te_async_scan:depth (split even or skewed, depth >= 1), got {case!r}")
    return case


def probe(case: str, preset: str, model, out: pathlib.Path) -> dict:
    split, kind, depth = case.split(":")
    depth, scan = int(depth), STACKS[kind]
    sizes = splits(model, presets.prefill_tokens(preset))[split]
    rows, gs = int(sum(sizes)), jnp.asarray(sizes, jnp.int32)
    key = jax.random.key(1)
    x = lambda i: jax.random.normal(jax.random.fold_in(key, i), (rows, model.hidden), jnp.bfloat16)
    w = _weights(model, depth, scan)
    inputs = [(x(10 + i), gs, w, x(20 + i)) for i in range(2)]
    f = train.forward_backward("device", scan)
    for i in range(3):
        jax.block_until_ready(f(*inputs[i % 2]))
    t0 = time.perf_counter()
    outs = [f(*inputs[i % 2]) for i in range(12)]
    t1 = time.perf_counter()
    jax.block_until_ready(outs)
    res = dict(case=case, host_dispatch_ms=1e3 * (t1 - t0) / 12, back_to_back_12_ms=1e3 * (time.perf_counter() - t0) / 12)
    del outs
    res["bench_train_ms"] = 1e3 * timing.time_calls(f, inputs, reps=20, inner=3).median_s
    sustained = []
    for _ in range(12):
        n = max(2, 40 // depth)
        t0 = time.perf_counter()
        jax.block_until_ready([f(*inputs[i % 2]) for i in range(n)])
        sustained.append(round(1e3 * (time.perf_counter() - t0) / n / depth, 3))
    res["sustained_ms_per_layer"] = sustained
    res.update(_profile(f, inputs, out, case.replace(":", "_")))
    flops = train.gemm_flops(rows, model) * depth
    busy = res["busy_us"] or math.nan  # None: no GPU events (the CPU)
    res.update(per_layer_bench_train_ms=res["bench_train_ms"] / depth, per_layer_busy_ms=busy / 1e3 / depth,
               gemm_tflops_bench_train=flops / res["bench_train_ms"] / 1e9, gemm_tflops_busy=flops / busy / 1e6)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cases", nargs="+", type=case_arg, help="split:unrolled|scan|te_async_scan:depth, split one of bench prefill's (even, skewed)")
    ap.add_argument("--out", type=pathlib.Path, default=pathlib.Path("out"))
    presets.add_argument(ap)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    preset, model = presets.resolve(args.preset)
    report = []
    for case in args.cases:
        report.append(probe(case, preset, model, args.out))
        print(json.dumps(report[-1]), flush=True)
    (args.out / "train_probe.json").write_text(json.dumps(dict(environment=timing.environment(), cases=report), indent=1))


if __name__ == "__main__":
    main()
