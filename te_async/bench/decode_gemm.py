"""Decode-size expert GEMMs against their floor: fc1 + fc2 of one MoE layer per mode.

A model's experts (on a GPU by default DeepSeek-V2-Lite's: 64, hidden 2048, ffn 1408, top-6) at
T tokens: M = top_k * T rows routed to at most M distinct experts. At these sizes the weights,
not the math, set the time, so the floor of a layer is its active experts' fc1 + fc2 bytes over
the HBM read bandwidth measured in the same run. One call runs a scan over L stacked layers
(fresh weights and routing per layer, so no layer finds its weights in L2). The time of a layer
is the slope between calls of L and 2L layers: what one more layer adds to a step, with the
call's fixed dispatch and synchronisation cost (which a real step pays once, not per layer)
taken out, and the gaps between the kernels of a layer kept in. It is taken on the GPU's clock
(each call's span from its first kernel's start to its last kernel's end, from a profiler trace;
the median call, the smaller of two traces) and on the host's wall clock, which also carries the
host's jitter. The GPU time of a layer (its kernels alone, gaps left out) is reported beside
them.

Modes: "device", "sync" and "async" run fc1 and fc2 as two independent grouped_gemm calls (fc2 on
its own random h). "mlp" runs the layer as grouped_mlp does at inference (norm=None, device
mode): fc1, XLA's activation and fc2 chained. Same bytes, so the same floor.
Two references show what XLA's own kernels take for those bytes when the host knows which experts
are active (no group sizes to read): "read" sums the rows of fc1's and fc2's weights of A experts
(A = the mean active count rounded; no GEMM), and "dense" runs fc1 and fc2 as batched GEMMs over
those A experts with M // A rows each. Their floor is A experts' bytes.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np

from .. import grouped_gemm, grouped_mlp, plan
from . import presets, timing

MODES = ("device", "mlp", "read", "dense", "sync", "async")
REFERENCE_MODES = ("read", "dense")


def add_arguments(p) -> None:
    presets.add_argument(p)
    p.add_argument("--batches", type=int, nargs="*", help="tokens T (default: 1 to 64, powers of 2, on a GPU; 1 4 16 elsewhere)")
    p.add_argument("--layers", type=int,
                   help="layers of the shorter timed call; the longer has twice as many (default: 8 on a GPU, 2 elsewhere)")
    p.add_argument("--modes", nargs="*", default=list(MODES), choices=MODES, help="default: all")
    p.add_argument("--reps", type=int, default=30, help="timing samples of 3 calls each (default: 30)")
    p.add_argument("--unroll", action="store_true", help="unroll the layers into one flat graph instead of scanning them (all modes)")


def routed_sizes(model, rng, layers: int, tokens: int) -> np.ndarray:
    """int32 [L, E]: each token picks top_k distinct experts uniformly, as a balanced router does."""
    sizes = np.zeros((layers, model.experts), np.int32)
    for layer in range(layers):
        for _ in range(tokens):
            sizes[layer, rng.choice(model.experts, model.top_k, replace=False)] += 1
    return sizes


def mean_active_experts(sets: list) -> float:
    """Active experts per layer, averaged over the layers of input_sets' argument sets."""
    return float(np.mean([np.count_nonzero(np.asarray(s[-1])) / s[-1].shape[0] for s in sets]))


def read_experts(active: float) -> int:
    """The whole experts that the reference modes read for a mean active count."""
    return max(1, round(active))


