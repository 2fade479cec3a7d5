"""The routers of the supported models, on the normalised hidden state, in float32.

softmax over the experts, top-k (DeepSeek-V2's "group_limited_greedy" first keeps the topk_group
groups with the best single expert and zeroes the rest), optional renormalisation of the k weights
(norm_topk_prob; always for Mixtral), then DeepSeek's routed_scaling_factor (1.0 elsewhere).
DeepSeek-V3 ("noaux_tc") scores by sigmoid instead and chooses with its correction bias
(te_async.routing says how). This is transformers 5.24's MixtralTopKRouter, Qwen2MoeTopKRouter /
Qwen3MoeTopKRouter, DeepseekV2TopkRouter and DeepseekV3TopkRouter, computed by
te_async.routing.route (one CUDA kernel at decode sizes, for either scoring).
"""

import jax
import jax.numpy as jnp

from ..dense import linear
from ..routing import route as route_logits


def top_k_options(cfg) -> dict:
    """The config's top-k options, as te_async.routing.route and te_async.token_moe.Router take
    them (route() adds the scoring and the correction bias; token_moe takes softmax only)."""
    grouped = cfg.topk_method != "greedy"
    return dict(renormalize=cfg.norm_topk_prob, scaling=cfg.routed_scaling_factor,
                n_group=cfg.n_group if grouped else 1, topk_group=cfg.topk_group if grouped else 1)


def route(x: jax.Array, p: dict, cfg) -> tuple:
    """x [T, H] and the MoE params' router [H, E] (and router_bias) -> (Routing(weights float32
    [T, k], experts int32 [T, k]), Dispatch)."""
    logits = linear(x.astype(jnp.float32), p["router"].astype(jnp.float32))
    return route_logits(logits, cfg.num_experts_per_tok, **top_k_options(cfg), scoring=cfg.scoring_func,
                        correction_bias=p.get("router_bias"))
