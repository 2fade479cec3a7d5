"""Decode attention over a stacked KV cache: te_async's kernels against XLA's.

A model's decode attention at batch B against a cache of --context tokens. Grouped-query heads
(Qwen3, Mixtral) two ways: "te_async" (decode_attention(..., kernel="te_async"), the
flash-decoding kernel that reads the layer in place; on a GPU, where it takes the shape) and "xla"
(kernel="xla": XLA's einsums and softmax over the layer that its dynamic slice copies out of the
stack). DeepSeek's MLA (the default: DeepSeek-V2-Lite, 16 heads over one latent of 512 and a rope
key of 64) as the whole absorbed attention, from the no-rope and rope queries to the heads' outputs
(te_async.mla_decode), three ways: "xla" and "te_async" (the absorbing einsums around
decode_attention with that kernel) and "fused" (mla_decode's one kernel). As in a decode step, one
call runs a lax.scan over L layers (L = --layers) of one stacked cache, the layer index the scan's
counter; a layer's time is the call's wall clock over L, and its GPU time the busy time of the
call's kernels in a profile over L. The floor is the bytes a step must read
(every visible key once, and MLA's kv_b_proj) over the HBM read bandwidth of the same run.
"""

import jax
import jax.numpy as jnp

from .. import decode_attention as attention
from .. import mla_decode
from ..models.mla import softmax_scale
from . import presets, timing


def add_arguments(p) -> None:
    presets.add_argument(p)
    p.add_argument("--batches", type=presets.positive_int, nargs="+", help="B (default: 1 2 4 8 16 64 on a GPU, 1 2 elsewhere)")
    p.add_argument("--context", type=presets.positive_int, help="cached tokens, all visible (default: 4096 on a GPU, 64 elsewhere)")
    p.add_argument("--layers", type=presets.positive_int, help="stacked layers per call (default: 26 on a GPU, 2 elsewhere)")
    p.add_argument("--reps", type=presets.positive_int, default=20, help="timing samples of 5 calls each (default: 20)")


def heads(config) -> dict:
    """The attention's decode shape: query heads, kv heads, key dims, rope-key dims, value dims
    (None: the keys are the values) and the softmax scale."""
    if config.is_mla:
        return dict(heads=config.num_attention_heads, kv_heads=1, dk=config.kv_lora_rank, dr=config.qk_rope_head_dim,
                    dv=None, scale=softmax_scale(config), nope=config.qk_nope_head_dim, value=config.v_head_dim)
    return dict(heads=config.num_attention_heads, kv_heads=config.num_key_value_heads, dk=config.head_dim, dr=0,
                dv=config.head_dim, scale=config.head_dim ** -0.5)


def operands(shape: dict, batch: int, context: int, layers: int, key) -> tuple:
    """Random bf16 (q, keys, values, q_rope, key_rope) of one call."""
    k = iter(jax.random.split(key, 5))
    x = lambda *s: jax.random.normal(next(k), s, jnp.bfloat16)
    h, hkv, dk, dr, dv = (shape[n] for n in ("heads", "kv_heads", "dk", "dr", "dv"))
    cache = (layers, batch, context, hkv)
    return (x(batch, 1, h, dk), x(*cache, dk), None if dv is None else x(*cache, dv),
            x(batch, 1, h, dr) if dr else None, x(*cache, dr) if dr else None)


def mla_operands(shape: dict, batch: int, context: int, layers: int, key) -> tuple:
    """Random bf16 (q_nope, q_pe, w_kv, ckv, kpe) of one absorbed MLA call."""
    k = iter(jax.random.split(key, 5))
    x = lambda scale, *s: scale * jax.random.normal(next(k), s, jnp.bfloat16)
    h, nope, dr, latent = shape["heads"], shape["nope"], shape["dr"], shape["dk"]
    return (x(1, batch, 1, h, nope), x(1, batch, 1, h, dr), x(0.05, h, nope + shape["value"], latent),
            x(1, layers, batch, context, latent), x(1, layers, batch, context, dr))


def mla_scanned(contender: str, scale: float, position: int, layers: int):
    """One call: the absorbed MLA attention over each of the L stacked layers; contender "fused"
    (mla_decode's kernel) or the unfused path with decode_attention's kernel `contender`."""
    def one(ops, layer):
        if contender == "fused":
            return mla_decode.mla_decode_attention(*ops, position, scale=scale, layer=layer, kernel="te_async")
        return mla_decode.mla_decode_unfused(*ops, position, layer, scale=scale, attention=contender)

    def call(*ops):
        return jax.lax.scan(lambda carry, layer: (carry, one(ops, layer)), 0, jnp.arange(layers, dtype=jnp.int32))[1]
    return jax.jit(call)


