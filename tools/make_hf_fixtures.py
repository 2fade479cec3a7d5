"""Tiny random Hugging Face MoE checkpoints + transformers reference outputs, for the parity test.

tests/test_models_hf_parity.py checks te_async.models against these fixtures in CI, where torch
and transformers are NOT installed: it needs only numpy, jax and safetensors. This script is the
only place torch/transformers are used. Rerun it (it rewrites tests/fixtures/hf/ completely) with

    python3 -m venv /tmp/hfvenv
    /tmp/hfvenv/bin/pip install 'torch==2.13.0+cpu' 'transformers==5.24.0' safetensors numpy
    /tmp/hfvenv/bin/python tools/make_hf_fixtures.py          # from the repository root

('torch==2.13.0+cpu', a 192 MB CPU-only wheel, is what PyPI here offered; the plain `torch`
2.14.1 wheel is 555 MB plus several GB of CUDA wheels, none of which this needs.) The fixtures
were made with torch 2.13.0+cpu, transformers 5.24.0, safetensors 0.8.0, numpy 2.4.6. Everything
is float32 and seeded, so a rerun with these versions gives the same files.

Each fixture directory tests/fixtures/hf/<name>/ holds
    config.json        as transformers writes it (bos/eos/pad ids set to null), except where
                       "hub-style config" is said below
    model.safetensors  one shard, float32, names as listed below
    reference.npz      tokens    int32   [2, 7]      random prompt ids
                       logits    float32 [2, 7, 97]  model(tokens).logits: eval, use_cache=False,
                                                     attention mask all ones, eager attention
                       generated int32   [2, 13]     model.generate(tokens, max_new_tokens=6,
                                                     do_sample=False): greedy with its KV cache;
                                                     no eos (eos_token_id None), so never stops early
and tests/fixtures/hf/manifest.json records the versions, seeds and safety margins. At the end
of this file, np_load/np_forward/np_generate are a plain numpy version of the notes below; the
script checks every fixture against it too (it reproduces the logits to ~5e-7 and the tokens).

What the transformers 5.24.0 modeling files do (what te_async.models has to match)
--------------------------------------------------------------------------------
Common to all five (models/<type>/modeling_<type>.py):
  * Pre-norm decoder: h += attn(input_layernorm(h)); h += mlp(post_attention_layernorm(h));
    logits = lm_head(norm(h)). No tied embeddings (tie_word_embeddings false: lm_head.weight is
    stored). RMSNorm: x * rsqrt(mean(x^2) + eps) * weight, computed in float32, eps =
    rms_norm_eps (mixtral default 1e-5, others 1e-6); norm weights are random here (not ones).
  * nn.Linear weights are [out, in] (y = x @ W.T); biases only where listed.
  * Experts (the reference runs experts_implementation="eager", the per-expert loop in the
    modeling file, not 5.24's default "grouped_mm"): act = silu;
    expert(x) = down(silu(gate(x)) * up(x)); the MoE output is sum_k weight_k * expert_{idx_k}(x).
    Dense MLPs (Qwen mlp, DeepSeek first layers, shared experts) are the same gate/up/down SwiGLU.
  * Attention: causal softmax(q k^T * scaling) v, float32 softmax, GQA by repeating kv heads
    (head h uses kv head h // (n_heads // n_kv_heads)).
  * RoPE inv_freq = 1 / theta^(arange(0, d, 2) / d) with d = the rotary dim, theta =
    rope_parameters["rope_theta"] (hub configs: top-level "rope_theta"), positions 0..S-1 then
    continuing through the cache during generation. rope_type "default" everywhere here.
mixtral (MixtralForCausalLM):
  * head_dim = config.head_dim if set else hidden // heads (the fixture sets head_dim=10 with
    hidden 44, heads 4: NOT hidden // heads). Scaling head_dim**-0.5. q/k/v/o without bias.
  * RoPE "rotate_half" (GPT-NeoX) layout: x1 = x[..., :d/2], x2 = x[..., d/2:],
    out = x * cos + cat(-x2, x1) * sin with cos/sin = cat(freqs, freqs).
  * Router (block_sparse_moe.gate): probs = softmax(x @ Wg.T) in float32; top-k; ALWAYS
    renormalised: w = topk / sum(topk) (no norm_topk_prob flag for mixtral).
qwen2_moe (Qwen2MoeForCausalLM):
  * q/k/v have biases (qkv_bias true by default); o_proj has none. head_dim = hidden // heads
    (the config class has no head_dim field). RoPE rotate_half as mixtral.
  * Layer i is sparse iff i not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0;
    otherwise a dense mlp with intermediate_size.
  * Router: softmax float32, top-k, renormalised ONLY if norm_topk_prob (false in the fixture:
    plain top-k probabilities, which do not sum to 1).
  * Shared expert: out = experts(x) + sigmoid(x @ shared_expert_gate.T) * shared_expert(x),
    shared_expert a SwiGLU MLP with shared_expert_intermediate_size; shared_expert_gate [1, H].
qwen3_moe (Qwen3MoeForCausalLM):
  * head_dim from config (10 with hidden 36, heads 4). q/k/v/o bias = attention_bias (false).
  * q_norm / k_norm: RMSNorm over head_dim (weight [head_dim], eps = rms_norm_eps), applied per
    head to q and k right after the projection, BEFORE RoPE. RoPE rotate_half.
  * Same sparse-layer rule and router as qwen2_moe (fixture: norm_topk_prob true,
    decoder_sparse_step 2 with 3 layers: only layer 1 is MoE); no shared expert.
  * transformers 5.24 writes "num_local_experts" into a qwen3_moe config.json (attribute_map
    num_experts -> num_local_experts); hub checkpoints say "num_experts". The qwen3_moe fixture
    has a hub-style config (see below), so it says "num_experts"; qwen3_moe_fused keeps 5.24's
    "num_local_experts" (a loader that reads only "num_experts" and falls back to a default of
    128 gets it wrong).
deepseek_v2 (DeepseekV2ForCausalLM), MLA:
  * qk_head_dim = qk_nope_head_dim + qk_rope_head_dim; scaling = qk_head_dim**-0.5 (times a yarn
    mscale^2 only for non-default rope with mscale_all_dim; not used here).
  * q = q_proj(x) if q_lora_rank is None else q_b_proj(q_a_layernorm(q_a_proj(x)));
    q viewed [B, S, heads, qk_head_dim], split into q_nope [nope] | q_pe [rope].
  * ckv = kv_a_proj_with_mqa(x) [kv_lora_rank + qk_rope_head_dim], split kv | k_pe;
    kv = kv_a_layernorm(kv); kv_b_proj(kv) viewed [B, S, heads, qk_nope_head_dim + v_head_dim],
    split k_nope | v. k_pe is ONE head shared by all heads (MQA-style), not normed.
    Key = cat(k_nope, rope(k_pe)), query = cat(q_nope, rope(q_pe)).
  * q_a_layernorm / kv_a_layernorm are built with the DEFAULT eps 1e-6, not rms_norm_eps.
  * RoPE here is INTERLEAVED (complex pairs): rotary dim d = qk_rope_head_dim (config.head_dim
    is set to qk_rope_head_dim); pairs (x[2i], x[2i+1]) are multiplied as complex numbers by
    exp(1j * pos * inv_freq[i]), and the result stays interleaved:
        out[2i]   = x[2i] * cos_i - x[2i+1] * sin_i
        out[2i+1] = x[2i] * sin_i + x[2i+1] * cos_i
    (apply_rotary_emb with torch.view_as_complex). This is NOT rotate_half on the raw q_pe. It
    equals rotate_half after de-interleaving both q_pe and k_pe into [evens | odds], which is
    what DeepSeek's original remote code did; attention scores are the same either way.
  * Layer i is a dense SwiGLU mlp (intermediate_size) if i < first_k_dense_replace, else MoE.
  * Router (mlp.gate, weight kept float32): scores = softmax(x @ Wg.T) in float32.
    topk_method "greedy": top-k of scores. "group_limited_greedy": experts split into n_group
    contiguous groups of E / n_group; group score = MAX score in the group; keep the topk_group
    best groups, set the other experts' scores to 0, then top-k. Then w = topk * routed_scaling_factor.
    NO renormalisation in 5.24's DeepseekV2TopkRouter, whatever norm_topk_prob says (DeepSeek's
    remote code renormalised if norm_topk_prob and then skipped the scaling; every fixture here
    has norm_topk_prob false, where both agree).
  * MoE out = experts(x) + shared_experts(x), shared_experts a SwiGLU MLP with
    moe_intermediate_size * n_shared_experts, NOT gated.

deepseek_v3 (DeepseekV3ForCausalLM): deepseek_v2's MLA, dense first layers and shared experts,
with two differences:
  * RoPE: interleaved as deepseek_v2 when rope_interleave (the default); with rope_interleave
    false, rotate_half on q_pe and k_pe as stored (mixtral's convention).
  * Router (mlp.gate, DeepseekV3TopkRouter, weight float32 [E, H] and the float32 buffer
    e_score_correction_bias [E]), whatever scoring_func / topk_method say: scores =
    sigmoid(x @ Wg.T); choice = scores + bias; group score = the SUM OF THE TWO largest choice
    values in the group (n_group groups of E / n_group, also when n_group = 1); keep topk_group
    groups, the others' choice set to -inf; top-k of choice; weights = the chosen experts'
    scores WITHOUT the bias; renormalised (sum + 1e-20) if norm_topk_prob (honoured, unlike V2);
    then times routed_scaling_factor.
  * Hub configs also carry scoring_func "sigmoid", topk_method "noaux_tc" and
    num_nextn_predict_layers (multi-token-prediction layers stored after the last decoder
    layer, which transformers does not load).

Safetensors names and shapes save_pretrained writes (E experts, H hidden, I moe intermediate,
F dense intermediate, nh heads, nkv kv heads, hd head_dim, L = model.layers.{i}):
  all:        model.embed_tokens.weight [V, H]; model.norm.weight [H]; lm_head.weight [V, H];
              L.input_layernorm.weight [H]; L.post_attention_layernorm.weight [H]
  mixtral:    L.self_attn.{q,o}_proj.weight [nh*hd, H] / [H, nh*hd]; L.self_attn.{k,v}_proj.weight
              [nkv*hd, H]; L.block_sparse_moe.gate.weight [E, H];
              L.block_sparse_moe.experts.{e}.w1.weight [F, H] (gate), .w3.weight [F, H] (up),
              .w2.weight [H, F] (down)   (mixtral experts use intermediate_size F)
  qwen2_moe:  q/k/v/o as mixtral plus L.self_attn.{q,k,v}_proj.bias [nh*hd] / [nkv*hd];
              sparse layers: L.mlp.gate.weight [E, H]; L.mlp.experts.{e}.{gate,up}_proj.weight
              [I, H], .down_proj.weight [H, I]; L.mlp.shared_expert.{gate,up}_proj.weight [Is, H],
              .down_proj.weight [H, Is]; L.mlp.shared_expert_gate.weight [1, H];
              dense layers: L.mlp.{gate,up}_proj.weight [F, H], L.mlp.down_proj.weight [H, F]
  qwen3_moe:  q/k/v/o as mixtral (no bias); L.self_attn.{q,k}_norm.weight [hd]; sparse layers:
              L.mlp.gate.weight and L.mlp.experts.{e}.* as qwen2_moe (no shared expert);
              dense layers as qwen2_moe
  deepseek_v2: L.self_attn.q_proj.weight [nh*(nope+rope), H] (q_lora_rank None) or
              L.self_attn.q_a_proj.weight [q_lora, H], L.self_attn.q_a_layernorm.weight [q_lora],
              L.self_attn.q_b_proj.weight [nh*(nope+rope), q_lora];
              L.self_attn.kv_a_proj_with_mqa.weight [kv_lora + rope, H];
              L.self_attn.kv_a_layernorm.weight [kv_lora];
              L.self_attn.kv_b_proj.weight [nh*(nope+v), kv_lora]; L.self_attn.o_proj.weight [H, nh*v];
              MoE layers: L.mlp.gate.weight [E, H]; L.mlp.experts.{e}.{gate,up}_proj.weight [I, H],
              .down_proj.weight [H, I]; L.mlp.shared_experts.{gate,up}_proj.weight [I*ns, H],
              .down_proj.weight [H, I*ns]; dense layers as qwen2_moe
  deepseek_v3: as deepseek_v2, plus L.mlp.gate.e_score_correction_bias [E] in MoE layers
That per-expert naming is what transformers 5.24 WRITES (save_pretrained reverts its in-memory
fused layout to the original checkpoint format by default). In memory, and in a checkpoint saved
with save_pretrained(save_original_format=False), the experts are fused:
  L.mlp.experts.gate_up_proj [E, 2*I, H] = concat([gate_proj_e ; up_proj_e], axis 0) per expert
                                            (mixtral: [w1_e ; w3_e]); gate rows first
  L.mlp.experts.down_proj    [E, H, I]   = down_proj_e (mixtral: w2_e)
(no ".weight" suffix), and mixtral's "block_sparse_moe." prefix becomes "mlp." for the router
too (L.mlp.gate.weight). The *_fused fixtures are exactly that: the base fixture's tensors
reshuffled as above (this script checks that transformers' own save_original_format=False
writes the identical tensors, and that from_pretrained on them reproduces the reference).

Hub-style config (fixtures marked so below): config.json rewritten the way hub checkpoints
(Qwen3-30B-A3B, DeepSeek-V2) spell it: top-level "rope_theta" (and "rope_scaling": null)
instead of "rope_parameters"; qwen3_moe "num_experts" instead of "num_local_experts"; deepseek
without the derived "head_dim"/"qk_head_dim" keys. This script checks that transformers reads it
back as the same model (identical logits). Configs as transformers 5.24 writes them (mixtral,
mixtral_fused, qwen2_moe, qwen3_moe_fused, deepseek_v2) carry "rope_parameters":
{"rope_theta": ..., "rope_type": "default"} and no top-level rope_theta; deepseek_v2's also
carries "head_dim" (= qk_rope_head_dim) and "qk_head_dim". Hub DeepSeek-V2 configs also carry
"moe_layer_freq" (1), which transformers 5.24 ignores (DeepSeek's code: MoE iff
i >= first_k_dense_replace and i % moe_layer_freq == 0).

The fixtures (see FIXTURES below; all 97-token vocab, B=2, S=7, 6 new tokens):
  mixtral         hidden 44, 4 heads / 2 kv heads, head_dim 10 (!= 44/4), F 14, 12 experts
                  top-2 (renormalised), 2 layers, rope_theta 50000, rms_norm_eps 1e-5
  mixtral_fused   the same model with fused expert tensors (other naming scheme), same config
  qwen2_moe       hidden 36, 6 heads / 2 kv heads, head_dim 6, qkv bias, 3 layers,
                  mlp_only_layers [0] (layer 0 dense F 20), 12 experts top-3, I 12,
                  norm_topk_prob false, shared expert Is 14 with sigmoid gate, rope_theta 123456
  qwen3_moe       hidden 36, 4 heads / 2 kv heads, head_dim 10 (!= 36/4), q/k norm, 3 layers,
                  decoder_sparse_step 2 (only layer 1 MoE; 0 and 2 dense F 20), 16 experts
                  top-4, I 12, norm_topk_prob true, rope_theta 77777, hub-style config
  qwen3_moe_fused the same model with fused expert tensors, and config.json as transformers
                  wrote it (rope_parameters, num_local_experts): same model, other spelling
  deepseek_v2     MLA without q LoRA: hidden 36, 4 heads, nope 6, rope 4, v 10, kv_lora 14,
                  3 layers, first_k_dense_replace 1, 12 experts top-3 "greedy", I 12,
                  1 shared expert, routed_scaling_factor 1, rope_theta 20000
  deepseek_v2_lora  MLA with q LoRA 10: hidden 36, 3 heads, nope 4, rope 6, v 6, kv_lora 12,
                  3 layers, first_k_dense_replace 1, 16 experts top-3 "group_limited_greedy"
                  (n_group 4, topk_group 2), routed_scaling_factor 2.5, 2 shared experts (I 10
                  -> 20), rope_theta 40000, hub-style config
  deepseek_v3     MLA with q LoRA 10: hidden 36, 4 heads, nope 6, rope 4, v 10, kv_lora 14,
                  3 layers, first_k_dense_replace 1, 16 experts top-3, n_group 4, topk_group 2,
                  norm_topk_prob true, routed_scaling_factor 2.5, 1 shared expert (I 10),
                  rope_theta 30000, interleaved rope, hub-style config (with scoring_func,
                  topk_method and num_nextn_predict_layers 0)
  deepseek_v3_flat  no q LoRA: hidden 36, 3 heads, nope 4, rope 6, v 6, kv_lora 12, 3 layers,
                  first_k_dense_replace 1, 12 experts top-4, n_group 1, norm_topk_prob false,
                  routed_scaling_factor 1.5, 2 shared experts (I 6 -> 12), rope_interleave
                  false, rope_theta 60000
Every fixture has more experts than a decode step has tokens (2), so most groups are empty.

Weights are redrawn after construction (transformers' std 0.02 init gives near-constant logits):
N(0, 1) embeddings, N(0, gain^2 / fan_in) matrices (routers and lm_head with a larger gain so
that routing and greedy tokens vary), N(0, 0.2^2) biases, 1 + N(0, 0.25^2) norm weights, N(0, 0.3^2)
correction biases (so that they move routing decisions: without them the deepseek_v3 fixtures'
logits change by 64-70 %). Each fixture's seed is the first at or after its base seed whose
outputs are well conditioned: every router's k-th vs (k+1)-th probability (or biased sigmoid
score) gap (and group gap) >= 2e-4 in the forward and in every generation step, every greedy
step's top-1 vs top-2 logit gap >= 2e-3, and each row's 6 new tokens take at least 3 distinct
values. So a correct float32 implementation cannot flip a routing decision or a greedy token
through rounding.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile

import numpy as np
from safetensors import safe_open

torch = transformers = None  # imported by main(): the numpy reference below needs neither

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "hf")
VOCAB, BATCH, SEQ, NEW = 97, 2, 7, 6
ROUTER_GAP, LOGIT_GAP, MIN_DISTINCT = 2e-4, 2e-3, 3
NO_SPECIAL = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None, tie_word_embeddings=False)

FIXTURES = [
    dict(
        name="mixtral", cls="Mixtral", seed=100, fused_copy=True, hub_config=False,
        config=dict(
            vocab_size=VOCAB, hidden_size=44, intermediate_size=14, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=10, num_local_experts=12,
            num_experts_per_tok=2, rope_theta=50000.0, rms_norm_eps=1e-5, max_position_embeddings=64,
        ),
    ),
    dict(
        name="qwen2_moe", cls="Qwen2Moe", seed=200, fused_copy=False, hub_config=False,
        config=dict(
            vocab_size=VOCAB, hidden_size=36, intermediate_size=20, moe_intermediate_size=12,
            shared_expert_intermediate_size=14, num_hidden_layers=3, num_attention_heads=6,
            num_key_value_heads=2, num_experts=12, num_experts_per_tok=3, norm_topk_prob=False,
            mlp_only_layers=[0], decoder_sparse_step=1, rope_theta=123456.0, max_position_embeddings=64,
        ),
    ),
    dict(
        name="qwen3_moe", cls="Qwen3Moe", seed=300, fused_copy=True, hub_config=True,
        config=dict(
            vocab_size=VOCAB, hidden_size=36, intermediate_size=20, moe_intermediate_size=12,
            num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=10,
            num_experts=16, num_experts_per_tok=4, norm_topk_prob=True, mlp_only_layers=[],
            decoder_sparse_step=2, rope_theta=77777.0, max_position_embeddings=64,
        ),
    ),
    dict(
        name="deepseek_v2", cls="DeepseekV2", seed=400, fused_copy=False, hub_config=False,
        config=dict(
            vocab_size=VOCAB, hidden_size=36, intermediate_size=20, moe_intermediate_size=12,
            num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=None,
            kv_lora_rank=14, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=10,
            n_routed_experts=12, num_experts_per_tok=3, n_shared_experts=1, first_k_dense_replace=1,
            topk_method="greedy", n_group=None, topk_group=None, routed_scaling_factor=1.0,
            norm_topk_prob=False, rope_theta=20000.0, max_position_embeddings=64,
        ),
    ),
    dict(
        name="deepseek_v2_lora", cls="DeepseekV2", seed=500, fused_copy=False, hub_config=True,
        config=dict(
            vocab_size=VOCAB, hidden_size=36, intermediate_size=20, moe_intermediate_size=10,
            num_hidden_layers=3, num_attention_heads=3, num_key_value_heads=3, q_lora_rank=10,
            kv_lora_rank=12, qk_nope_head_dim=4, qk_rope_head_dim=6, v_head_dim=6,
            n_routed_experts=16, num_experts_per_tok=3, n_shared_experts=2, first_k_dense_replace=1,
            topk_method="group_limited_greedy", n_group=4, topk_group=2, routed_scaling_factor=2.5,
            norm_topk_prob=False, rope_theta=40000.0, max_position_embeddings=64,
        ),
    ),
    dict(
        name="deepseek_v3", cls="DeepseekV3", seed=600, fused_copy=False, hub_config=True,
        config=dict(
            vocab_size=VOCAB, hidden_size=36, intermediate_size=20, moe_intermediate_size=10,
            num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=10,
            kv_lora_rank=14, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=10,
            n_routed_experts=16, num_experts_per_tok=3, n_shared_experts=1, first_k_dense_replace=1,
            n_group=4, topk_group=2, routed_scaling_factor=2.5, norm_topk_prob=True,
            rope_interleave=True, rope_theta=30000.0, max_position_embeddings=64,
        ),
    ),
    dict(
        name="deepseek_v3_flat", cls="DeepseekV3", seed=700, fused_copy=False, hub_config=False,
        config=dict(
            vocab_size=VOCAB, hidden_size=36, intermediate_size=20, moe_intermediate_size=6,
            num_hidden_layers=3, num_attention_heads=3, num_key_value_heads=3, q_lora_rank=None,
            kv_lora_rank=12, qk_nope_head_dim=4, qk_rope_head_dim=6, v_head_dim=6,
            n_routed_experts=12, num_experts_per_tok=4, n_shared_experts=2, first_k_dense_replace=1,
            n_group=1, topk_group=1, routed_scaling_factor=1.5, norm_topk_prob=False,
            rope_interleave=False, rope_theta=60000.0, max_position_embeddings=64,
        ),
    ),
]

GAINS = {"gate": 2.5, "lm_head": 3.0}  # routers ("...mlp.gate.weight") and the output head
CORRECTION_BIAS_STD = 0.3  # DeepSeek-V3's e_score_correction_bias (a buffer, drawn apart)


def build(fx: dict, seed: int):
    cfg_cls = getattr(transformers, fx["cls"] + "Config")
    model_cls = getattr(transformers, fx["cls"] + "ForCausalLM")
    cfg = cfg_cls(**fx["config"], **NO_SPECIAL)
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = model_cls(cfg).to(torch.float32).eval()
    # The per-expert loop in modeling_<type>.py, not the default "grouped_mm" dispatch
    # (torch._grouped_mm also rejects sizes whose rows are not 16-byte multiples).
    model.set_experts_implementation("eager")
    assert model.config._experts_implementation == "eager"
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith(".weight"):
                p.copy_(1.0 + 0.25 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                gain = 1.0
                if name.endswith("mlp.gate.weight") or name.endswith("block_sparse_moe.gate.weight"):
                    gain = GAINS["gate"]
                elif name.startswith("lm_head"):
                    gain = GAINS["lm_head"]
                p.copy_(torch.randn(p.shape, generator=g) * (gain / p.shape[-1] ** 0.5))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(CORRECTION_BIAS_STD * torch.randn(b.shape, generator=g))
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = None
    model.generation_config.bos_token_id = None
    return model


def router_gaps(model, cfg) -> list:
    """Hooks every router; each call appends its smallest decision gap (probabilities)."""
    gaps: list = []
    k = cfg.num_experts_per_tok
    method = getattr(cfg, "topk_method", "greedy")

    def hook(mod, inputs, output):
        logits = output[0].detach().float()
        if cfg.model_type == "deepseek_v3":  # the choice by biased sigmoid scores, groups by their two best
            p = logits.sigmoid() + mod.e_score_correction_bias
            grp = p.view(p.shape[0], cfg.n_group, -1).topk(2, dim=-1).values.sum(-1)
            if cfg.n_group > 1:
                gs = grp.sort(dim=-1, descending=True).values
                gaps.append(float((gs[:, cfg.topk_group - 1] - gs[:, cfg.topk_group]).min()))
            keep = torch.zeros_like(grp).scatter_(1, grp.topk(cfg.topk_group, dim=-1).indices, 1.0)
            p = p.masked_fill(keep.repeat_interleave(p.shape[1] // cfg.n_group, dim=1) == 0, float("-inf"))
            s = p.sort(dim=-1, descending=True).values
            gaps.append(float((s[:, k - 1] - s[:, k]).min()))
            return
        p = torch.softmax(logits, dim=-1)
        if method == "group_limited_greedy":
            n_group, topk_group = cfg.n_group, cfg.topk_group
            grp = p.view(p.shape[0], n_group, -1).max(dim=-1).values
            gs = grp.sort(dim=-1, descending=True).values
            gaps.append(float((gs[:, topk_group - 1] - gs[:, topk_group]).min()))
            keep = torch.zeros_like(grp).scatter_(1, grp.topk(topk_group, dim=-1).indices, 1.0)
            p = p * keep.repeat_interleave(p.shape[1] // n_group, dim=1)
        s = p.sort(dim=-1, descending=True).values
        gaps.append(float((s[:, k - 1] - s[:, k]).min()))

    for name, mod in model.named_modules():
        if name.endswith("mlp.gate") or name.endswith("block_sparse_moe.gate"):
            if hasattr(mod, "weight") and mod.weight.shape[0] > 1:
                mod.register_forward_hook(hook)
    return gaps


def reference(model, tokens: np.ndarray):
    t = torch.from_numpy(tokens.astype(np.int64))
    mask = torch.ones_like(t)
    gaps = router_gaps(model, model.config)
    with torch.no_grad():
        logits = model(input_ids=t, attention_mask=mask, use_cache=False).logits.float().numpy()
        out = model.generate(
            input_ids=t, attention_mask=mask, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False,
            eos_token_id=None, pad_token_id=None, return_dict_in_generate=True, output_logits=True,
        )
    gen = out.sequences.numpy().astype(np.int32)
    step_logits = torch.stack(out.logits, dim=1).float()  # [B, NEW, V]
    top2 = step_logits.topk(2, dim=-1).values
    logit_gap = float((top2[..., 0] - top2[..., 1]).min())
    assert gen.shape == (BATCH, SEQ + NEW), gen.shape
    assert np.array_equal(gen[:, :SEQ], tokens)
    # greedy consistency: the generated tokens are the argmax of the returned step logits
    assert np.array_equal(step_logits.argmax(-1).numpy(), gen[:, SEQ:])
    # and the no-cache forward agrees with the first generated token
    assert np.array_equal(logits[:, -1].argmax(-1), gen[:, SEQ])
    return logits, gen, min(gaps), logit_gap


def fused_state(per_expert: dict, cfg) -> dict:
    """Per-expert checkpoint tensors -> transformers' in-memory fused layout (plain reshuffle)."""
    mixtral = cfg.model_type == "mixtral"
    out, experts = {}, {}
    for key, value in per_expert.items():
        if mixtral:
            key = key.replace(".block_sparse_moe.", ".mlp.")
        if ".mlp.experts." in key:
            prefix, rest = key.split(".mlp.experts.")
            e, proj, _ = rest.split(".")
            experts.setdefault(prefix, {}).setdefault(proj, {})[int(e)] = value
        else:
            out[key] = value
    gate, up, down = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
    for prefix, projs in experts.items():
        n = len(projs[gate])
        assert sorted(projs[gate]) == list(range(n))
        out[f"{prefix}.mlp.experts.gate_up_proj"] = torch.stack(
            [torch.cat([projs[gate][e], projs[up][e]], dim=0) for e in range(n)]).contiguous()
        out[f"{prefix}.mlp.experts.down_proj"] = torch.stack([projs[down][e] for e in range(n)]).contiguous()
    return out


