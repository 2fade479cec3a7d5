"""Greedy generation with a real (tiny) MoE checkpoint through te_async, in every group-sizes mode.

Loads the tiny DeepSeek-V2 checkpoint committed in tests/fixtures/hf/deepseek_v2 (Hugging Face
format, written by transformers: latent attention, 12 routed experts top-3, a shared expert, a
dense first layer) with te_async.models.load_hf. Then, for each group-sizes mode (the routed
experts through te_async.grouped_mlp) and for jax.lax.ragged_dot experts, it prefills the prompt,
decodes greedily one token at a time with te_async.models.decode_step, and times each token.
Every mode must give the same tokens, and those transformers generated (stored beside the
checkpoint in reference.npz). On a GPU it then times a DeepSeek-V2-Lite-shaped model with random
weights (its first 4 layers: one dense, three MoE) at batch 1 and 8, per mode, against a
4096-token cache (te_async.bench.generate; `python -m te_async.bench generate` is the full sweep).

    python examples/generate.py [--checkpoint DIR] [--tokens 16] [--lite-layers 4] [--batches 1 8]
"""

import argparse
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np

import te_async
import te_async.models as models

FIXTURE = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "hf" / "deepseek_v2"
MODES = {**{m: dict(group_sizes_mode=m) for m in te_async.GROUP_SIZES_MODES}, "ragged_dot": dict(experts="ragged_dot")}


def greedy(params, config, prompt, new_tokens: int, **mode) -> tuple:
    """(tokens [B, new_tokens], seconds of each decode step): prefill, then one decode_step per token."""
    batch, length = prompt.shape
    cache = models.init_cache(config, batch, length + new_tokens, params["embed"].dtype)
    logits, cache = models.prefill(params, config, cache, prompt, **mode)
    tokens, times = [jnp.argmax(logits, axis=-1).astype(jnp.int32)[:, None]], []
    for i in range(new_tokens - 1):
        t0 = time.perf_counter()
        logits, cache = models.decode_step(params, config, cache, tokens[-1], length + i, **mode)
        tokens.append(jnp.argmax(logits, axis=-1).astype(jnp.int32)[:, None].block_until_ready())
        times.append(time.perf_counter() - t0)
    return np.concatenate([np.asarray(t) for t in tokens], axis=1), times


def checkpoint_generation(path: pathlib.Path, new_tokens: int) -> None:
    params, config = models.load_hf(path)
    moe = sum(map(config.is_moe_layer, range(config.num_hidden_layers)))
    print(f"checkpoint {path}: {config.model_type}, {config.num_hidden_layers} layers ({moe} MoE, "
          f"{config.num_experts} experts top-{config.num_experts_per_tok}, shared FFN {config.shared_intermediate_size}), "
          f"vocab {config.vocab_size}, {params['embed'].dtype}")
    reference = np.load(path / "reference.npz") if (path / "reference.npz").is_file() else None
    if reference is not None:
        prompt = reference["tokens"]
    else:
        prompt = np.random.default_rng(0).integers(0, config.vocab_size, (2, 7), dtype=np.int32)
    print(f"prompt {prompt.shape[0]} x {prompt.shape[1]} tokens: {prompt.tolist()}")
    generated = {}
    for mode, kw in MODES.items():
        tokens, times = greedy(params, config, prompt, new_tokens, **kw)
        generated[mode] = tokens
        steady = f"{1e3 * np.median(times[1:]):.3f} ms" if len(times) > 1 else "-"  # the first step compiles
        print(f"  {mode:10s} per token {steady} (median of {len(times) - 1} decode steps; the first, "
              f"compiling, {times[0]:.2f} s)")
    first = next(iter(generated.values()))
    for mode, tokens in generated.items():
        if not np.array_equal(tokens, first):
            raise SystemExit(f"FAILED: {mode} generated {tokens.tolist()}, {next(iter(generated))} {first.tolist()}")
    print(f"  every mode generated the same {new_tokens} tokens per sequence: {first.tolist()}")
    if reference is not None:
        want = reference["generated"][:, prompt.shape[1]:]
        n = min(want.shape[1], new_tokens)
        if not np.array_equal(first[:, :n], want[:, :n]):
            raise SystemExit(f"FAILED: the first {n} tokens differ from transformers' {want[:, :n].tolist()}")
        print(f"  and the first {n} are those transformers generated (reference.npz)")


def lite_latency(layers: int, batches: list, context: int, steps: int) -> None:
    from te_async.bench import generate, timing

    dtype = jnp.bfloat16 if jax.default_backend() == "gpu" else jnp.float32
    params, config = generate.load_model("deepseek-v2-lite", layers=layers, dtype=dtype)
    print(f"DeepSeek-V2-Lite shapes, random weights, first {layers} layers, {jnp.dtype(dtype).name}, "
          f"context {context}, {steps} timed steps; per-token latency per mode:")
    generate.sweep(params, config, batches=batches, modes=list(generate.MODES), context=context, prompt_len=16,
                   steps=steps, check=2, hbm_bytes_per_s=timing.hbm_bandwidth(), log=print)


def main():
    gpu = jax.default_backend() == "gpu"
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=pathlib.Path, default=FIXTURE, help=f"a Hugging Face model directory (default: {FIXTURE})")
    parser.add_argument("--tokens", type=int, default=16, help="tokens to generate per sequence (default: 16)")
    parser.add_argument("--lite-layers", type=int, default=4 if gpu else 0,
                        help="layers of the DeepSeek-V2-Lite-shaped model to time, 0 for none (default: 4 on a GPU, 0 elsewhere)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8], help="its batches (default: 1 8)")
    parser.add_argument("--context", type=int, default=4096, help="its cache length (default: 4096)")
    parser.add_argument("--steps", type=int, default=50, help="its timed steps per mode and batch (default: 50)")
    args = parser.parse_args()
    print(f"backend {jax.default_backend()}, jax {jax.__version__}, CUDA handlers built: {te_async.cuda_extension_built()}")
    checkpoint_generation(args.checkpoint, args.tokens)
    if args.lite_layers:
        lite_latency(args.lite_layers, args.batches, args.context, args.steps)
    print("ok")


if __name__ == "__main__":
    main()
