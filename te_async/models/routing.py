"""The routers of the supported models, on the normalised hidden state, in float32.

softmax over the experts, top-k (DeepSeek's "group_limited_greedy" first keeps the topk_group
groups with the best single expert and zeroes the rest), optional renormalisation of the k weights
(norm_topk_prob; always for Mixtral), then DeepSeek's routed_scaling_factor (1.0 elsewhere). This
is transformers 5.24's MixtralTopKRouter, Qwen2MoeTopKRouter / Qwen3MoeTopKRouter and
DeepseekV2TopkRouter, computed by te_async.routing.route (one CUDA kernel at decode sizes).
"""

import jax
import jax.numpy as jnp

from ..dense import linear
from ..routing import route as route_logits


def top_k_options(cfg) -> dict:
    """The config's routing options, as te_async.routing.route and te_async.token_moe.Router take them."""
    grouped = cfg.topk_method == "group_limited_greedy"
    return dict(renormalize=cfg.norm_topk_prob, scaling=cfg.routed_scaling_factor,
                n_group=cfg.n_group if grouped else 1, topk_group=cfg.topk_group if grouped else 1)


def route(x: jax.Array, router: jax.Array, cfg) -> tuple:
    """x [T, H], router [H, E] -> (Routing(weights float32 [T, k], experts int32 [T, k]), Dispatch)."""
    logits = linear(x.astype(jnp.float32), router.astype(jnp.float32))
    return route_logits(logits, cfg.num_experts_per_tok, **top_k_options(cfg))
