"""Prefill grouped GEMMs of seed 000 (DeepSeek-V2-Lite, EP1): TFLOP/s per mode and reference.

64 experts, hidden 2048, ffn 1408, top-6, seqlen 4096: fc1 is [24576, 2048] x [64, 2048, 2816],
fc2 is [24576, 1408] x [64, 1408, 2048]. Two splits: even (384 rows per expert) and the seed's
skewed m_splits (its commented-out list, with zeros; it sums to 12288 rows, used as it is).
Beside te_async's modes: jax.lax.ragged_dot (XLA), the Pallas Mosaic-GPU ragged_dot_mgpu when
it imports, and a dense GEMM of the same FLOPs. The same two weights' gradients (wgrad,
ragged="k": [M, K]^T x [M, N] -> [64, K, N]) run against te_async's modes and the dense GEMM of
the same FLOPs; XLA's ragged_dot and the Pallas kernel have no ragged-k form here to compare.
"""

import functools
import math
import os
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np

from .. import GROUP_SIZES_MODES, _ffi, grouped_gemm
from . import timing

EXPERTS, HIDDEN, FFN, TOP_K, SEQLEN = 64, 2048, 1408, 6, 4096
SEED_SKEWED_SPLITS = [
    8, 83, 945, 0, 162, 4, 3, 0, 251, 510, 24, 140, 37, 0, 33, 10, 1, 0, 5, 0, 115, 0, 1, 1, 1, 188, 43, 1, 7, 0, 12, 0,
    324, 5, 88, 0, 0, 58, 558, 219, 1296, 1155, 2, 1102, 6, 0, 115, 0, 106, 0, 10, 0, 698, 2, 594, 221, 351, 0, 1, 2,
    2040, 0, 7, 743,
]  # fmt: skip
# Seed 000's own figures (TE 1.13 GroupedLinear, even split, TFLOP/s), for context only.
SEED_TFLOPS = {"H800": {"fc1": 253.4, "fc2": 133.3}, "A800": {"fc1": 149.3, "fc2": 106.1}}
GEMMS = {  # ragged dimension, K, N
    "fc1": ("m", HIDDEN, 2 * FFN),
    "fc2": ("m", FFN, HIDDEN),
    "fc1_wgrad": ("k", HIDDEN, 2 * FFN),
    "fc2_wgrad": ("k", FFN, HIDDEN),
}


def add_arguments(p) -> None:
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--contenders", nargs="*", default=None, help="default: all that run here")
    p.add_argument("--cutlass-configs", action="store_true",
                   help="also run device mode once per CUTLASS config (te_async_device[<config>]), for tuning the heuristic")
    p.add_argument("--gemms", nargs="*", default=list(GEMMS), choices=list(GEMMS))


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


def contenders(ragged: str, k: int, n: int, cutlass_configs: bool = False) -> dict:
    out = {f"te_async_{m}": functools.partial(grouped_gemm, ragged=ragged, group_sizes_mode=m) for m in GROUP_SIZES_MODES}
    for config in _ffi.cutlass_configs(ragged) if cutlass_configs else []:
        out[f"te_async_device[{config}]"] = functools.partial(grouped_gemm, ragged=ragged, group_sizes_mode="device")
    if ragged == "k":
        out["dense_same_flops"] = lambda lhs, rhs, gs: jnp.dot(lhs.T, rhs)
        return out
    out["xla_ragged_dot"] = lambda lhs, rhs, gs: jax.lax.ragged_dot(lhs, rhs, gs)
    mgpu = _mgpu_ragged_dot()
    if mgpu is not None:
        out["pallas_ragged_dot_mgpu"] = mgpu
    out["dense_same_flops"] = lambda lhs, rhs, gs: jnp.dot(lhs, rhs[0].reshape(k, n))
    return out


def make_rhs(ragged: str, k: int, n: int, rows: int, key, dtype) -> jax.Array:
    """The second operand: the experts' weights [64, K, N] (ragged m), or an output gradient dy
    [rows, N] (ragged k, the weight-gradient GEMM x^T dy)."""
    if ragged == "m":
        return jax.random.normal(key, (EXPERTS, k, n), dtype) / math.sqrt(k)
    return jax.random.normal(jax.random.fold_in(key, 7), (rows, n), dtype)


