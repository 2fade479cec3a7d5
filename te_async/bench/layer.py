"""One MoE layer forward (router, dispatch, grouped_mlp, combine) at DeepSeek-V2-Lite shapes:
async mode against sync mode, with the copies and host syncs each forward makes.

Batches: decode (1, 8, 64 tokens) and prefill (4096 tokens). "async" issues the copy right
after routing (te_async.moe's early copy); "async_late" lets grouped_mlp issue it after the
permutation, to show what issuing it early buys.
"""

import math

import jax
import jax.numpy as jnp

from .. import host_size_stats
from ..moe import moe_block
from . import timing

EXPERTS, HIDDEN, FFN, TOP_K = 64, 2048, 1408, 6
VARIANTS = {
    "sync": dict(group_sizes_mode="sync"),
    "async": dict(group_sizes_mode="async"),
    "async_late": dict(group_sizes_mode="async", early_copy=False),
}


def add_arguments(p) -> None:
    p.add_argument("--tokens", type=int, nargs="*", default=[1, 8, 64, 4096])
    p.add_argument("--reps", type=int, default=30)


def run(args) -> dict:
    on_gpu = jax.default_backend() == "gpu"
    dtype = jnp.bfloat16 if on_gpu else jnp.float32
    experts, hidden, ffn = (EXPERTS, HIDDEN, FFN) if on_gpu else (8, 64, 96)
    key = jax.random.key(0)
    params = dict(
        router=jax.random.normal(key, (hidden, experts), dtype) / math.sqrt(hidden),
        w_fc1=jax.random.normal(jax.random.fold_in(key, 1), (experts, hidden, 2 * ffn), dtype) / math.sqrt(hidden),
        w_fc2=jax.random.normal(jax.random.fold_in(key, 2), (experts, ffn, hidden), dtype) / math.sqrt(ffn),
    )
    results = []
    for tokens in args.tokens:
        inputs = [(jax.random.normal(jax.random.fold_in(key, 10 + i), (tokens, hidden), dtype), params) for i in range(4)]
        for name, kw in VARIANTS.items():
            # Weights are arguments, not closed-over constants: XLA spent over a minute compiling
            # each 1 GB-constant module at T=4096 on the H200 (docs/benchmarks.md).
            f = jax.jit(lambda x, p, kw=kw: moe_block(x, **p, top_k=TOP_K, **kw))
            t = timing.time_calls(f, inputs, reps=args.reps, inner=5)
            before = host_size_stats(0)
            jax.block_until_ready(f(*inputs[0]))
            after = host_size_stats(0)
            per_call = {k: after[k] - before[k] for k in after}
            results.append({"tokens": tokens, "variant": name, **t.as_dict(), "per_forward": per_call})
            print(f"T={tokens:5d} {name:10s} {1e3 * t.median_s:8.3f} ms  per forward: {per_call}")
    result = {"benchmark": "layer", "environment": timing.environment(), "shapes": dict(experts=experts, hidden=hidden, ffn=ffn, top_k=TOP_K), "results": results}
    (args.out / "layer.md").write_text(markdown(result))
    print(markdown(result))
    return result


def markdown(result) -> str:
    by = {(r["tokens"], r["variant"]): r for r in result["results"]}
    lines = ["| tokens | sync ms | async ms | async_late ms | async / sync | copies, syncs per forward (async / sync) |", "|---|---|---|---|---|---|"]
    for t in dict.fromkeys(r["tokens"] for r in result["results"]):
        s, a, late = by[(t, "sync")], by[(t, "async")], by[(t, "async_late")]
        counts = f"{a['per_forward']['copies']}, {a['per_forward']['sync_reads']} / {s['per_forward']['copies']}, {s['per_forward']['sync_reads']}"
        lines.append(f"| {t} | {s['median_ms']:.3f} | {a['median_ms']:.3f} | {late['median_ms']:.3f} | {a['median_ms'] / s['median_ms']:.2f} | {counts} |")
    return "\n".join(lines) + "\n"
