"""Training step of the expert MLP: grouped_mlp forward + backward per mode, against torch and ragged_dot.

grouped_mlp (rmsnorm -> fc1 -> swiglu -> fc2), its output and its gradients with respect to the
input, both weights and the norm scale, for each group_sizes_mode, beside the same layer written
with torch._grouped_mm under torch's autograd (eager; where torch with CUDA imports: the GPU
machine has it), with jax.lax.ragged_dot, XLA's grouped GEMM (what plain JAX offers), and with
te_async.ragged_dot swapped in for it (the one-line switch of a JAX MoE stack). Rows are
those of a prefill: at DeepSeek-V2-Lite's shapes, 4096 tokens x top-6 = 24576 rows over 64
experts, split as the prefill benchmark splits them: even, and the skewed split from the
TransformerEngine stall report (docs/diagnosis-grouped-linear-stall.md; 12288 rows, with empty
experts).

A call runs a stack of layers, x + mlp_i(x) each with its own weights, forward and backward:
unrolled, or with --scan a scan over stacked weights, as JAX training stacks layers: jax.lax.scan,
te_async.scan (whose gradient does not zero-fill the stacked buffers), or each in turn in one run
(--scan lax te_async). Time per layer two ways, both wall clock (median over batches of
back-to-back calls): a 1-layer call, which carries the call's fixed cost, and the slope between a
1-layer and a --depth-layer call, which is what a layer adds to a model's step. TFLOP/s count the
six GEMMs alone, 2 * rows * K * N each over the routed rows: fc1 and fc2 forward, their input
gradients (dgrad) and their weight gradients (wgrad); the norm and the activation are left out.
On a GPU the 1-layer calls are also timed on GPU time: the profiler's kernel time (busy) for the
JAX contenders, CUDA events around back-to-back calls for torch.
"""

import itertools
import math
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from .. import GROUP_SIZES_MODES, grouped_mlp, ragged_dot, scan as te_async_scan
from ..mlp import normalize
from . import presets, timing, torch_reference
from .decode import ACTIVATION, EPS, NORM, ragged_dot_mlp
from .prefill import splits

REFERENCE = "xla_ragged_dot"
DROP_IN = "te_async_ragged_dot"  # the same layer as REFERENCE with te_async.ragged_dot swapped in
TORCH = "torch_grouped_mm"
CONTENDERS = (REFERENCE, *GROUP_SIZES_MODES, DROP_IN, TORCH)  # the reference first: the others are checked against it
SCANS = {"lax": jax.lax.scan, "te_async": te_async_scan}


def add_arguments(p) -> None:
    presets.add_argument(p)
    p.add_argument("--tokens", type=int, help="tokens of the prefill (default: 4096; 256 with --preset tiny)")
    p.add_argument("--contenders", nargs="*", default=list(CONTENDERS), choices=CONTENDERS,
                   help="default: all (torch_grouped_mm where torch has CUDA)")
    p.add_argument("--depth", type=presets.positive_int, default=4,
                   help="layers of the deeper call the per-layer slope is taken against (default: 4; 1: no slope)")
    p.add_argument("--scan", nargs="*", choices=tuple(SCANS),
                   help="the layer stack as a scan over stacked weights, as JAX training stacks layers: jax.lax.scan "
                        "(lax, what --scan alone runs) and/or te_async.scan, each contender under each (torch, eager, "
                        "is left out)")
    p.add_argument("--sizes-per-layer", action="store_true",
                   help="each layer routes its own size vector (the split rotated by the layer's index), as a model's "
                        "layers do; by default all layers share one, whose async copy XLA and JAX's scan make once")
    p.add_argument("--reps", type=int, default=30, help="timing samples of 3 calls each (default: 30)")