def run(args) -> dict:
    dtype = jnp.bfloat16 if jax.default_backend() == "gpu" else jnp.float32
    key = jax.random.key(0)
    splits = {"even": [SEQLEN * TOP_K // EXPERTS] * EXPERTS, "seed_skewed": SEED_SKEWED_SPLITS}
    results = []
    for gemm in args.gemms:
        ragged, k, n = GEMMS[gemm]
        for split, sizes in splits.items():
            rows = int(sum(sizes))
            gs = jnp.asarray(sizes, jnp.int32)
            rhs = make_rhs(ragged, k, n, rows, key, dtype)
            lhs_sets = [(jax.random.normal(jax.random.fold_in(key, i), (rows, k), dtype), rhs, gs) for i in range(2)]
            flops = 2 * rows * k * n
            reference = None
            for name, fn in contenders(ragged, k, n, args.cutlass_configs).items():
                if args.contenders and name not in args.contenders:
                    continue
                row = {"gemm": gemm, "split": split, "contender": name, "m": rows, "k": k, "n": n}
                if name == "te_async_device":
                    row["kernel"] = _ffi.device_plan(EXPERTS, rows, k, n, ragged == "k", False, *[jnp.dtype(dtype).name] * 2)[0]
                config = name[len("te_async_device["):-1] if name.startswith("te_async_device[") else None
                if config:
                    row["kernel"] = config
                try:
                    # The handler reads TE_ASYNC_CUTLASS_CONFIG at each call, and each contender is a
                    # fresh jit, so no recorded command buffer keeps an earlier config.
                    with mock.patch.dict(os.environ, {"TE_ASYNC_CUTLASS_CONFIG": config} if config else {}):
                        f = jax.jit(fn)
                        reps = args.reps if name != "xla_ragged_dot" else max(5, args.reps // 6)  # ~25 ms per call
                        t = timing.time_calls(f, lhs_sets, reps=reps, inner=3)
                        row.update(t.as_dict(), tflops=flops / t.median_s / 1e12)
                        gpu_s = timing.device_time_s(f, lhs_sets, calls=max(3, reps // 3))
                        row["gpu_tflops"] = None if gpu_s is None else flops / gpu_s / 1e12
                        if name != "dense_same_flops":
                            out = np.asarray(f(*lhs_sets[0]), np.float32)
                            if reference is None:
                                reference = out
                            row["rel_error_vs_first"] = float(np.linalg.norm(out - reference) / np.linalg.norm(reference))
                except Exception as e:  # a contender that cannot run here is recorded, not fatal
                    row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                results.append(row)
                print(_line(row))
    result = {"benchmark": "prefill", "environment": timing.environment(), "seed_tflops": SEED_TFLOPS, "results": results}
    (args.out / "prefill.md").write_text(markdown(result))
    print(markdown(result))
    return result


def _line(row) -> str:
    if "error" in row:
        return f"{row['gemm']} {row['split']:11s} {row['contender']:24s} error: {row['error'][:120]}"
    gpu = "" if row["gpu_tflops"] is None else f" (GPU time {row['gpu_tflops']:6.1f})"
    return (f"{row['gemm']} {row['split']:11s} {row['contender']:24s} {row['median_ms']:8.3f} ms {row['tflops']:7.1f} TFLOP/s"
            f"{gpu} {row.get('kernel', '')}")


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
                cells.append(f"{r['tflops']:.0f}" + ("" if r["gpu_tflops"] is None else f" / {r['gpu_tflops']:.0f}"))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    seed = result["seed_tflops"]
    lines.append("")
    lines.append("TFLOP/s, median: wall clock of back-to-back calls / GPU time of the call's kernels (profiler), "
                 "where there is a GPU. Seed 000 (TE 1.13, even split): " + "; ".join(f"{gpu} fc1 {v['fc1']:.0f} / fc2 {v['fc2']:.0f}" for gpu, v in seed.items()))
    return "\n".join(lines) + "\n"
