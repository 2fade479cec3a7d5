"""Prefill expert GEMMs: TFLOP/s of each group-sizes mode against torch._grouped_mm and XLA.

At DeepSeek-V2-Lite's shapes (64 experts, hidden 2048, ffn 1408, top-6) and 4096 tokens, fc1 is
[24576, 2048] x [64, 2048, 2816] and fc2 is [24576, 1408] x [64, 1408, 2048]; their input
gradients (ragged m with the weights transposed) and weight gradients (ragged k: [M, K]^T x
[M, N] -> [64, K, N]) are timed too (--gemms picks): the six GEMMs of a training step. Two
splits of the rows over the experts: even (384 rows each), and the skewed split from the
TransformerEngine stall report (docs/diagnosis-grouped-linear-stall.md; 12288 rows, with empty
experts). Beside te_async's modes: torch._grouped_mm where torch with CUDA imports (the same
run), jax.lax.ragged_dot (XLA), the Pallas Mosaic-GPU ragged_dot_mgpu where it
imports (forward form only), and a dense GEMM of the same FLOPs. TFLOP/s are given three ways:
wall clock of batches of 3 calls (a call's dispatch and the wait at the batch's end weigh in, as
for a GEMM called alone), wall clock of a stream of STREAM_CALLS calls blocked on once (the rate of
back-to-back GEMMs, where the batch's fixed latency, far larger for a jitted JAX call than for torch's
eager launch, is spread thin: on an H100 it still added 10-17 µs a call to te_async's GPU timeline,
docs/results/2026-12-07-h100-prefill-stream), and, on a GPU, GPU time: for the JAX contenders the
call's kernel time from the profiler, for torch CUDA events around back-to-back calls.
"""

import functools
import math
import os
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np

from .. import GROUP_SIZES_MODES, grouped_gemm, plan
from . import presets, timing, torch_reference

# The skewed split of the TransformerEngine stall report (NVIDIA/TransformerEngine#1499): rows
# per expert of DeepSeek-V2-Lite's 64, summing to 12288, half of a 4096-token prefill's rows.
REPORT_SKEWED_SPLIT = [
    8, 83, 945, 0, 162, 4, 3, 0, 251, 510, 24, 140, 37, 0, 33, 10, 1, 0, 5, 0, 115, 0, 1, 1, 1, 188, 43, 1, 7, 0, 12, 0,
    324, 5, 88, 0, 0, 58, 558, 219, 1296, 1155, 2, 1102, 6, 0, 115, 0, 106, 0, 10, 0, 698, 2, 594, 221, 351, 0, 1, 2,
    2040, 0, 7, 743,
]  # fmt: skip
# TransformerEngine 1.13 GroupedLinear's TFLOP/s in that report (even split), for context only.
REPORT_TFLOPS = {"H800": {"fc1": 253.4, "fc2": 133.3}, "A800": {"fc1": 149.3, "fc2": 106.1}}


# The grouped_gemm arguments of each GEMM form: forward x @ w, input gradient dy @ w^T (rhs
# [G, N, K]) and weight gradient x^T dy.
FORMS = {"m": dict(ragged="m"), "mT": dict(ragged="m", transpose_rhs=True), "k": dict(ragged="k")}
TORCH = "torch_grouped_mm"
STREAM_CALLS = 30  # calls of the stream measure (module docstring)


def gemms(model) -> dict:
    """name -> (form, K, N) of a layer's six expert GEMMs: forward, input and weight gradients."""
    h, f2, f = model.hidden, 2 * model.ffn, model.ffn  # fc1: swiglu's [gate | linear]
    return {"fc1": ("m", h, f2), "fc2": ("m", f, h), "fc1_dgrad": ("mT", f2, h), "fc2_dgrad": ("mT", h, f),
            "fc1_wgrad": ("k", h, f2), "fc2_wgrad": ("k", f, h)}


# At the GPU default's shapes: the names --gemms takes, and the shapes of the tools and tests.
GEMMS = gemms(presets.PRESETS[presets.GPU_DEFAULT])
EXPERTS = presets.PRESETS[presets.GPU_DEFAULT].experts