def hub_style(config_path: str) -> None:
    with open(config_path) as f:
        c = json.load(f)
    rp = c.pop("rope_parameters")
    assert rp.get("rope_type", "default") == "default", rp
    c["rope_theta"] = rp["rope_theta"]
    c["rope_scaling"] = None
    if c["model_type"] == "qwen3_moe":
        c["num_experts"] = c.pop("num_local_experts")
    if c["model_type"].startswith("deepseek"):
        c.pop("head_dim", None)
        c.pop("qk_head_dim", None)
    if c["model_type"] == "deepseek_v3":  # as DeepSeek-V3's own config.json (transformers ignores these)
        c.update(scoring_func="sigmoid", topk_method="noaux_tc", num_nextn_predict_layers=0)
        c.pop("num_mtp_layers", None)
    with open(config_path, "w") as f:
        json.dump(c, f, indent=2, sort_keys=True)
        f.write("\n")


def reload_logits(path: str, tokens: np.ndarray) -> np.ndarray:
    m = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager")
    assert m.config._experts_implementation == "eager"
    m.eval()
    t = torch.from_numpy(tokens.astype(np.int64))
    with torch.no_grad():
        return m(input_ids=t, attention_mask=torch.ones_like(t), use_cache=False).logits.float().numpy()


def describe(path: str) -> list:
    with safe_open(os.path.join(path, "model.safetensors"), "np") as f:
        return [(k, list(f.get_slice(k).get_shape())) for k in sorted(f.keys())]


