"""Dense GEMMs at decode sizes: te_async.dense.linear's kernels against XLA's GEMM.

The dense GEMMs of one MoE decoder layer of a model (on a GPU by default DeepSeek-V2-Lite's:
the attention projections, the router, the shared experts' fc1 and fc2) and its LM head, at B
rows (the batch of a decode step), each two ways: "te_async" (linear(..., kernel="te_async"):
the CUDA-core small-M kernel up to dense.CUDA_CORE_ROWS rows, the tensor-core one past them where
it fits, K split over a thread-block cluster; they read [K, N] weights only, so the LM head,
[V, H], has no te_async column) and "xla" (linear(..., kernel="xla"): XLA's dot). Also
"shared MLP": the shared experts' whole SwiGLU MLP (fc1, then fc2 with the activation fused into
its load on the te_async path), the dense MLP the fused-decode issue names, also at one row as
"token_ffn" (te_async.token_ffn: both GEMMs and the activation in one kernel). One call runs the GEMM on L
copies of the weights (L = --layers, together past L2), unrolled in one jit, so that the call is
one CUDA graph: a GEMM's time is the call's wall clock over L, and its GPU busy time that of a
profile of the same calls over L. A lax.scan would add a trip's fixed cost to every GEMM instead
(about 10 us of host time, more than these GEMMs take; tools/scan_trip_probe.py), which a decode
step whose layers keep the GPU busy longer than that hides. The floor is the weights' bytes over
the HBM read bandwidth of the same run.
"""

import jax
import jax.numpy as jnp
import numpy as np

from .. import dense, models, token_ffn
from ..models.ffn import swiglu_mlp
from . import presets, timing

KERNELS = ("xla", "te_async", "token_ffn")


def add_arguments(p) -> None:
    presets.add_argument(p)
    p.add_argument("--rows", type=presets.positive_int, nargs="+", help="B, rows per GEMM (default: 1 2 4 8 16)")
    p.add_argument("--layers", type=presets.positive_int, help="weight copies per call (default: 26 on a GPU, 2 elsewhere)")
    p.add_argument("--reps", type=presets.positive_int, default=20, help="timing samples of 5 calls each (default: 20)")


def gemms(config) -> dict:
    """{name: (K, N, transpose_w)} of one MoE layer's dense GEMMs and the LM head, from param_shapes."""
    shapes = models.param_shapes(config)
    run = next(r for r in shapes["layers"] if "moe" in r)
    out = {f"attn.{k}": (*s.shape[1:], False) if k not in models.params.OUT_IN_LEAVES else (*s.shape[:0:-1], True)
           for k, s in run["attn"].items() if len(s.shape) == 3}
    out["router"] = (*run["moe"]["router"].shape[1:], False)
    for k, s in run["moe"].get("shared", {}).items():
        out[f"shared.{k}"] = (*s.shape[1:], False)
    head = shapes.get("lm_head", shapes["embed"])
    out["lm_head"] = (head.shape[1], head.shape[0], True)
    return out


def _shared_mlp(kernel, rows, hidden):
    if kernel == "token_ffn" and (rows > 1 or hidden > token_ffn.MAX_HIDDEN):
        return None  # the kernel takes one token of at most MAX_HIDDEN features (DeepSeek-V3's 7168 are past it)
    return lambda x, w_gate_up, w_down: swiglu_mlp({"w_gate_up": w_gate_up, "w_down": w_down}, x, kernel)


def _unrolled(fn):
    """One call: fn(x, *copy) for each weight copy, unrolled (one CUDA graph, no loop)."""
    return jax.jit(lambda x, copies: [fn(x, *c) for c in copies])


