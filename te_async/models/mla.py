"""DeepSeek-V2/V3 multi-head latent attention (transformers' DeepseekV2Attention and
DeepseekV3Attention, 5.24).

Queries come from q_proj, or from q_a_proj -> RMSNorm -> q_b_proj when q_lora_rank is set; each
head splits into a no-rope part and a rope part. Keys and values come from one compressed latent:
kv_a_proj_with_mqa gives [c | k_pe]; c goes through kv_a_layernorm and kv_b_proj into per-head
k_nope and v, while k_pe, one rope key shared by every head, is rotated. The softmax scale is
qk_head_dim^-0.5, times YaRN's mscale(factor, mscale_all_dim)^2 when the rope is scaled.

The KV cache holds what decode needs and no more: the normalised latent c [B, max_len,
kv_lora_rank] and the rotated k_pe [B, max_len, qk_rope_head_dim], 576 values per token for
DeepSeek-V2-Lite against 16 * (192 + 128) = 5120 for the expanded keys and values. Decode never
expands the cache: kv_b_proj is absorbed into the query and the output (q_nope . W_uk c =
(q_nope W_uk) . c, and p (c W_uv) = (p c) W_uv), so a step reads the cache once and multiplies
by kv_b_proj once per new token instead of once per cached token (te_async.mla_decode; at one new
token per sequence and the batches te_async.mla_token.takes, mla_sublayer runs the whole attention
half of the layer, from the norm to the residual add, as that one call). A whole sequence (forward,
prefill) takes the expanded path, as transformers does, which costs fewer FLOPs there
(te_async.sequence_attention: cuDNN's flash attention on the GPU).

kv_b_proj's weight is kept as transformers stores it, [heads * (nope + v), latent]: head-major, the
layout in which XLA's per-head products of the absorbed decode read it in place. Stored [latent,
heads * (nope + v)], XLA transposed every layer's copy before each decode step's scan (DeepSeek-
V2-Lite: 109 MB, a 57 us kernel per step; docs/internals.md, decode attention).
"""

from typing import Optional

import jax
import jax.numpy as jnp

from .. import mixed_precision, mla_token
from ..mla_decode import mla_decode_attention
from ..sequence_attention import causal_attention
from .attention import linear, project_input, restacked, stacked, write
from .config import yarn_mscale
from .norm import rms_norm
from .rope import apply_rope, interleaved_to_half

LATENT_NORM_EPS = 1e-6  # q_a_layernorm and kv_a_layernorm use the RMSNorm default, not rms_norm_eps


def softmax_scale(cfg) -> float:
    scale = (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim) ** -0.5
    if cfg.rope_scaling is not None and cfg.rope_scaling.mscale_all_dim:
        scale *= yarn_mscale(cfg.rope_scaling.factor, cfg.rope_scaling.mscale_all_dim) ** 2
    return scale


def _rope(x: jax.Array, cos: jax.Array, sin: jax.Array, interleaved: bool) -> jax.Array:
    """DeepSeek's interleaved pairs (V2, and V3 with rope_interleave), else the halves as stored."""
    return apply_rope(interleaved_to_half(x) if interleaved else x, cos, sin)


def mla_attention(p: dict, cfg, x: jax.Array, cos: jax.Array, sin: jax.Array, cache: Optional[dict],
                  position, window: Optional[int] = None) -> tuple:
    """(output [B,S,hidden], cache) for x [B,S,hidden]; `position` as in attention.gqa_attention."""
    b, s, _ = x.shape
    heads, nope, rope_dim, vdim = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
    proj = project_input(x, p, cfg)
    if cfg.q_lora_rank is None:
        q = proj["q"]
    else:
        q = linear(rms_norm(proj["q_a"], p["q_a_norm"], LATENT_NORM_EPS), p["wq_b"])
    q = q.reshape(b, s, heads, nope + rope_dim)
    ckv = proj["kv_a"]
    w_kv = _w_kv(p, cfg)
    scale = softmax_scale(cfg)
    q_nope, q_pe = q[..., :nope], _rope(q[..., nope:], cos, sin, cfg.rope_interleave)
    c = rms_norm(ckv[..., :cfg.kv_lora_rank], p["kv_a_norm"], LATENT_NORM_EPS)
    k_pe = _rope(ckv[..., None, cfg.kv_lora_rank:], cos, sin, cfg.rope_interleave)[:, :, 0]  # [B, S, rope_dim]
    if position is None:
        kv = mixed_precision.einsum("bsr,hdr->bshd", c, w_kv).astype(x.dtype)
        k = jnp.concatenate([kv[..., :nope], jnp.broadcast_to(k_pe[:, :, None], (b, s, heads, rope_dim))], axis=-1)
        out = causal_attention(jnp.concatenate([q_nope, q_pe], axis=-1), k, kv[..., nope:], scale, window)
        if cache is not None:
            cache = {"ckv": write(cache["ckv"], c, 0), "kpe": write(cache["kpe"], k_pe, 0)}
    else:
        cache = {"ckv": write(cache["ckv"], c, position), "kpe": write(cache["kpe"], k_pe, position)}
        out = _absorbed(q_nope, q_pe, w_kv, cache, position, window, scale)
    return linear(out.reshape(b, s, heads * vdim), p["wo"], p.get("bo")), cache


def mla_sublayer(p: dict, cfg, x: jax.Array, norm: jax.Array, eps: float, cos: jax.Array, sin: jax.Array,
                 cache: Optional[dict], position, window: Optional[int] = None) -> tuple:
    """(x + mla_attention(rms_norm(x, norm, eps)), cache): a decoder layer's attention half. One new
    token per sequence without q_lora_rank or projection biases, where te_async.mla_token.takes it,
    runs as that one FFI call, which writes the cache rows itself."""
    if position is not None and cfg.q_lora_rank is None and not {"bkv_a", "bo"} & p.keys():
        (ckv, layer), (kpe, _), w_kv = stacked(cache["ckv"]), stacked(cache["kpe"]), _w_kv(p, cfg)
        if mla_token.takes(x, p["w_in"], w_kv, p["wo"], ckv):
            out, ckv, kpe = mla_token.mla_token_block(
                x, norm, p["w_in"], p["kv_a_norm"], w_kv, p["wo"], cos[0], sin[0], ckv, kpe, position,
                layer, eps=eps, latent_eps=LATENT_NORM_EPS, scale=softmax_scale(cfg),
                interleaved=cfg.rope_interleave, window=window)
            return out, {"ckv": restacked(cache["ckv"], ckv), "kpe": restacked(cache["kpe"], kpe)}
    a, cache = mla_attention(p, cfg, rms_norm(x, norm, eps), cos, sin, cache, position, window)
    return x + a, cache


def _w_kv(p: dict, cfg) -> jax.Array:
    """kv_b_proj's weight as [heads, nope + v_head_dim, kv_lora_rank] (a bitcast of the stored layout)."""
    return p["wkv_b"].reshape(cfg.num_attention_heads, cfg.qk_nope_head_dim + cfg.v_head_dim, cfg.kv_lora_rank)


def _absorbed(q_nope, q_pe, w_kv, cache, position, window, scale) -> jax.Array:
    """Attention straight over the compressed cache: [B,S,heads,v_head_dim]. The latent is one key
    head shared by all heads and also the values, read once, in place (te_async.mla_decode)."""
    (ckv, layer), (kpe, _) = stacked(cache["ckv"]), stacked(cache["kpe"])
    return mla_decode_attention(q_nope, q_pe, w_kv, ckv, kpe, position, scale=scale, layer=layer, window=window)
