"""Training a real (tiny) MoE checkpoint through te_async: mixed precision, every parameter.

Loads the tiny DeepSeek-V2 checkpoint committed in tests/fixtures/hf/deepseek_v2 (Hugging Face
format: latent attention, 12 routed experts top-3, a shared expert, a dense first layer) as float32
master weights, and runs plain SGD on the next-token cross-entropy of one batch of random tokens:
each step casts the weights to bf16 (the routers stay float32) and differentiates
te_async.models.forward, whose backward runs bf16 GEMMs (te_async.mixed_precision), gathers
instead of scatter-adds through the MoE permutation, and recomputes the norms', activations' and
attention's float32 values instead of keeping them. It does so for the routed experts through
te_async.grouped_mlp in device mode and through jax.lax.ragged_dot, with and without remat, and
checks that each starts from the same loss and learns the batch.

    python examples/train.py [--checkpoint DIR] [--steps 30] [--lr 0.5]
"""

import argparse
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np

import te_async.models as models

FIXTURE = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "hf" / "deepseek_v2"
PATHS = {"te_async device": dict(group_sizes_mode="device"), "ragged_dot": dict(experts="ragged_dot")}


def bf16_forward_weights(params):
    """The weights a step computes with: bf16, but the float32 routers (as the models keep them)."""
    return jax.tree_util.tree_map_with_path(
        lambda path, a: a if path[-1].key in ("router", "router_bias") else a.astype(jnp.bfloat16), params)


def make_step(config, lr: float, remat: bool, **path):
    def loss(params, tokens):
        return models.next_token_loss(bf16_forward_weights(params), config, tokens, remat=remat, **path)

    @jax.jit
    def step(params, tokens):
        value, grads = jax.value_and_grad(loss)(params, tokens)
        return value, jax.tree.map(lambda w, g: w - lr * g, params, grads)

    return step


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", type=pathlib.Path, default=FIXTURE)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--lr", type=float, default=0.5)
    args = p.parse_args()

    params, config = models.load_hf(args.checkpoint, jnp.float32)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, config.vocab_size, (4, 33)), jnp.int32)
    print(f"{args.checkpoint.name}: {config.model_type}, {config.num_hidden_layers} layers, "
          f"{config.num_experts} experts top-{config.num_experts_per_tok}; batch {tokens.shape[0]} x "
          f"{tokens.shape[1] - 1} tokens, {jax.default_backend()}")
    curves = {}
    for remat in (False, True):
        for name, path in PATHS.items():
            step, weights, losses = make_step(config, args.lr, remat, **path), params, []
            t0 = time.perf_counter()
            for _ in range(args.steps):
                value, weights = step(weights, tokens)
                losses.append(float(value))
            label = f"{name}{', remat' if remat else ''}"
            curves[label] = losses
            print(f"  {label:26s} loss {losses[0]:.3f} -> {losses[-1]:.3f} in {args.steps} steps "
                  f"({time.perf_counter() - t0:.1f} s, the first step compiles)")
            assert np.isfinite(losses).all() and losses[-1] < 0.5 * losses[0], f"{label} did not learn: {losses}"
    first = next(iter(curves.values()))[0]
    for label, losses in curves.items():  # one forward's math: the first losses agree to bf16 noise
        assert abs(losses[0] - first) < 1e-2 * first, f"{label}'s first loss {losses[0]} against {first}"
    print("ok")


if __name__ == "__main__":
    main()
