"""Configs with the real shapes of published MoE models, for benchmarks without a checkpoint.

The dicts are the keys of each model's published config.json on the Hugging Face hub that the
forward reads (deepseek-ai/DeepSeek-V2-Lite, Qwen/Qwen3-30B-A3B, mistralai/Mixtral-8x7B-v0.1),
read through the same from_hf_dict a checkpoint's config.json goes through. deepseek-v3 is
transformers 5.24's DeepseekV3Config defaults, which its docstring gives as DeepSeek-V3's (671.0e9
parameters here, the published count without the multi-token-prediction layer), without the hub
file's yarn rope scaling (it changes cos and sin, not what a step costs) and fp8 quantisation
(te_async runs 16-bit weights). One H200 holds its embedding, dense layers and two or three of its
58 MoE layers (22.5 GB each in bf16): benchmark it with num_hidden_layers=4 or 5.
"""

import dataclasses

from .config import Config, from_hf_dict

PUBLISHED = {
    "deepseek-v2-lite": {
        "model_type": "deepseek_v2", "vocab_size": 102400, "hidden_size": 2048, "intermediate_size": 10944,
        "num_hidden_layers": 27, "num_attention_heads": 16, "num_key_value_heads": 16,
        "max_position_embeddings": 163840, "rms_norm_eps": 1e-6, "rope_theta": 10000,
        "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707,
                         "original_max_position_embeddings": 4096, "type": "yarn"},
        "attention_bias": False, "q_lora_rank": None, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64, "v_head_dim": 128, "first_k_dense_replace": 1, "moe_layer_freq": 1,
        "n_routed_experts": 64, "n_shared_experts": 2, "num_experts_per_tok": 6, "moe_intermediate_size": 1408,
        "n_group": 1, "topk_group": 1, "topk_method": "greedy", "norm_topk_prob": False,
        "routed_scaling_factor": 1.0, "scoring_func": "softmax", "hidden_act": "silu", "tie_word_embeddings": False,
    },
    "qwen3-30b-a3b": {
        "model_type": "qwen3_moe", "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144,
        "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
        "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_scaling": None,
        "attention_bias": False, "use_sliding_window": False, "sliding_window": None, "max_window_layers": 48,
        "decoder_sparse_step": 1, "mlp_only_layers": [], "num_experts": 128, "num_experts_per_tok": 8,
        "moe_intermediate_size": 768, "norm_topk_prob": True, "hidden_act": "silu", "tie_word_embeddings": False,
    },
    "deepseek-v3": {"model_type": "deepseek_v3"},
    "mixtral-8x7b": {
        "model_type": "mixtral", "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "max_position_embeddings": 32768, "rms_norm_eps": 1e-5, "rope_theta": 1000000.0, "sliding_window": None,
        "num_local_experts": 8, "num_experts_per_tok": 2, "hidden_act": "silu", "tie_word_embeddings": False,
    },
}


def preset(name: str, **overrides) -> Config:
    """The Config of a published model; overrides replace Config fields (e.g. num_hidden_layers=2)."""
    if name not in PUBLISHED:
        raise ValueError(f"unknown preset {name!r}; known: {', '.join(PUBLISHED)}")
    config = from_hf_dict(PUBLISHED[name], f"preset {name!r}")
    unknown = set(overrides) - {f.name for f in dataclasses.fields(Config)}
    if unknown:
        raise TypeError(f"preset overrides name no Config field: {', '.join(sorted(unknown))}")
    return dataclasses.replace(config, **overrides)