def layer(contender: str):
    """(x, group_sizes, w_fc1, w_fc2, norm_scale) -> y, through grouped_mlp, jax.lax.ragged_dot or
    te_async.ragged_dot (its default mode)."""
    if contender in (REFERENCE, DROP_IN):
        dot = jax.lax.ragged_dot if contender == REFERENCE else ragged_dot
        return lambda x, gs, w1, w2, scale: ragged_dot_mlp(normalize(x, scale, None, NORM, EPS), gs, w1, w2, dot)
    return lambda x, gs, w1, w2, scale: grouped_mlp(x, gs, w1, w2, norm_scale=scale, norm=NORM, eps=EPS,
                                                    activation=ACTIVATION, group_sizes_mode=contender)


def forward_backward(contender: str, scan: Optional[str] = None):
    """The jitted training step of a layer stack: (x, gs, weights, dy) -> (y, (dx, d weights)), where
    each layer adds its MLP to x and weights holds (w_fc1, w_fc2, norm_scale) per layer, or with
    `scan` ("lax" or "te_async", a key of SCANS) those three stacked over the layers, which that
    scan runs. gs: the group sizes [G] of every layer, or [layers, G], one row per layer."""

    def forward(x, gs, weights):
        sizes = (lambda i: gs[i]) if gs.ndim == 2 else (lambda i: gs)
        if scan:
            body = lambda c, w: (c + layer(contender)(c, sizes(w[0]), *w[1:]), None)
            return SCANS[scan](body, x, (jnp.arange(weights[0].shape[0]), *weights))[0]
        for i, (w1, w2, scale) in enumerate(weights):
            x = x + layer(contender)(x, sizes(i), w1, w2, scale)
        return x

    def step(x, gs, weights, dy):
        y, pullback = jax.vjp(lambda x_, w_: forward(x_, gs, w_), x, weights)
        return y, pullback(dy)

    return jax.jit(step)


def gemm_flops(rows: int, model) -> int:
    """The six GEMMs of a layer's training step: each of fc1 [rows, H] x [H, 2F] and fc2 [rows, F] x
    [F, H] forward, for the input gradient and for the weight gradient."""
    return 3 * (2 * rows * model.hidden * 2 * model.ffn + 2 * rows * model.ffn * model.hidden)


def _rel_error(out, ref) -> float:
    """The largest relative error over the output and the gradients (leaves in the same order)."""
    pairs = zip(jax.tree.leaves(out), jax.tree.leaves(ref))
    return max(float(np.linalg.norm(np.asarray(o, np.float32) - np.asarray(r, np.float32)) / np.linalg.norm(np.asarray(r, np.float32)))
               for o, r in pairs)


def _torch_case(sets):
    """(step, torch input sets, step's output as numpy leaves in the JAX contenders' order)."""
    step = torch_reference.mlp_stack_step(EPS)
    t = torch_reference.tensor
    torch_sets = [(t(x), t(gs), [(torch_reference.linear_weights(w1), torch_reference.linear_weights(w2), t(scale))
                                 for w1, w2, scale in weights], t(dy)) for x, gs, weights, dy in sets]

    def output(out):
        y, (dx, d_weights) = out
        leaves = [y, dx] + [g for dw1_t, dw2_t, dscale in d_weights for g in (dw1_t.transpose(1, 2), dw2_t.transpose(1, 2), dscale)]
        return [torch_reference.to_numpy(g) for g in leaves]

    return step, torch_sets, output