def scanned(kernel: str, scale: float, position: int, layers: int):
    """One call: decode_attention over each of the L stacked layers, the stack read by index."""
    def call(q, keys, values, q_rope, key_rope):
        def body(carry, layer):
            return carry, attention.decode_attention(q, keys, values, position, scale=scale, layer=layer, q_rope=q_rope,
                                                     key_rope=key_rope, kernel=kernel)
        return jax.lax.scan(body, 0, jnp.arange(layers, dtype=jnp.int32))[1]
    return jax.jit(call)


def cache_bytes(shape: dict, batch: int, context: int) -> int:
    """The bytes of one layer's cache a step reads: each key (and rope key and value) once."""
    per_token = shape["dk"] + shape["dr"] + (shape["dv"] or 0)
    return batch * context * shape["kv_heads"] * per_token * 2


def run(args) -> dict:
    gpu = jax.default_backend() == "gpu"
    name = presets.default_name(args.preset)
    shape = heads(presets.config(name))
    batches = args.batches or ([1, 2, 4, 8, 16, 64] if gpu else [1, 2])
    context = args.context or (4096 if gpu else 64)
    layers = args.layers or (26 if gpu else 2)
    q, keys, values, q_rope, _ = operands(shape, 1, 8, 1, jax.random.key(0))  # the kernels where they take the shape
    kernels = ["xla", "te_async"] if gpu and attention.kernel_applies(q, keys, values, q_rope) else ["xla"]
    mla = "nope" in shape
    if mla and gpu and mla_decode.kernel_applies(*mla_operands(shape, 1, 8, 1, jax.random.key(0))):
        kernels.append("fused")
    hbm = timing.hbm_bandwidth()
    print(f"attention: {name} {shape}, {context} cached tokens, {layers} stacked layers per call, HBM read "
          f"{hbm / 1e12:.2f} TB/s, batches {batches}", flush=True)
    results = []
    for batch in batches:
        ops = (mla_operands if mla else operands)(shape, batch, context, layers, jax.random.key(batch))
        weights = ops[2].size * ops[2].dtype.itemsize if mla else 0  # kv_b_proj, absorbed
        row = dict(batch=batch, floor_us=1e6 * (cache_bytes(shape, batch, context) + weights) / hbm)
        for kernel in kernels:
            fn = (mla_scanned if mla else scanned)(kernel, shape["scale"], context - 1, layers)
            row[f"{kernel}_us"] = 1e6 * timing.time_calls(fn, [ops], reps=args.reps).median_s / layers
            gpu_s = timing.device_time_s(fn, [ops])
            row[f"{kernel}_gpu_us"] = None if gpu_s is None else 1e6 * gpu_s / layers
        results.append(row)
        print("  B=%-3d floor %8.2f us  " % (batch, row["floor_us"])
              + "  ".join(f"{k} {row[f'{k}_us']:8.2f}" for k in kernels), flush=True)
        del ops
    table = markdown(results, kernels)
    (args.out / "attention.md").write_text(table)
    print(table)
    return {"benchmark": "attention", "config": dict(preset=name, shape=shape, context=context, layers=layers,
                                                     batches=batches, dtype="bfloat16", reps=args.reps),
            "hbm_bytes_per_s": hbm, "results": results}


def markdown(results, kernels) -> str:
    """One row per B: the floor, then each kernel's wall clock and GPU µs per layer, each with its
    ratio to the floor."""
    lines = ["| B | floor us | " + " | ".join(f"{k} us | {k} GPU us" for k in kernels) + " |",
             "|---" * (2 + 2 * len(kernels)) + "|"]
    cell = lambda us, floor: "-" if us is None else f"{us:.2f} ({us / floor:.1f}x)"
    for r in results:
        cells = [cell(r[f"{k}_{t}"], r["floor_us"]) for k in kernels for t in ("us", "gpu_us")]
        lines.append(f"| {r['batch']} | {r['floor_us']:.2f} | " + " | ".join(cells) + " |")
    lines += ["", "Wall clock per layer (a scan over the stacked layers, over their count, so that each includes a "
              "scan trip's fixed cost) and GPU busy time per layer (the union of the call's kernels in a profile, over "
              "the layers); ratio to the floor (the layer's cache bytes, and MLA's kv_b_proj, over the measured HBM "
              "read bandwidth). MLA: the whole absorbed attention; xla and te_async are the einsums around "
              "decode_attention with that kernel, fused is te_async.mla_decode's one kernel."]
    return "\n".join(lines) + "\n"
