"""The routers of the supported models, on the normalised hidden state, in float32.

softmax over the experts, top-k (DeepSeek's "group_limited_greedy" first keeps the topk_group
groups with the best single expert and zeroes the rest), optional renormalisation of the k weights
(norm_topk_prob; always for Mixtral), then DeepSeek's routed_scaling_factor (1.0 elsewhere). This
is transformers 5.24's MixtralTopKRouter, Qwen2MoeTopKRouter / Qwen3MoeTopKRouter and
DeepseekV2TopkRouter; te_async.moe.route_top_k covers only the always-renormalised case.
"""

import jax
import jax.numpy as jnp

from ..dense import linear
from ..moe import Routing


def route(x: jax.Array, router: jax.Array, cfg) -> Routing:
    """x [T, H], router [H, E] -> Routing(weights float32 [T, k], experts int32 [T, k])."""
    logits = linear(x.astype(jnp.float32), router.astype(jnp.float32))
    probs = jax.nn.softmax(logits, axis=-1)
    if cfg.topk_method == "group_limited_greedy":
        t, e = probs.shape
        per_group = e // cfg.n_group
        best_in_group = probs.reshape(t, cfg.n_group, per_group).max(axis=-1)
        _, groups = jax.lax.top_k(best_in_group, cfg.topk_group)
        kept = jnp.zeros((t, cfg.n_group), bool).at[jnp.arange(t)[:, None], groups].set(True)
        probs = jnp.where(jnp.repeat(kept, per_group, axis=1), probs, 0.0)
    weights, experts = jax.lax.top_k(probs, cfg.num_experts_per_tok)
    if cfg.norm_topk_prob:
        weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    return Routing(weights * cfg.routed_scaling_factor, experts.astype(jnp.int32))
