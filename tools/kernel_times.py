"""Where a device-mode GEMM's time goes: per-kernel GPU durations and the gaps between them.

The decode-gemm benchmark times whole calls from the host; this runs the same layer stack (and,
with --prefill, the prefill GEMMs) under jax.profiler and reads the CUPTI kernel records, so the
time of each kernel and the idle time between kernels are separated. Run it under ncu
(`--no-trace`) to get the hardware counters of the same kernels.
"""
import argparse
import collections
import json
import re
import statistics
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

from te_async import grouped_gemm
from te_async.bench import attention, decode_gemm, prefill, presets, timing, trace, train


def _short(name: str) -> str:
    for key in ("SmallGroups", "SetupKernel", "GemmUniversal", "Portable"):
        at = name.find(key)
        if at >= 0:
            return name[at:at + 48]
    return name[:48]


def _label(e) -> str:
    """Kernel name, grid and CUDA graph node: fc1 and fc2 are different nodes of the layer's graph
    (every kernel of a step shares one HLO op, the command buffer), repeated on each scan trip."""
    args = e["args"]
    grid = re.search(r"grid:(\S+)", args.get("kernel_details", ""))
    node = args.get("cuda_graph_node_id", "")
    return _short(e["name"]) + (f" grid {grid.group(1)}" if grid else "") + (f" node ..{node[-4:]}" if node else "")


def _decode_inputs(model, tokens: int, layers: int, dtype, mode: str, unroll: bool):
    key = jax.random.key(0)
    w = decode_gemm.weights(model, key, layers, dtype)
    sets = decode_gemm.input_sets(model, key, np.random.default_rng(tokens), w, tokens, dtype)
    return decode_gemm.layer_stack(mode, decode_gemm.mean_active_experts(sets[:1]), unroll), sets[0]


def _prefill_inputs(preset: str, model, gemm: str, dtype):
    form, k, n = prefill.gemms(model)[gemm]
    key = jax.random.key(0)
    gs = jnp.asarray(prefill.splits(model, presets.prefill_tokens(preset))["even"], jnp.int32)
    rows = int(gs.sum())
    lhs = jax.random.normal(key, (rows, k), dtype)
    rhs = prefill.make_rhs(form, k, n, rows, key, dtype, model.experts)
    return jax.jit(lambda a, b, g: grouped_gemm(a, b, g, **prefill.FORMS[form], group_sizes_mode="device")), (lhs, rhs, gs)


def _train_inputs(preset: str, model, split: str, dtype):
    """bench train's 1-layer call in device mode: grouped_mlp forward + backward."""
    key = jax.random.key(0)
    gs = jnp.asarray(prefill.splits(model, presets.prefill_tokens(preset))[split], jnp.int32)
    rows = int(gs.sum())
    x, dy = (jax.random.normal(jax.random.fold_in(key, i), (rows, model.hidden), dtype) for i in (1, 2))
    w1 = jax.random.normal(key, (model.experts, model.hidden, 2 * model.ffn), dtype) / model.hidden**0.5
    w2 = jax.random.normal(key, (model.experts, model.ffn, model.hidden), dtype) / model.ffn**0.5
    return train.forward_backward("device"), (x, gs, [(w1, w2, jnp.ones((model.hidden,), jnp.float32))], dy)


def _attention_inputs(preset: str, contender: str, batch: int, layers: int):
    """bench attention's call (MLA: the whole absorbed attention) over 4096 cached tokens."""
    shape = attention.heads(presets.config(preset))
    mla = "nope" in shape
    ops = (attention.mla_operands if mla else attention.operands)(shape, batch, 4096, layers, jax.random.key(batch))
    return (attention.mla_scanned if mla else attention.scanned)(contender, shape["scale"], 4095, layers), ops