def write_fixture(fx: dict) -> dict:
    for seed in range(fx["seed"], fx["seed"] + 200):
        model = build(fx, seed)
        tokens = np.random.default_rng(seed).integers(0, VOCAB, size=(BATCH, SEQ)).astype(np.int32)
        logits, gen, rgap, lgap = reference(model, tokens)
        distinct = min(len(set(row[SEQ:].tolist())) for row in gen)
        if rgap >= ROUTER_GAP and lgap >= LOGIT_GAP and distinct >= MIN_DISTINCT:
            break
        print(f"  {fx['name']}: seed {seed} rejected (router gap {rgap:.2e}, logit gap {lgap:.2e}, "
              f"distinct {distinct})")
    else:
        raise RuntimeError(f"no well-conditioned seed for {fx['name']}")
    model = build(fx, seed)  # fresh, without hooks
    path = os.path.join(OUT, fx["name"])
    model.save_pretrained(path, safe_serialization=True)
    os.remove(os.path.join(path, "generation_config.json"))
    with open(os.path.join(path, "config.json")) as f:
        config_as_written = f.read()
    if fx["hub_config"]:
        hub_style(os.path.join(path, "config.json"))
    np.savez(os.path.join(path, "reference.npz"), tokens=tokens, logits=logits.astype(np.float32), generated=gen)
    got = reload_logits(path, tokens)
    assert np.array_equal(got, logits), f"{fx['name']}: reloaded checkpoint differs"
    info = dict(name=fx["name"], model_type=model.config.model_type, seed=seed, expert_layout="per-expert",
                min_router_gap=rgap, min_greedy_logit_gap=lgap, hub_style_config=fx["hub_config"])
    entries = [info]
    if fx["fused_copy"]:
        fpath = path + "_fused"
        from safetensors.torch import load_file, save_file

        fused = fused_state(load_file(os.path.join(path, "model.safetensors")), model.config)
        with tempfile.TemporaryDirectory() as tmp:  # transformers' own fused save must agree
            model.save_pretrained(tmp, safe_serialization=True, save_original_format=False)
            theirs = load_file(os.path.join(tmp, "model.safetensors"))
        assert sorted(theirs) == sorted(fused), sorted(set(theirs) ^ set(fused))
        for k in fused:
            assert torch.equal(theirs[k], fused[k]), k
        os.makedirs(fpath)
        save_file(fused, os.path.join(fpath, "model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(fpath, "config.json"), "w") as f:
            f.write(config_as_written)  # transformers' own spelling, even where the base is hub-style
        shutil.copy(os.path.join(path, "reference.npz"), fpath)
        got = reload_logits(fpath, tokens)
        assert np.allclose(got, logits, rtol=0, atol=1e-5), f"{fx['name']}_fused: reloaded checkpoint differs"
        entries.append(dict(info, name=fx["name"] + "_fused", expert_layout="fused", hub_style_config=False))
    return entries


def main() -> None:
    global torch, transformers
    import torch
    import transformers

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    manifest = dict(
        versions=dict(torch=torch.__version__, transformers=transformers.__version__,
                      numpy=np.__version__, python=sys.version.split()[0]),
        batch=BATCH, seq=SEQ, max_new_tokens=NEW, vocab=VOCAB, fixtures=[],
    )
    for fx in FIXTURES:
        entries = write_fixture(fx)
        manifest["fixtures"] += entries
        for e in entries:
            p = os.path.join(OUT, e["name"])
            size = sum(os.path.getsize(os.path.join(p, f)) for f in os.listdir(p))
            e["bytes"] = size
            e["numpy_reference_rel_err"] = check_numpy_reference(p)
            print(f"== {e['name']}  seed {e['seed']}  {size / 1024:.0f} KiB  router gap {e['min_router_gap']:.2e}"
                  f"  logit gap {e['min_greedy_logit_gap']:.2e}  numpy ref err {e['numpy_reference_rel_err']:.1e}")
            for k, shape in describe(p):
                print(f"     {k} {shape}")
    with open(os.path.join(OUT, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")


# ---------------------------------------------------------------------------------------------
# A plain numpy float32 implementation of the five models, written from the notes above and
# independent of torch; main() checks every fixture against it (forward to 1e-5, greedy
# generation recomputed without a cache to the exact tokens), so the notes are checked too.
# It needs only numpy and safetensors.


def np_load(path: str):
    """(weights with experts fused as [E, 2I, H] / [E, H, I] under L.mlp.experts.*, config dict)."""
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    with safe_open(os.path.join(path, "model.safetensors"), "np") as f:
        raw = {k: f.get_tensor(k) for k in f.keys()}
    w, experts = {}, {}
    for key, value in raw.items():
        key = key.replace(".block_sparse_moe.", ".mlp.")
        parts = key.split(".mlp.experts.")
        if len(parts) == 2 and parts[1][0].isdigit():
            e, proj, _ = parts[1].split(".")
            proj = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}.get(proj, proj)
            experts.setdefault(parts[0], {}).setdefault(proj, {})[int(e)] = value
        else:
            w[key] = value
    for prefix, projs in experts.items():
        n = len(projs["gate_proj"])
        w[f"{prefix}.mlp.experts.gate_up_proj"] = np.stack(
            [np.concatenate([projs["gate_proj"][e], projs["up_proj"][e]]) for e in range(n)])
        w[f"{prefix}.mlp.experts.down_proj"] = np.stack([projs["down_proj"][e] for e in range(n)])
    return w, cfg


def _rms(x, weight, eps):
    return weight * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(eps)))


def _silu(x):
    return x / (1 + np.exp(-x))


def _softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _inv_freq(cfg, dim):
    theta = (cfg.get("rope_parameters") or {}).get("rope_theta", cfg.get("rope_theta"))
    return (1.0 / np.float32(theta) ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim))).astype(np.float32)


