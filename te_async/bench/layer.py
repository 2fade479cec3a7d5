"""One MoE layer forward, async mode against sync mode, with the copies and host syncs it makes.

The layer is te_async.moe.moe_block (router, dispatch, grouped_mlp, combine), timed at decode
batches (1, 8, 64 tokens) and a prefill (4096 tokens; 256 with --preset tiny). "async" issues
the group-sizes copy right after routing (moe_block's early copy); "async_late" lets grouped_mlp
issue it after the permutation, to show what issuing it early buys.
"""

import math

import jax
import jax.numpy as jnp

from ..moe import moe_block
from . import presets, timing

VARIANTS = {
    "sync": dict(group_sizes_mode="sync"),
    "async": dict(group_sizes_mode="async"),
    "async_late": dict(group_sizes_mode="async", early_copy=False),
}


def add_arguments(p) -> None:
    presets.add_argument(p)
    p.add_argument("--tokens", type=int, nargs="*", help="tokens per forward (default: 1 8 64 and a prefill's)")
    p.add_argument("--reps", type=int, default=30, help="timing samples of 5 forwards each (default: 30)")


def run(args) -> dict:
    dtype = jnp.bfloat16 if jax.default_backend() == "gpu" else jnp.float32
    preset, model = presets.resolve(args.preset)
    experts, hidden, ffn = model.experts, model.hidden, model.ffn
    key = jax.random.key(0)
    params = dict(
        router=jax.random.normal(key, (hidden, experts), dtype) / math.sqrt(hidden),
        w_fc1=jax.random.normal(jax.random.fold_in(key, 1), (experts, hidden, 2 * ffn), dtype) / math.sqrt(hidden),
        w_fc2=jax.random.normal(jax.random.fold_in(key, 2), (experts, ffn, hidden), dtype) / math.sqrt(ffn),
    )
    results = []
    for tokens in args.tokens or [1, 8, 64, presets.prefill_tokens(preset)]:
        inputs = [(jax.random.normal(jax.random.fold_in(key, 10 + i), (tokens, hidden), dtype), params) for i in range(4)]
        for name, kw in VARIANTS.items():
            # Weights are arguments, not closed-over constants: XLA spent over a minute compiling
            # each 1 GB-constant module at T=4096 on the H200.
            f = jax.jit(lambda x, p, kw=kw: moe_block(x, **p, top_k=model.top_k, **kw))
            t = timing.time_calls(f, inputs, reps=args.reps, inner=5)
            _, per_call = timing.counted_call(f, *inputs[0])
            results.append({"tokens": tokens, "variant": name, **t.as_dict(), "per_forward": per_call})
            print(f"T={tokens:5d} {name:10s} {1e3 * t.median_s:8.3f} ms  per forward: {per_call}")
    result = {"benchmark": "layer", "preset": preset, "shapes": model._asdict(), "results": results}
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