def report(label: str, fn, inputs, calls: int, use_trace: bool) -> None:
    jax.block_until_ready(fn(*inputs))  # compile and warm up outside the trace
    if not use_trace:
        for _ in range(calls):
            jax.block_until_ready(fn(*inputs))
        return
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d):
            for _ in range(calls):
                jax.block_until_ready(fn(*inputs))
        dev = trace.device_events(trace.load_events(d))
    kernels = [e for e in dev if e["kind"] == "kernel"]
    by_name = collections.defaultdict(list)
    for e in kernels:
        by_name[_label(e)].append(e["end"] - e["start"])
    stats = trace.window_stats(kernels, gap_threshold_us=0.0)
    print(f"\n== {label}: {len(kernels)} kernels in {calls} calls, busy {stats['busy_us'] / calls:.1f} us/call, "
          f"idle between kernels {stats['idle_us'] / calls:.1f} us/call (includes host gaps between calls)")
    gaps = sorted(g for _, g in stats["gaps"])
    if gaps:
        print(f"   gaps: {len(gaps)}, median {statistics.median(gaps):.2f} us, p90 {gaps[int(0.9 * (len(gaps) - 1))]:.2f} us")
    for name, durs in sorted(by_name.items(), key=lambda kv: -sum(kv[1])):
        print(f"   {len(durs):5d} x median {statistics.median(durs):8.2f} us  min {min(durs):8.2f}  {name}")
    print("   timeline of the last call's first kernels (start offset, duration, gap before, name):")
    last = kernels[-len(kernels) // calls:]
    for prev, e in zip([None] + last[:11], last[:12]):
        gap = 0.0 if prev is None else e["start"] - prev["end"]
        print(f"   {e['start'] - last[0]['start']:9.2f} {e['end'] - e['start']:8.2f} {gap:7.2f}  {_label(e)}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    presets.add_argument(p)
    p.add_argument("--batches", type=int, nargs="*", default=[1, 2])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--calls", type=int, default=5)
    p.add_argument("--prefill", nargs="*", default=[], choices=list(prefill.GEMMS))
    p.add_argument("--train", nargs="*", default=[], choices=["even", "skewed"],
                   help="bench train's 1-layer grouped_mlp forward + backward, device mode, on these splits")
    p.add_argument("--attention", nargs="*", default=[], choices=["xla", "te_async", "fused"],
                   help="bench attention's call per contender at --attention-batches (fused: MLA presets)")
    p.add_argument("--attention-batches", type=int, nargs="*", default=[1])
    p.add_argument("--no-trace", action="store_true", help="only run the calls (for ncu)")
    p.add_argument("--mode", default="device", choices=decode_gemm.MODES, help="decode-gemm's mode of the decode layers")
    p.add_argument("--unroll", action="store_true", help="decode layers unrolled, not scanned (decode-gemm --unroll)")
    args = p.parse_args()
    preset, model = presets.resolve(args.preset)
    print(json.dumps({"environment": timing.environment(), "preset": preset}))
    dtype = jnp.bfloat16
    for tokens in args.batches:
        fn, inputs = _decode_inputs(model, tokens, args.layers, dtype, args.mode, args.unroll)
        structure = "unrolled" if args.unroll else "scan"
        report(f"decode T={tokens}, {args.layers} layers of fc1 + fc2 per call ({args.mode}, {structure})", fn, inputs, args.calls,
               not args.no_trace)
    for gemm in args.prefill:
        fn, inputs = _prefill_inputs(preset, model, gemm, dtype)
        report(f"prefill {gemm} even", fn, inputs, args.calls, not args.no_trace)
    for contender in args.attention:
        for batch in args.attention_batches:
            fn, inputs = _attention_inputs(preset, contender, batch, args.layers)
            report(f"attention {contender} B={batch}, {args.layers} layers per call", fn, inputs, args.calls,
                   not args.no_trace)
    for split in args.train:
        fn, inputs = _train_inputs(preset, model, split, dtype)
        report(f"train {split}: grouped_mlp forward + backward, device mode", fn, inputs, args.calls, not args.no_trace)


if __name__ == "__main__":
    main()
