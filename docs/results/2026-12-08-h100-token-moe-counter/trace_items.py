"""Per-item timing of token_moe's several-token experts' kernel (TokenFfnTokensKernel), read from the
kernel's own printf lines (trace_items.patch over token_moe_counter.patch: each block prints its start,
the end of its wait for the routing, and each item's start and end from %globaltimer, with its SM and
entry count). ncu cannot profile this family of kernels ("Failed to profile", stop 78), so this is how
the probe sees where the kernel's time goes: which items are slow, and how many blocks are still at
work as the kernel ends.

  python3 -P trace_items.py run <independent|shared> [units]   one DeepSeek-V2-Lite MoE layer at 8 tokens,
      4 calls, each call's kernel traced (stdout: its lines; the first call also compiles, so read the
      later ones); `shared`: the 8 tokens near one
      another (as generate's tokens, which chose 29 distinct experts of 48), `independent`: random
  python3 -P trace_items.py summarize <file>...                 a table a call from the lines
"""
import sys
from collections import defaultdict

H, E, K, F, FS = 2048, 64, 6, 1408, 2816  # DeepSeek-V2-Lite's MoE layer: 64 experts, top-6, 2 shared experts


def run(case, units=None):
    import jax
    import jax.numpy as jnp
    from te_async import plan, token_ffn as tf
    from te_async.token_moe import Norm, Router, token_moe
    if units:
        tf.plan_tokens = lambda *a: tf.Split(int(units), 1)
    sms = min(s for _, s in plan.local_gpu_kinds())
    key = jax.random.key(0)
    bf = jnp.bfloat16
    w1 = jax.random.normal(jax.random.fold_in(key, 1), (E, H, 2 * F), bf) * 0.02
    w2 = jax.random.normal(jax.random.fold_in(key, 2), (E, F, H), bf) * 0.02
    shared = tf.Shared(jax.random.normal(jax.random.fold_in(key, 3), (H, 2 * FS), bf) * 0.02,
                       jax.random.normal(jax.random.fold_in(key, 4), (FS, H), bf) * 0.02)
    router = Router(jax.random.normal(jax.random.fold_in(key, 5), (H, E), bf) * 0.02, K, False)
    norm = Norm(jnp.ones((H,), bf), 1e-6, True)
    noise = jax.random.normal(jax.random.fold_in(key, 6), (8, H), jnp.float32)
    base = jax.random.normal(jax.random.fold_in(key, 7), (1, H), jnp.float32)
    x = (noise if case == "independent" else base + 0.5 * noise).astype(bf)
    call = jax.jit(lambda x: token_moe(x, norm, router, w1, w2, shared))
    for _ in range(4):
        y, routing = jax.block_until_ready(call(x))
    distinct = len(set(map(int, routing.experts.reshape(-1))))
    print(f"CASE {case} units {tf.plan_tokens(K, F, FS, sms).units} distinct {distinct} of {8 * K}", flush=True)


def summarize(path):
    blocks, items, units = [], [], None
    for line in open(path):
        f = line.split()
        if f[:1] == ["BLOCK"]:
            blocks.append(tuple(map(int, f[1:])))  # block, sm, begin, after wait, listed, distinct
        elif f[:1] == ["ITEM"]:
            items.append((f[1],) + tuple(map(int, f[2:])))  # kind, block, sm, item, entries, t0, t1
        elif f[:1] == ["CASE"]:
            print(line.strip())
            units = int(f[f.index("units") + 1])
    # One call's lines: the blocks' starts within 100 us of one another; calls are milliseconds apart.
    starts = sorted(b[2] for b in blocks)
    calls = [[starts[0]]]
    for t in starts[1:]:
        (calls[-1] if t - calls[-1][-1] < 100_000 else calls.append([t]) or calls[-1]).append(t)
    for n, c in enumerate(calls):
        t_start, t_next = c[0], calls[n + 1][0] if n + 1 < len(calls) else float("inf")
        bl = [b for b in blocks if t_start <= b[2] < t_next]
        it = [i for i in items if t_start <= i[5] < t_next]
        end = max(i[6] for i in it)
        us = lambda t: (t - t_start) / 1e3
        routed_done = min(b[4] for b in bl)  # the first block past its wait
        mb = 0.0
        by = defaultdict(list)
        for kind, _, _, item, entries, t0, t1 in it:
            ffn = FS if kind == "s" else F
            u = min(units, ffn - (item % -(-ffn // units)) * units)
            mb_item = 3 * H * u * 2 / 1e6
            mb += mb_item
            group = f"{kind} {entries if entries <= 2 else ('3-4' if entries <= 4 else '5-8')} entries"
            by[group].append(((t1 - t0) / 1e3, mb_item))
        ends = sorted(max([i[6] for i in it if i[1] == b[0]] or [b[4]]) for b in bl)
        print(f"call {n}: {len(bl)} blocks, {len(it)} items, {bl[0][5]} distinct experts; routing known at "
              f"{us(routed_done):.1f} us, last item ends at {us(end):.1f} us: {mb:.0f} MB, "
              f"{mb / ((end - t_start) / 1e9) / 1e6:.2f} TB/s over the kernel; the blocks ran items "
              f"{100 * sum(i[6] - i[5] for i in it) / (len(bl) * (end - t_start)):.0f} % of its span")
        print(f"  blocks done (us): first {us(ends[0]):.1f}, 10 % {us(ends[len(ends) // 10]):.1f}, "
              f"median {us(ends[len(ends) // 2]):.1f}, 90 % {us(ends[9 * len(ends) // 10]):.1f}, last {us(ends[-1]):.1f}")
        print("  | items | count | us each: min / median / max | MB each | GB/s an item (median) |")
        for g in sorted(by):
            d = sorted(t for t, _ in by[g])
            m = sorted(b for _, b in by[g])
            print(f"  | {g} | {len(d)} | {d[0]:.1f} / {d[len(d) // 2]:.1f} / {d[-1]:.1f} | {m[len(m) // 2]:.2f} | "
                  f"{1e3 * m[len(m) // 2] / d[len(d) // 2]:.1f} |")


if __name__ == "__main__":
    if sys.argv[1:2] == ["run"]:
        run(*sys.argv[2:])
    elif sys.argv[1:2] == ["summarize"]:
        for p in sys.argv[2:]:
            summarize(p)
    else:
        raise SystemExit(__doc__)
