"""Training step of the expert MLP: grouped_mlp forward + backward per mode, against ragged_dot's.

grouped_mlp (rmsnorm -> fc1 -> swiglu -> fc2), its output and its gradients with respect to the
input, both weights and the norm scale, for each group_sizes_mode, beside the same layer written
with jax.lax.ragged_dot, XLA's grouped GEMM (what plain JAX offers). Rows are those of a
prefill: at DeepSeek-V2-Lite's shapes, 4096 tokens x top-6 = 24576 rows over 64 experts, split
as the prefill benchmark splits them: even, and the skewed split from the TransformerEngine stall
report (docs/diagnosis-grouped-linear-stall.md; 12288 rows, with empty experts).

Time: per call of one jitted forward + backward of the layer, i.e. per layer, the median over
batches of back-to-back calls (wall clock), and on a GPU the call's kernel time from the
profiler. TFLOP/s count the six GEMMs alone, 2 * rows * K * N each over the routed rows: fc1 and
fc2 forward, their input gradients (dgrad) and their weight gradients (wgrad); the norm and the
activation are left out.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np

from .. import GROUP_SIZES_MODES, grouped_mlp
from ..mlp import normalize
from . import presets, timing
from .decode import ACTIVATION, EPS, NORM, ragged_dot_mlp
from .prefill import splits

REFERENCE = "xla_ragged_dot"
CONTENDERS = (REFERENCE, *GROUP_SIZES_MODES)  # the reference first: the others are checked against it


def add_arguments(p) -> None:
    presets.add_argument(p)
    p.add_argument("--tokens", type=int, help="tokens of the prefill (default: 4096; 256 with --preset tiny)")
    p.add_argument("--contenders", nargs="*", default=list(CONTENDERS), choices=CONTENDERS, help="default: all")
    p.add_argument("--reps", type=int, default=30, help="timing samples of 3 calls each (default: 30)")


def layer(contender: str):
    """(x, group_sizes, w_fc1, w_fc2, norm_scale) -> y, through grouped_mlp or ragged_dot."""
    if contender == REFERENCE:
        return lambda x, gs, w1, w2, scale: ragged_dot_mlp(normalize(x, scale, None, NORM, EPS), gs, w1, w2)
    return lambda x, gs, w1, w2, scale: grouped_mlp(x, gs, w1, w2, norm_scale=scale, norm=NORM, eps=EPS,
                                                    activation=ACTIVATION, group_sizes_mode=contender)


def forward_backward(contender: str):
    """The jitted training step of one layer: its output and the gradients for output gradient dy."""

    def step(x, gs, w1, w2, scale, dy):
        y, pullback = jax.vjp(lambda *a: layer(contender)(a[0], gs, *a[1:]), x, w1, w2, scale)
        return y, pullback(dy)

    return jax.jit(step)


def gemm_flops(rows: int, model) -> int:
    """The six GEMMs of a training step: each of fc1 [rows, H] x [H, 2F] and fc2 [rows, F] x [F, H]
    forward, for the input gradient and for the weight gradient."""
    return 3 * (2 * rows * model.hidden * 2 * model.ffn + 2 * rows * model.ffn * model.hidden)


def _rel_error(out, ref) -> float:
    """The largest relative error over the output and the gradients."""
    pairs = zip(jax.tree.leaves(out), jax.tree.leaves(ref))
    return max(float(np.linalg.norm(np.asarray(o, np.float32) - np.asarray(r, np.float32)) / np.linalg.norm(np.asarray(r, np.float32)))
               for o, r in pairs)


def run(args) -> dict:
    dtype = jnp.bfloat16 if jax.default_backend() == "gpu" else jnp.float32
    preset, model = presets.resolve(args.preset)
    tokens = args.tokens or presets.prefill_tokens(preset)
    key = jax.random.key(0)
    normal = lambda i, shape, scale=1.0: jax.random.normal(jax.random.fold_in(key, i), shape, dtype) * scale
    w1 = normal(1, (model.experts, model.hidden, 2 * model.ffn), 1 / math.sqrt(model.hidden))
    w2 = normal(2, (model.experts, model.ffn, model.hidden), 1 / math.sqrt(model.ffn))
    scale = jnp.ones((model.hidden,), jnp.float32)
    results = []
    for split, sizes in splits(model, tokens).items():
        rows = int(sum(sizes))
        gs = jnp.asarray(sizes, jnp.int32)
        sets = [(normal(10 + i, (rows, model.hidden)), gs, w1, w2, scale, normal(20 + i, (rows, model.hidden))) for i in range(2)]
        flops = gemm_flops(rows, model)
        reference = None
        for name in [c for c in CONTENDERS if c in args.contenders]:
            row = {"split": split, "contender": name, "rows": rows, "gemm_flops": flops, "rel_error_vs_ragged_dot": None}
            try:
                f = forward_backward(name)
                out = f(*sets[0])
                if name == REFERENCE:
                    reference = out
                elif reference is not None:
                    row["rel_error_vs_ragged_dot"] = _rel_error(out, reference)
                reps = args.reps if name != REFERENCE else max(5, args.reps // 6)  # ragged_dot is slow on a GPU
                t = timing.time_calls(f, sets, reps=reps, inner=3)
                gpu_s = timing.device_time_s(f, sets, calls=max(3, reps // 3))
                row.update(t.as_dict(), tflops=flops / t.median_s / 1e12, gpu_tflops=None if gpu_s is None else flops / gpu_s / 1e12)
            except Exception as e:  # a contender that cannot run here is recorded, not fatal
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            results.append(row)
            print(_line(row), flush=True)
    result = {"benchmark": "train", "preset": preset, "shapes": model._asdict(), "tokens": tokens,
              "dtype": jnp.dtype(dtype).name, "results": results}
    (args.out / "train.md").write_text(markdown(result))
    print(markdown(result))
    return result


def _line(row) -> str:
    if "error" in row:
        return f"{row['split']:6s} {row['contender']:15s} error: {row['error'][:160]}"
    gpu = "" if row["gpu_tflops"] is None else f" (GPU time {row['gpu_tflops']:6.3g})"
    err = "" if row["rel_error_vs_ragged_dot"] is None else f"  err vs ragged_dot {row['rel_error_vs_ragged_dot']:.1e}"
    return f"{row['split']:6s} {row['contender']:15s} {row['median_ms']:9.3f} ms/layer {row['tflops']:7.3g} TFLOP/s{gpu}{err}"


def markdown(result) -> str:
    rows = result["results"]
    splits_run = list(dict.fromkeys(r["split"] for r in rows))
    lines = ["| contender | " + " | ".join(f"{s} ms (TFLOP/s)" for s in splits_run) + " |", "|---" * (len(splits_run) + 1) + "|"]
    for name in dict.fromkeys(r["contender"] for r in rows):
        cells = []
        for split in splits_run:
            r = next(r for r in rows if r["split"] == split and r["contender"] == name)
            gpu = "" if r.get("gpu_tflops") is None else f" / {r['gpu_tflops']:.3g}"
            cells.append("error" if "error" in r else f"{r['median_ms']:.3f} ({r['tflops']:.3g}{gpu})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    rows_by_split = ", ".join(f"{s} {next(r['rows'] for r in rows if r['split'] == s)}" for s in splits_run)
    lines.append("")
    lines.append(f"grouped_mlp forward + backward, ms per layer (one jitted call, median of back-to-back calls), "
                 f"{result['preset']}, {result['dtype']}, routed rows: {rows_by_split}. TFLOP/s of the six GEMMs "
                 "by wall clock / by the call's GPU kernel time (profiler), where there is a GPU.")
    return "\n".join(lines) + "\n"