def _measure(name: str, sets, reps: int, profile: bool, scan: Optional[str]) -> tuple:
    """(wall-clock Timing, GPU busy seconds or None, the first set's output as leaves, te_async's
    host-size counters over one call or None for torch) of one contender."""
    if name == TORCH:
        step, torch_sets, output = _torch_case(sets)
        t = timing.time_calls(step, torch_sets, reps=reps, inner=3, block=torch_reference.block)
        gpu_s = torch_reference.gpu_seconds(step, torch_sets, calls=max(3, reps // 3)) if profile else None
        return t, gpu_s, output(step(*torch_sets[0])), None
    f = forward_backward(name, scan)
    t = timing.time_calls(f, sets, reps=reps, inner=3)
    gpu_s = timing.device_time_s(f, sets, calls=max(3, reps // 3)) if profile else None
    out, counts = timing.counted_call(f, *sets[0])
    return t, gpu_s, jax.tree.leaves(out), counts


def run(args) -> dict:
    dtype = jnp.bfloat16 if jax.default_backend() == "gpu" else jnp.float32
    preset, model = presets.resolve(args.preset)
    tokens = args.tokens or presets.prefill_tokens(preset)
    key = jax.random.key(0)
    normal = lambda i, shape, scale=1.0: jax.random.normal(jax.random.fold_in(key, i), shape, dtype) * scale
    weights = [(normal(100 + 3 * i, (model.experts, model.hidden, 2 * model.ffn), 1 / math.sqrt(model.hidden)),
                normal(101 + 3 * i, (model.experts, model.ffn, model.hidden), 1 / math.sqrt(model.ffn)),
                1 + 0.1 * jax.random.normal(jax.random.fold_in(key, 102 + 3 * i), (model.hidden,), jnp.float32))
               for i in range(args.depth)]
    stacked = args.scan is not None
    scans = (args.scan or ["lax"]) if stacked else [None]  # None: unrolled
    if stacked:
        weights = tuple(jnp.stack(w) for w in zip(*weights))
    layers = (lambda depth: tuple(w[:depth] for w in weights)) if stacked else (lambda depth: weights[:depth])
    names = [c for c in CONTENDERS if c in args.contenders and (c != TORCH or (jax.default_backend() == "gpu" and not stacked))]
    results = []
    for split, sizes in splits(model, tokens).items():
        rows = int(sum(sizes))

        def group_sizes(depth: int, sizes=sizes) -> jax.Array:
            """[G] for every layer, or with --sizes-per-layer [depth, G], layer i's split rotated by i."""
            return jnp.asarray([np.roll(sizes, i) for i in range(depth)] if args.sizes_per_layer else sizes, jnp.int32)

        flops = gemm_flops(rows, model)
        inputs = [(normal(10 + i, (rows, model.hidden)), normal(20 + i, (rows, model.hidden))) for i in range(2)]
        reference = None
        for scan, name in itertools.product(scans, names):
            if name == REFERENCE and reference is not None:
                continue  # once, under the first scan: every contender is checked against it
            row = {"split": split, "contender": name, "scan": scan, "rows": rows, "gemm_flops_per_layer": flops,
                   "rel_error_vs_ragged_dot": None}
            try:
                reps = args.reps if name != REFERENCE else max(5, args.reps // 6)  # ragged_dot is slow on a GPU
                depths = (1,) if name == REFERENCE or args.depth == 1 else (1, args.depth)
                per_depth = {}
                for depth in depths:
                    sets = [(x, group_sizes(depth), layers(depth), dy) for x, dy in inputs]
                    per_depth[depth] = _measure(name, sets, reps, profile=depth == 1, scan=scan)
                t1, gpu_s, out, _ = per_depth[1]
                deepest = max(per_depth)
                if per_depth[deepest][3] is not None:  # what the deepest call copied, waited for and reused
                    row["host_sizes"] = {"layers": deepest, **per_depth[deepest][3]}
                if name == REFERENCE:
                    reference = out
                elif reference is not None:
                    row["rel_error_vs_ragged_dot"] = _rel_error(out, reference)
                row.update(t1.as_dict(), tflops=flops / t1.median_s / 1e12,
                           gpu_tflops=None if gpu_s is None else flops / gpu_s / 1e12)
                if args.depth in per_depth and args.depth > 1:
                    slope_s = (per_depth[args.depth][0].median_s - t1.median_s) / (args.depth - 1)
                    row.update(depth=args.depth, slope_ms=1e3 * slope_s, slope_tflops=flops / slope_s / 1e12)
            except Exception as e:  # a contender that cannot run here is recorded, not fatal
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            results.append(row)
            print(_line(row), flush=True)
    result = {"benchmark": "train", "preset": preset, "shapes": model._asdict(), "tokens": tokens, "depth": args.depth,
              "scan": scans if stacked else None, "sizes_per_layer": args.sizes_per_layer,
              "dtype": jnp.dtype(dtype).name, "results": results}
    (args.out / "train.md").write_text(markdown(result))
    print(markdown(result))
    return result


_SCAN_NAMES = {"lax": "jax.lax.scan", "te_async": "te_async.scan"}


def _label(row) -> str:
    """The contender, and the scan it ran under where it ran under one."""
    return row["contender"] if row.get("scan") is None else f"{row['contender']}, {_SCAN_NAMES[row['scan']]}"


def _line(row) -> str:
    if "error" in row:
        return f"{row['split']:6s} {_label(row):16s} error: {row['error'][:160]}"
    gpu = "" if row["gpu_tflops"] is None else f" (GPU time {row['gpu_tflops']:6.3g})"
    slope = "" if "slope_ms" not in row else f"; slope over {row['depth']} layers {row['slope_ms']:.3f} ms {row['slope_tflops']:6.3g} TFLOP/s"
    err = "" if row["rel_error_vs_ragged_dot"] is None else f"  err vs ragged_dot {row['rel_error_vs_ragged_dot']:.1e}"
    return f"{row['split']:6s} {_label(row):16s} {row['median_ms']:9.3f} ms/layer {row['tflops']:7.3g} TFLOP/s{gpu}{slope}{err}"


def _cell(r) -> str:
    if "error" in r:
        return "error"
    gpu = "" if r.get("gpu_tflops") is None else f" / {r['gpu_tflops']:.3g}"
    one = f"{r['median_ms']:.3f} ({r['tflops']:.3g}{gpu})"
    return one if "slope_ms" not in r else f"{one}; slope {r['slope_ms']:.3f} ({r['slope_tflops']:.3g})"


def markdown(result) -> str:
    rows = result["results"]
    splits_run = list(dict.fromkeys(r["split"] for r in rows))
    lines = ["| contender | " + " | ".join(f"{s}: ms per layer (TFLOP/s)" for s in splits_run) + " |",
             "|---" * (len(splits_run) + 1) + "|"]
    for label in dict.fromkeys(map(_label, rows)):
        cells = [_cell(next(r for r in rows if r["split"] == split and _label(r) == label)) for split in splits_run]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    rows_by_split = ", ".join(f"{s} {next(r['rows'] for r in rows if r['split'] == s)}" for s in splits_run)
    lines.append("")
    for r in rows:
        counts = r.get("host_sizes")
        if counts and counts["copies"] + counts["sync_reads"]:
            lines.append(f"- {_label(r)}, {r['split']}: per {counts['layers']}-layer call "
                         + ", ".join(f"{counts[k]} {k.replace('_', ' ')}" for k in counts if k != "layers"))
    if lines[-1] != "":
        lines.append("")
    stack = "unrolled layers" if result["scan"] is None else \
        " and ".join(_SCAN_NAMES[s] for s in result["scan"]) + " over the layers"
    stack += ", each layer its own size vector (the split rotated)" if result.get("sizes_per_layer") else \
        ", one size vector for every layer"
    lines.append(f"grouped_mlp forward + backward, ms per layer ({stack}), {result['preset']}, {result['dtype']}, routed rows: "
                 f"{rows_by_split}. First a 1-layer call (wall clock, median of back-to-back calls; TFLOP/s of the six "
                 "GEMMs by wall clock / by GPU time: the call's kernel time from the profiler, for torch CUDA events around "
                 "back-to-back calls), then the slope "
                 f"between 1- and {result['depth']}-layer calls (wall clock).")
    return "\n".join(lines) + "\n"