def run(args) -> dict:
    gpu = jax.default_backend() == "gpu"
    name = presets.default_name(args.preset)
    config = presets.config(name)
    rows_list = args.rows or ([1, 2, 4, 8, 16] if gpu else [1, 2])
    layers = args.layers or (26 if gpu else 2)
    hbm = timing.hbm_bandwidth()
    dtype = jnp.bfloat16
    key = jax.random.key(0)
    cases = {}
    for gemm, (k, n, transpose) in gemms(config).items():
        w_dtype = jnp.float32 if gemm == "router" else dtype  # routers are float32 (models.params)
        cases[gemm] = (k, [((layers, n, k) if transpose else (layers, k, n), w_dtype)],
                       lambda kern, rows, t=transpose: None if kern == "token_ffn" or (t and kern == "te_async") else
                       (lambda x, w: dense.linear(x, w, transpose_w=t, kernel=kern)))
    if config.shared_intermediate_size:
        f = config.shared_intermediate_size
        cases["shared MLP"] = (config.hidden_size, [((layers, config.hidden_size, 2 * f), dtype),
                                                    ((layers, f, config.hidden_size), dtype)],
                                lambda kern, rows: _shared_mlp(kern, rows, config.hidden_size))
    print(f"dense: {name}, {layers} weight copies per call, HBM read {hbm / 1e12:.2f} TB/s, rows {rows_list}", flush=True)
    results = []
    for case, (k, weight_shapes, make) in cases.items():
        copies = [tuple(jax.random.normal(jax.random.fold_in(key, i), s[1:], d) for s, d in weight_shapes)
                  for i in range(layers)]
        floor_s = sum(np.prod(s[1:]) * jnp.dtype(d).itemsize for s, d in weight_shapes) / hbm
        for rows in rows_list:
            x = jax.random.normal(key, (rows, k), weight_shapes[0][1])
            row = dict(gemm=case, rows=rows, k=k, shapes=[list(s[1:]) for s, _ in weight_shapes],
                       floor_us=1e6 * floor_s)
            for kern in KERNELS:
                fn = make(kern, rows)
                if fn is None:
                    row[f"{kern}_us"] = row[f"{kern}_gpu_us"] = None
                    continue
                call = _unrolled(fn)
                row[f"{kern}_us"] = 1e6 * timing.time_calls(call, [(x, copies)], reps=args.reps).median_s / layers
                gpu = timing.device_times(call, [(x, copies)])
                row[f"{kern}_gpu_us"] = None if gpu is None else 1e6 * gpu["busy_s"] / layers
            results.append(row)
            print(f"  {case:12s} B={rows:<3d} floor {row['floor_us']:7.2f} us  "
                  + "  ".join(f"{kern} {row[f'{kern}_us'] or float('nan'):7.2f}" for kern in KERNELS), flush=True)
        del copies
    table = markdown(results)
    (args.out / "dense.md").write_text(table)
    print(table)
    return {"benchmark": "dense", "config": dict(preset=name, layers=layers, rows=rows_list, dtype="bfloat16",
                                                 reps=args.reps), "hbm_bytes_per_s": hbm, "results": results}


def markdown(results) -> str:
    """One row per GEMM and B: floor, then each kernel's wall clock and GPU busy µs, with their
    ratios to the floor."""
    cell = lambda us, floor: "-" if us is None else f"{us:.2f} ({us / floor:.1f}x)"
    head = " | ".join(f"{k} us | {k} GPU us" for k in KERNELS)
    lines = [f"| GEMM | [K, N] | B | floor us | {head} |", "|---|---|---|---|" + "---|---|" * len(KERNELS)]
    for r in results:
        cells = [cell(r[f"{k}{part}_us"], r["floor_us"]) for k in KERNELS for part in ("", "_gpu")]
        lines.append(f"| {r['gemm']} | {' + '.join(map(str, r['shapes']))} | {r['rows']} | {r['floor_us']:.2f} | "
                     + " | ".join(cells) + " |")
    lines += ["", "Per GEMM: wall clock of one call over its weight copies (one CUDA graph), and the GPU busy "
              "time of a profile of the same calls, each over the copies; ratio to the floor (the weights' "
              "bytes over the measured HBM read bandwidth)."]
    return "\n".join(lines) + "\n"