def _reference_layer(mode: str, experts: int, w1_l, w2_l, x_l, h_l):
    """One layer of a reference mode over the first `experts` experts of the layer's weights."""
    w1_e, w2_e = w1_l[:experts], w2_l[:experts]
    if mode == "read":
        return jnp.sum(w1_e, axis=-1, dtype=jnp.float32), jnp.sum(w2_e, axis=-1, dtype=jnp.float32)
    rows = max(1, x_l.shape[0] // experts)  # "dense": the same rows per expert for all of them
    x_e = x_l[: experts * rows].reshape(experts, rows, -1)
    h_e = h_l[: experts * rows].reshape(experts, rows, -1)
    return jnp.einsum("erk,ekn->ern", x_e, w1_e), jnp.einsum("erk,ekn->ern", h_e, w2_e)


def _layer(mode: str, active: float, w1_l, w2_l, x_l, h_l, gs_l):
    if mode in REFERENCE_MODES:
        return _reference_layer(mode, read_experts(active), w1_l, w2_l, x_l, h_l)
    if mode == "mlp":
        return grouped_mlp(x_l, gs_l, w1_l, w2_l, norm=None, group_sizes_mode="device")
    return grouped_gemm(x_l, w1_l, gs_l, group_sizes_mode=mode), grouped_gemm(h_l, w2_l, gs_l, group_sizes_mode=mode)


def layer_stack(mode: str, active: float, unroll: bool = False):
    """A jitted call over the L stacked layers: a scan, or the layers unrolled (one flat graph, no
    loop). The reference modes are always unrolled: in a scan, XLA transposes the whole weight
    stacks once per call before its reductions (5.3 ms for 8 layers on an H200)."""
    def step(w1, w2, x, h, gs):
        if unroll or mode in REFERENCE_MODES:
            layers = [_layer(mode, active, *(a[i] for a in (w1, w2, x, h, gs))) for i in range(w1.shape[0])]
            return jax.tree.map(lambda *ys: jnp.stack(ys), *layers)
        return jax.lax.scan(lambda _, inputs: (None, _layer(mode, active, *inputs)), None, (w1, w2, x, h, gs))[1]

    return jax.jit(step)


def weights(model, key, layers: int, dtype) -> tuple:
    """fc1 (swiglu: [gate | linear]) and fc2 weights of `layers` layers, made once and shared by every batch size."""
    e, hidden, ffn = model.experts, model.hidden, model.ffn
    w1 = jax.random.normal(key, (layers, e, hidden, 2 * ffn), dtype) / math.sqrt(hidden)
    w2 = jax.random.normal(jax.random.fold_in(key, 1), (layers, e, ffn, hidden), dtype) / math.sqrt(ffn)
    return w1, w2


def input_sets(model, key, rng, w: tuple, tokens: int, dtype) -> list:
    """Three rotated argument sets of layer_stack: the weights `w`, fresh routing and activations."""
    layers = w[0].shape[0]
    rows = tokens * model.top_k
    sets = []
    for i in range(3):  # rotated, so each call routes differently
        sizes = routed_sizes(model, rng, layers, tokens)
        x = jax.random.normal(jax.random.fold_in(key, 10 + i), (layers, rows, model.hidden), dtype)
        h = jax.random.normal(jax.random.fold_in(key, 20 + i), (layers, rows, model.ffn), dtype)
        sets.append((*w, x, h, jnp.asarray(sizes)))
    return sets


def _steady_device_times(step, sets: list, calls: int, rounds: int = 2):
    """device_times' medians, the smaller of `rounds` traces: a slowdown that spans one trace
    (as one run at T=1 showed, a 24 us/layer slope over kernels of 32 us) does not become a slope."""
    times = [timing.device_times(step, sets, calls=calls) for _ in range(rounds)]
    return None if times[0] is None else {k: min(t[k] for t in times) for k in times[0]}


def run(args) -> dict:
    gpu = jax.default_backend() == "gpu"
    dtype = jnp.bfloat16 if gpu else jnp.float32
    preset, model = presets.resolve(args.preset)
    expert_bytes = model.expert_bytes(dtype)
    layers = args.layers or (8 if gpu else 2)
    key = jax.random.key(0)
    bandwidth = timing.hbm_bandwidth()
    rng = np.random.default_rng(0)
    w_short, w_long = weights(model, key, layers, dtype), weights(model, key, 2 * layers, dtype)
    results = []
    for tokens in args.batches or ([1, 2, 4, 8, 16, 32, 64] if gpu else [1, 4, 16]):
        rows = tokens * model.top_k
        short = input_sets(model, key, rng, w_short, tokens, dtype)
        long = input_sets(model, key, rng, w_long, tokens, dtype)
        active = mean_active_experts(long)
        floor_us = 1e6 * active * expert_bytes / bandwidth
        kernels = "/".join(plan.plan_device_gemm(plan.GemmShape(model.experts, rows, k, n, dtype=jnp.dtype(dtype).name)).label
                           for k, n in ((model.hidden, 2 * model.ffn), (model.ffn, model.hidden)))
        reference = {}  # the first output of each kind (the two GEMMs', the MLP's, a reference's), for rel_error_vs_first
        for mode in args.modes:
            row = {"tokens": tokens, "rows": rows, "mode": mode, "active_experts": float(active), "floor_us": floor_us}
            if mode in REFERENCE_MODES:
                experts = read_experts(active)
                row.update(read_experts=experts, floor_us=1e6 * experts * expert_bytes / bandwidth)
            if mode == "device":
                row["kernels"] = kernels
            try:
                step = layer_stack(mode, active, args.unroll)
                t_short = timing.time_calls(step, short, reps=args.reps, inner=3)
                t_long = timing.time_calls(step, long, reps=args.reps, inner=3)
                host_layer_us = 1e6 * (t_long.median_s - t_short.median_s) / layers
                d_short, d_long = (_steady_device_times(step, sets, args.reps) for sets in (short, long))
                # The GPU's slope where there is a GPU trace; the host's otherwise (CPU backend).
                layer_us = host_layer_us if d_long is None else 1e6 * (d_long["span_s"] - d_short["span_s"]) / layers
                row.update(t_long.as_dict(), layer_us=layer_us, ratio_to_floor=layer_us / floor_us,
                           host_layer_us=host_layer_us, per_call_layer_us=1e6 * t_long.median_s / (2 * layers),
                           gpu_layer_us=None if d_long is None else 1e6 * d_long["busy_s"] / (2 * layers))
                out = [np.asarray(y, np.float32) for y in jax.tree.leaves(step(*long[0]))]
                first = reference.setdefault(mode if mode in ("mlp", *REFERENCE_MODES) else "gemm", out)
                row["rel_error_vs_first"] = float(max(np.linalg.norm(o - r) / max(np.linalg.norm(r), 1e-30) for o, r in zip(out, first)))
            except Exception as e:  # recorded, not fatal: one mode failing must not hide the others
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            results.append(row)
            print(_line(row), flush=True)
    result = {"benchmark": "decode_gemm", "preset": preset, "shapes": model._asdict(), "hbm_bytes_per_s": bandwidth,
              "layers_per_call": [layers, 2 * layers], "unrolled": args.unroll, "results": results}
    (args.out / "decode_gemm.md").write_text(markdown(result))
    print(markdown(result))
    return result


def _line(row) -> str:
    if "error" in row:
        return f"T={row['tokens']:3d} {row['mode']:7s} error: {row['error'][:160]}"
    gpu = "" if row["gpu_layer_us"] is None else f"  kernels {row['gpu_layer_us']:7.1f} us"
    return (f"T={row['tokens']:3d} {row['mode']:7s} {row['layer_us']:8.1f} us/layer  floor {row['floor_us']:7.1f} us"
            f"  ratio {row['ratio_to_floor']:5.2f}{gpu}  host slope {row['host_layer_us']:7.1f} us"
            f"  per call {row['per_call_layer_us']:7.1f} us/layer"
            f"  err {row['rel_error_vs_first']:.1e}")


def markdown(result) -> str:
    rows = result["results"]
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    lines = ["| T | active experts | floor µs | " + " | ".join(f"{m} µs (× floor)" for m in modes)
             + " | device, host clock µs | device kernels µs | device kernels |", "|---" * (len(modes) + 6) + "|"]
    for tokens in dict.fromkeys(r["tokens"] for r in rows):
        at = {r["mode"]: r for r in rows if r["tokens"] == tokens}
        first = next(iter(at.values()))
        cells = ["error" if "error" in at[m] else f"{at[m]['layer_us']:.1f} ({at[m]['ratio_to_floor']:.2f}×)" for m in modes]
        device = at.get("device", {})
        host = "" if "host_layer_us" not in device else f"{device['host_layer_us']:.1f} ({device['host_layer_us'] / device['floor_us']:.2f}×)"
        gpu = "" if device.get("gpu_layer_us") is None else f"{device['gpu_layer_us']:.1f}"
        kernels = device.get("kernels", "")
        lines.append(f"| {tokens} | {first['active_experts']:.1f} | {first['floor_us']:.1f} | " + " | ".join(cells)
                     + f" | {host} | {gpu} | {kernels} |")
    lines.append("")
    short, long = result["layers_per_call"]
    structure = "layers unrolled" if result.get("unrolled") else "layers in a scan, read and dense unrolled"
    lines.append(f"fc1 + fc2 per layer ({structure}): the slope between calls of {short} and {long} layers, on the GPU's clock (median "
                 f"span from a call's first kernel to its last, profiler) where there is a GPU, and on the host's wall "
                 f"clock (medians over {rows[0].get('samples', '?')} batches of 3 calls). Device kernels: the device-mode "
                 f"kernels alone (gaps left out) of a {long}-layer call, per layer. Floor: the active experts' bytes over "
                 f"the HBM read bandwidth, {result['hbm_bytes_per_s'] / 1e12:.2f} TB/s; read's and dense's own floor is that of "
                 f"the whole experts they read (the active count rounded).")
    return "\n".join(lines) + "\n"