def _rope_half(x, pos, inv):  # x [B, S, h, d]
    f = pos[:, None].astype(np.float32) * inv[None]
    f = np.concatenate([f, f], -1)
    cos, sin = np.cos(f)[None, :, None], np.sin(f)[None, :, None]
    d = x.shape[-1] // 2
    return x * cos + np.concatenate([-x[..., d:], x[..., :d]], -1) * sin


def _rope_interleaved(x, pos, inv):  # DeepSeek: pairs (x[2i], x[2i+1]) as complex numbers
    f = pos[:, None].astype(np.float32) * inv[None]
    cos, sin = np.cos(f)[None, :, None], np.sin(f)[None, :, None]
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = a * cos - b * sin, a * sin + b * cos
    return out


def _attend(q, k, v, scaling):  # q [B, S, h, d], k/v [B, S, h, *]
    s = np.einsum("bqhd,bkhd->bhqk", q, k) * np.float32(scaling)
    n = q.shape[1]
    s = np.where(np.tril(np.ones((n, n), bool))[None, None], s, -np.inf)
    return np.einsum("bhqk,bkhd->bqhd", _softmax(s), v)


def _attention(w, p, cfg, x, pos):
    B, S, _ = x.shape
    nh, eps = cfg["num_attention_heads"], cfg["rms_norm_eps"]
    lin = lambda name, y: y @ w[p + name + ".weight"].T + w.get(p + name + ".bias", 0)
    if cfg["model_type"].startswith("deepseek"):
        nope, rope, vd = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
        if cfg.get("q_lora_rank") is None:
            q = lin("q_proj", x)
        else:
            q = lin("q_b_proj", _rms(lin("q_a_proj", x), w[p + "q_a_layernorm.weight"], 1e-6))
        q = q.reshape(B, S, nh, nope + rope)
        ckv = lin("kv_a_proj_with_mqa", x)
        kv, k_pe = ckv[..., : cfg["kv_lora_rank"]], ckv[..., cfg["kv_lora_rank"]:]
        kv = lin("kv_b_proj", _rms(kv, w[p + "kv_a_layernorm.weight"], 1e-6)).reshape(B, S, nh, nope + vd)
        inv = _inv_freq(cfg, rope)
        rot = _rope_interleaved if cfg.get("rope_interleave", True) else _rope_half
        q_pe = rot(q[..., nope:], pos, inv)
        k_pe = np.broadcast_to(rot(k_pe[:, :, None], pos, inv), (B, S, nh, rope))
        qs = np.concatenate([q[..., :nope], q_pe], -1)
        ks = np.concatenate([kv[..., :nope], k_pe], -1)
        o = _attend(qs, ks, kv[..., nope:], (nope + rope) ** -0.5)
    else:
        nkv = cfg["num_key_value_heads"]
        hd = cfg.get("head_dim") or cfg["hidden_size"] // nh
        q, k, v = (lin(n, x).reshape(B, S, -1, hd) for n in ("q_proj", "k_proj", "v_proj"))
        if cfg["model_type"] == "qwen3_moe":
            q, k = _rms(q, w[p + "q_norm.weight"], eps), _rms(k, w[p + "k_norm.weight"], eps)
        inv = _inv_freq(cfg, hd)
        q, k = _rope_half(q, pos, inv), _rope_half(k, pos, inv)
        k, v = np.repeat(k, nh // nkv, axis=2), np.repeat(v, nh // nkv, axis=2)
        o = _attend(q, k, v, hd ** -0.5)
    return lin("o_proj", o.reshape(B, S, -1))


def _swiglu(w, p, x):
    return (_silu(x @ w[p + "gate_proj.weight"].T) * (x @ w[p + "up_proj.weight"].T)) @ w[p + "down_proj.weight"].T


def _is_moe(cfg, i):
    t = cfg["model_type"]
    if t == "mixtral":
        return True
    if t.startswith("deepseek"):
        return i >= cfg.get("first_k_dense_replace", 0)
    n = cfg.get("num_experts", cfg.get("num_local_experts"))
    return i not in (cfg.get("mlp_only_layers") or []) and n > 0 and (i + 1) % cfg.get("decoder_sparse_step", 1) == 0


def _moe(w, p, cfg, x):
    t, k = cfg["model_type"], cfg["num_experts_per_tok"]
    h = x.reshape(-1, x.shape[-1])
    if t == "deepseek_v3":
        return _moe_v3(w, p, cfg, h).reshape(x.shape)
    probs = _softmax(h @ w[p + "mlp.gate.weight"].T)
    scores = probs
    if t == "deepseek_v2" and cfg.get("topk_method") == "group_limited_greedy":
        g = probs.reshape(len(h), cfg["n_group"], -1)
        top_groups = np.argsort(-g.max(-1), axis=-1, kind="stable")[:, : cfg["topk_group"]]
        keep = np.zeros(g.shape[:2], bool)
        np.put_along_axis(keep, top_groups, True, axis=1)
        scores = np.where(np.repeat(keep, g.shape[2], axis=1), probs, 0)
    idx = np.argsort(-scores, axis=-1, kind="stable")[:, :k]
    wt = np.take_along_axis(scores, idx, axis=-1)
    if t == "mixtral" or (t != "deepseek_v2" and cfg.get("norm_topk_prob")):
        wt = wt / wt.sum(-1, keepdims=True)
    if t == "deepseek_v2":
        wt = wt * np.float32(cfg.get("routed_scaling_factor", 1.0))
    out = _routed(w, p, h, idx, wt)
    if t == "qwen2_moe":
        gate = 1 / (1 + np.exp(-(h @ w[p + "mlp.shared_expert_gate.weight"].T)))
        out += gate * _swiglu(w, p + "mlp.shared_expert.", h)
    if t == "deepseek_v2":
        out += _swiglu(w, p + "mlp.shared_experts.", h)
    return out.reshape(x.shape)


def _routed(w, p, h, idx, wt):
    """sum_j wt[:, j] * expert_{idx[:, j]}(h)."""
    gu, dn = w[p + "mlp.experts.gate_up_proj"], w[p + "mlp.experts.down_proj"]
    inter = dn.shape[-1]
    out = np.zeros_like(h)
    for r in range(len(h)):
        for j in range(idx.shape[1]):
            a = gu[idx[r, j]] @ h[r]
            out[r] += wt[r, j] * (dn[idx[r, j]] @ (_silu(a[:inter]) * a[inter:]))
    return out


def _moe_v3(w, p, cfg, h):
    scores = 1 / (1 + np.exp(-(h @ w[p + "mlp.gate.weight"].T)))
    choice = scores + w[p + "mlp.gate.e_score_correction_bias"]
    g = choice.reshape(len(h), cfg["n_group"], -1)
    group_score = np.sort(g, axis=-1)[..., -2:].sum(-1)
    top_groups = np.argsort(-group_score, axis=-1, kind="stable")[:, : cfg["topk_group"]]
    keep = np.zeros(g.shape[:2], bool)
    np.put_along_axis(keep, top_groups, True, axis=1)
    choice = np.where(np.repeat(keep, g.shape[2], axis=1), choice, -np.inf)
    idx = np.argsort(-choice, axis=-1, kind="stable")[:, : cfg["num_experts_per_tok"]]
    wt = np.take_along_axis(scores, idx, axis=-1)
    if cfg["norm_topk_prob"]:
        wt = wt / (wt.sum(-1, keepdims=True) + 1e-20)
    wt = wt * np.float32(cfg["routed_scaling_factor"])
    return _routed(w, p, h, idx, wt) + _swiglu(w, p + "mlp.shared_experts.", h)


def np_forward(w, cfg, tokens):
    """float32 logits [B, S, V] for int tokens [B, S], no cache."""
    x = w["model.embed_tokens.weight"][tokens]
    pos = np.arange(tokens.shape[1])
    eps = cfg["rms_norm_eps"]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = x + _attention(w, p + "self_attn.", cfg, _rms(x, w[p + "input_layernorm.weight"], eps), pos)
        h = _rms(x, w[p + "post_attention_layernorm.weight"], eps)
        x = x + (_moe(w, p, cfg, h) if _is_moe(cfg, i) else _swiglu(w, p + "mlp.", h))
    return (_rms(x, w["model.norm.weight"], eps) @ w["lm_head.weight"].T).astype(np.float32)


def np_generate(w, cfg, tokens, new):
    """Greedy, recomputing the whole sequence each step (no cache)."""
    seq = np.asarray(tokens)
    for _ in range(new):
        nxt = np_forward(w, cfg, seq)[:, -1].argmax(-1)
        seq = np.concatenate([seq, nxt[:, None].astype(seq.dtype)], axis=1)
    return seq


def check_numpy_reference(path: str) -> float:
    w, cfg = np_load(path)
    with np.load(os.path.join(path, "reference.npz")) as ref:
        tokens, logits, generated = ref["tokens"], ref["logits"], ref["generated"]
    out = np_forward(w, cfg, tokens)
    err = float(np.linalg.norm(out - logits) / np.linalg.norm(logits))
    assert err < 1e-5, f"{path}: numpy reference relative error {err:.2e}"
    gen = np_generate(w, cfg, tokens, generated.shape[1] - tokens.shape[1])
    assert np.array_equal(gen, generated), f"{path}: numpy greedy generation differs\n{gen}\n{generated}"
    return err


if __name__ == "__main__":
    main()