def splits(model, tokens: int) -> dict:
    """Rows per expert of a prefill of `tokens` tokens: "even", and "skewed", the report's split,
    as it is at DeepSeek-V2-Lite's shapes; for other models repeated or cut to their experts and
    scaled to half their rows, keeping its skew and its empty experts."""
    rows = tokens * model.top_k
    skewed = np.resize(REPORT_SKEWED_SPLIT, model.experts)
    return {"even": [rows // model.experts] * model.experts, "skewed": (skewed * (rows // 2) // skewed.sum()).tolist()}


def add_arguments(p) -> None:
    presets.add_argument(p)
    p.add_argument("--tokens", type=int, help="tokens of the prefill (default: 4096; 256 with --preset tiny)")
    p.add_argument("--gemms", nargs="*", default=list(GEMMS), choices=list(GEMMS), help="default: all")
    p.add_argument("--contenders", nargs="*", default=None,
                   help="te_async_sync, te_async_async, te_async_device, torch_grouped_mm (GPU), xla_ragged_dot, "
                        "pallas_ragged_dot_mgpu (GPU), dense_same_flops (default: all that run here)")
    p.add_argument("--cutlass-configs", action="store_true",
                   help="also run device mode once per CUTLASS tile config (te_async_device[<config>]), "
                        "to check or tune the config heuristic")
    p.add_argument("--reps", type=int, default=30, help="timing samples of 3 calls each (default: 30)")


def _mgpu_ragged_dot():
    """The Pallas Mosaic-GPU kernel with one config per GEMM width, or None where it cannot run."""
    if jax.default_backend() != "gpu":
        return None
    try:
        from jax.experimental.pallas.ops.gpu import ragged_dot_mgpu
    except ImportError:
        return None
    kw = dict(block_m=128, block_n=128, block_k=64, max_concurrent_steps=4, grid_block_n=1)
    return lambda lhs, rhs, gs: ragged_dot_mgpu.ragged_dot(lhs, rhs, group_sizes=gs, **kw)


def contenders(form: str, k: int, n: int, cutlass_configs: bool = False) -> dict:
    """name -> fn(lhs, rhs, group_sizes) of the JAX contenders of one GEMM form."""
    kw = FORMS[form]
    out = {f"te_async_{m}": functools.partial(grouped_gemm, **kw, group_sizes_mode=m) for m in GROUP_SIZES_MODES}
    for config in plan.cutlass_configs(kw["ragged"]) if cutlass_configs else []:
        out[f"te_async_device[{config}]"] = functools.partial(grouped_gemm, **kw, group_sizes_mode="device")
    if form == "k":
        out["dense_same_flops"] = lambda lhs, rhs, gs: jnp.dot(lhs.T, rhs)
        return out
    if form == "mT":
        out["xla_ragged_dot"] = lambda lhs, rhs, gs: jax.lax.ragged_dot(lhs, jnp.swapaxes(rhs, 1, 2), gs)
    else:
        out["xla_ragged_dot"] = lambda lhs, rhs, gs: jax.lax.ragged_dot(lhs, rhs, gs)
        mgpu = _mgpu_ragged_dot()
        if mgpu is not None:
            out["pallas_ragged_dot_mgpu"] = mgpu
    out["dense_same_flops"] = lambda lhs, rhs, gs: jnp.dot(lhs, rhs[0].reshape(k, n))
    return out


def make_rhs(form: str, k: int, n: int, rows: int, key, dtype, experts: int = EXPERTS) -> jax.Array:
    """The second operand: the experts' weights [experts, K, N] (forward) or [experts, N, K] (input
    gradient), or an output gradient dy [rows, N] (ragged k, the weight-gradient GEMM x^T dy)."""
    if form == "k":
        return jax.random.normal(jax.random.fold_in(key, 7), (rows, n), dtype)
    shape = (experts, k, n) if form == "m" else (experts, n, k)
    return jax.random.normal(key, shape, dtype) / math.sqrt(k)


def _torch_case(form: str, lhs_sets):
    """(fn, torch input sets, fn's output as the JAX contenders lay it out) of torch._grouped_mm."""
    mm = torch_reference.gemm(form)
    second = torch_reference.tensor if form == "k" else torch_reference.linear_weights
    sets = [(torch_reference.tensor(lhs), second(rhs), torch_reference.offsets(torch_reference.tensor(gs)))
            for lhs, rhs, gs in lhs_sets]
    as_jax_layout = (lambda t: t.transpose(1, 2)) if form == "k" else (lambda t: t)  # [G, N, K] -> [G, K, N]
    return mm, sets, lambda out: torch_reference.to_numpy(as_jax_layout(out))


def _measure(name: str, fn, form: str, lhs_sets, reps: int, config, flops: int) -> tuple:
    """(timing fields, the output as numpy or None for the dense GEMM) of one contender."""
    def timed(fn, sets, block, gpu_seconds):
        t = timing.time_calls(fn, sets, reps=reps, inner=3, block=block)
        stream = timing.time_calls(fn, sets, reps=max(3, reps // 3), inner=STREAM_CALLS, block=block)
        gpu_s = gpu_seconds(fn, sets, calls=max(3, reps // 3))
        return {**t.as_dict(), "tflops": flops / t.median_s / 1e12, "stream_ms": 1e3 * stream.median_s,
                "stream_tflops": flops / stream.median_s / 1e12,
                "gpu_tflops": None if gpu_s is None else flops / gpu_s / 1e12}

    if name == TORCH:
        fn, sets, output = _torch_case(form, lhs_sets)
        return timed(fn, sets, torch_reference.block, torch_reference.gpu_seconds), output(fn(*sets[0]))
    # TE_ASYNC_CUTLASS_CONFIG is read when a call is traced, and each contender is a fresh jit, so
    # no cached executable keeps an earlier config.
    with mock.patch.dict(os.environ, {"TE_ASYNC_CUTLASS_CONFIG": config} if config else {}):
        f = jax.jit(fn)
        if name == "xla_ragged_dot":  # ~25 ms per call
            reps = max(5, reps // 6)
        fields = timed(f, lhs_sets, jax.block_until_ready, timing.device_time_s)
        out = None if name == "dense_same_flops" else np.asarray(f(*lhs_sets[0]), np.float32)
    return fields, out


def run(args) -> dict:
    dtype = jnp.bfloat16 if jax.default_backend() == "gpu" else jnp.float32
    preset, model = presets.resolve(args.preset)
    tokens = args.tokens or presets.prefill_tokens(preset)
    key = jax.random.key(0)
    results = []
    for gemm in args.gemms:
        form, k, n = gemms(model)[gemm]
        for split, sizes in splits(model, tokens).items():
            rows = int(sum(sizes))
            gs = jnp.asarray(sizes, jnp.int32)
            rhs = make_rhs(form, k, n, rows, key, dtype, model.experts)
            lhs_sets = [(jax.random.normal(jax.random.fold_in(key, i), (rows, k), dtype), rhs, gs) for i in range(2)]
            flops = 2 * rows * k * n
            reference = None
            fns = contenders(form, k, n, args.cutlass_configs)
            if jax.default_backend() == "gpu":
                fns[TORCH] = None  # _measure runs it on torch tensors
            for name, fn in fns.items():
                if args.contenders and name.split("[")[0] not in args.contenders:  # configs go with te_async_device
                    continue
                row = {"gemm": gemm, "split": split, "contender": name, "m": rows, "k": k, "n": n}
                if name == "te_async_device":
                    shape = plan.GemmShape(model.experts, rows, k, n, ragged_k=form == "k", transpose_rhs=form == "mT",
                                           dtype=jnp.dtype(dtype).name)
                    row["kernel"] = plan.plan_device_gemm(shape).label
                config = name[len("te_async_device["):-1] if name.startswith("te_async_device[") else None
                if config:
                    row["kernel"] = config
                try:
                    fields, out = _measure(name, fn, form, lhs_sets, args.reps, config, flops)
                    row.update(fields)
                    if out is not None:
                        if reference is None:
                            reference = out
                        row["rel_error_vs_first"] = float(np.linalg.norm(out - reference) / np.linalg.norm(reference))
                except Exception as e:  # a contender that cannot run here is recorded, not fatal
                    row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                results.append(row)
                print(_line(row))
    result = {"benchmark": "prefill", "preset": preset, "shapes": model._asdict(), "tokens": tokens,
              "report_tflops": REPORT_TFLOPS, "results": results}
    (args.out / "prefill.md").write_text(markdown(result))
    print(markdown(result))
    return result


def _line(row) -> str:
    if "error" in row:
        return f"{row['gemm']} {row['split']:6s} {row['contender']:24s} error: {row['error'][:120]}"
    gpu = "" if row["gpu_tflops"] is None else f" (GPU time {row['gpu_tflops']:6.3g})"
    return (f"{row['gemm']} {row['split']:6s} {row['contender']:24s} {row['median_ms']:8.3f} ms {row['tflops']:7.3g} TFLOP/s"
            f" (stream {row['stream_tflops']:6.3g}){gpu} {row.get('kernel', '')}")


def markdown(result) -> str:
    rows = result["results"]
    names = list(dict.fromkeys(r["contender"] for r in rows))
    cases = list(dict.fromkeys((r["gemm"], r["split"]) for r in rows))
    lines = ["| contender | " + " | ".join(f"{g} {s}" for g, s in cases) + " |", "|---" * (len(cases) + 1) + "|"]
    for name in names:
        cells = []
        for case in cases:
            r = next((r for r in rows if (r["gemm"], r["split"]) == case and r["contender"] == name), None)
            if r is None or "error" in r:
                cells.append("—")
            else:
                cells.append(f"{r['tflops']:.3g} / {r['stream_tflops']:.3g}"
                             + ("" if r["gpu_tflops"] is None else f" / {r['gpu_tflops']:.3g}"))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    report = result["report_tflops"]
    lines.append("")
    lines.append(f"TFLOP/s, median, {result['preset']}, {result['tokens']} tokens: wall clock of batches of 3 calls / "
                 f"of a stream of {STREAM_CALLS} calls / GPU time of the call's kernels (profiler; torch: CUDA events "
                 "around back-to-back calls), where there is a GPU. TransformerEngine 1.13 in the stall report "
                 "(DeepSeek-V2-Lite, even split): " + "; ".join(f"{gpu} fc1 {v['fc1']:.0f} / fc2 {v['fc2']:.0f}" for gpu, v in report.items()))
    return "\n".join(lines) + "\n"
