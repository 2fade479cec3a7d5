"""The model configuration: one frozen, hashable dataclass (a static jit argument) built from a
Hugging Face config.json, with the defaults of the transformers 5.24 config classes for the keys a
config.json leaves out, so that a file HF wrote or a hub original reads the same way HF reads it.
"""

import dataclasses
import json
import math
import pathlib
from typing import Optional

MODEL_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3")
DEEPSEEK_TYPES = ("deepseek_v2", "deepseek_v3")
# greedy: top-k of the scores; group_limited_greedy: DeepSeek-V2's groups ranked by their best
# softmax score; noaux_tc: DeepSeek-V3's sigmoid scores, chosen with a correction bias, groups
# ranked by their two best (te_async.routing says more).
TOPK_METHODS = ("greedy", "group_limited_greedy", "noaux_tc")


@dataclasses.dataclass(frozen=True)
class YarnScaling:
    """rope_scaling "yarn" (DeepSeek-V2's long-context rope), as transformers' _compute_yarn_parameters
    reads it."""

    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: Optional[float] = None
    mscale_all_dim: Optional[float] = None
    attention_factor: Optional[float] = None
    truncate: bool = True


@dataclasses.dataclass(frozen=True)
class Config:
    """Everything the forward needs. Field names are Hugging Face's where it has one."""

    model_type: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int  # q/k/v head size of grouped-query attention (unused by MLA)
    intermediate_size: int  # dense FFN layers
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: Optional[YarnScaling] = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    sliding_window: Optional[int] = None
    layer_types: Optional[tuple] = None  # "sliding_attention"/"full_attention" per layer; None: all alike
    qkv_bias: bool = False  # q/k/v projections (MLA: q_a_proj and kv_a_proj_with_mqa)
    o_bias: bool = False
    qk_norm: bool = False  # per-head RMSNorm of q and k before the rope (qwen3_moe)
    # DeepSeek-V2/V3 multi-head latent attention
    q_lora_rank: Optional[int] = None
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    rope_interleave: bool = True  # the rope dims are DeepSeek's interleaved pairs (V3 may say false)
    # routing
    norm_topk_prob: bool = False
    routed_scaling_factor: float = 1.0
    topk_method: str = "greedy"
    n_group: int = 1
    topk_group: int = 1
    scoring_func: str = "softmax"  # "sigmoid" with topk_method noaux_tc (DeepSeek-V3)
    # shared experts: DeepSeek's n_shared_experts * moe_intermediate_size, or Qwen2-MoE's gated one
    n_shared_experts: int = 0
    shared_expert_intermediate_size: int = 0
    # which layers are MoE
    first_k_dense_replace: int = 0
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple = ()
    num_nextn_predict_layers: int = 0  # DeepSeek-V3's multi-token-prediction layers after the last: not loaded
    initializer_range: float = 0.02

    def __post_init__(self):
        _validate(self)

    @property
    def is_mla(self) -> bool:
        return self.model_type in DEEPSEEK_TYPES

    @property
    def shared_intermediate_size(self) -> int:
        """FFN width of the shared experts (0: none)."""
        if self.model_type in DEEPSEEK_TYPES:
            return self.n_shared_experts * self.moe_intermediate_size
        return self.shared_expert_intermediate_size

    @property
    def shared_expert_gate(self) -> bool:
        """Qwen2-MoE scales its shared expert by sigmoid(x @ shared_expert_gate)."""
        return self.model_type == "qwen2_moe" and self.shared_intermediate_size > 0

    @property
    def rope_dim(self) -> int:
        return self.qk_rope_head_dim if self.is_mla else self.head_dim

    def is_moe_layer(self, layer: int) -> bool:
        """The rule of each model's decoder layer in transformers."""
        if self.model_type in DEEPSEEK_TYPES:
            return layer >= self.first_k_dense_replace
        if self.model_type == "mixtral":
            return True
        sparse = (layer + 1) % self.decoder_sparse_step == 0
        return layer not in self.mlp_only_layers and self.num_experts > 0 and sparse

    def window(self, layer: int) -> Optional[int]:
        """The sliding window of a layer's attention, or None for full causal attention."""
        if self.layer_types is not None and self.layer_types[layer] != "sliding_attention":
            return None
        return self.sliding_window


def _validate(c: Config) -> None:
    if c.model_type not in MODEL_TYPES:
        raise ValueError(f"unsupported model_type {c.model_type!r}; supported: {', '.join(MODEL_TYPES)}")
    positive = ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_experts",
                "num_experts_per_tok", "moe_intermediate_size"]
    positive += ["kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"] if c.is_mla else [
        "num_key_value_heads", "head_dim"]
    for name in positive:
        value = getattr(c, name)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"config {name} must be a positive integer, got {value!r}")
    if not c.is_mla and c.num_attention_heads % c.num_key_value_heads:
        raise ValueError(f"num_attention_heads {c.num_attention_heads} is not a multiple of "
                         f"num_key_value_heads {c.num_key_value_heads}")
    if c.rope_dim % 2:
        raise ValueError(f"the rotary dimension must be even, got {c.rope_dim}")
    if c.q_lora_rank is not None and c.q_lora_rank <= 0:
        raise ValueError(f"q_lora_rank must be None or positive, got {c.q_lora_rank}")
    if c.num_experts_per_tok > c.num_experts:
        raise ValueError(f"num_experts_per_tok {c.num_experts_per_tok} > num_experts {c.num_experts}")
    if c.topk_method not in TOPK_METHODS:
        raise ValueError(f"topk_method must be one of {TOPK_METHODS}, got {c.topk_method!r}")
    if (c.scoring_func == "sigmoid") != (c.topk_method == "noaux_tc"):
        raise ValueError(f"scoring_func 'sigmoid' goes with topk_method 'noaux_tc' and only with it; got "
                         f"{c.scoring_func!r} and {c.topk_method!r}")
    if c.topk_method != "greedy":
        if c.num_experts % c.n_group or not 0 < c.topk_group <= c.n_group:
            raise ValueError(f"{c.topk_method} needs n_group ({c.n_group}) to divide num_experts "
                             f"({c.num_experts}) and 0 < topk_group ({c.topk_group}) <= n_group")
        if c.num_experts_per_tok > c.topk_group * (c.num_experts // c.n_group):
            raise ValueError(f"num_experts_per_tok {c.num_experts_per_tok} exceeds the experts of "
                             f"{c.topk_group} groups")
        if c.topk_method == "noaux_tc" and c.n_group > 1 and c.num_experts // c.n_group < 2:
            raise ValueError(f"noaux_tc ranks groups by their two best experts: n_group {c.n_group} leaves one "
                             f"expert per group")
    if c.intermediate_size <= 0 and not all(map(c.is_moe_layer, range(c.num_hidden_layers))):
        raise ValueError("intermediate_size must be positive: the config has dense layers")
    if c.layer_types is not None and len(c.layer_types) != c.num_hidden_layers:
        raise ValueError(f"layer_types has {len(c.layer_types)} entries for {c.num_hidden_layers} layers")
    if c.sliding_window is not None and c.sliding_window <= 0:
        raise ValueError(f"sliding_window must be None or positive, got {c.sliding_window}")


# transformers 5.24's config-class defaults for the keys each model reads (a key a config.json
# omits means this value to transformers too).
_DEFAULTS = {
    "mixtral": dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                    num_attention_heads=32, num_key_value_heads=8, rms_norm_eps=1e-5, rope_theta=1e6,
                    max_position_embeddings=4096 * 32, num_local_experts=8, num_experts_per_tok=2,
                    sliding_window=None),
    "qwen2_moe": dict(vocab_size=151936, hidden_size=2048, intermediate_size=5632, num_hidden_layers=24,
                      num_attention_heads=16, num_key_value_heads=16, rms_norm_eps=1e-6, rope_theta=10000.0,
                      max_position_embeddings=32768, use_sliding_window=False, sliding_window=4096,
                      max_window_layers=28, decoder_sparse_step=1, moe_intermediate_size=1408,
                      shared_expert_intermediate_size=5632, num_experts_per_tok=4, num_experts=60,
                      norm_topk_prob=False, mlp_only_layers=None, qkv_bias=True, layer_types=None),
    "qwen3_moe": dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=24,
                      num_attention_heads=32, num_key_value_heads=4, rms_norm_eps=1e-6, rope_theta=10000.0,
                      max_position_embeddings=32768, attention_bias=False, use_sliding_window=False,
                      sliding_window=4096, decoder_sparse_step=1, moe_intermediate_size=768,
                      num_experts_per_tok=8, num_experts=128, norm_topk_prob=False, mlp_only_layers=None),
    "deepseek_v2": dict(vocab_size=102400, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                        num_attention_heads=32, num_key_value_heads=None, rms_norm_eps=1e-6, rope_theta=10000.0,
                        max_position_embeddings=2048, attention_bias=False, mlp_bias=False,
                        first_k_dense_replace=0, kv_lora_rank=512, q_lora_rank=1536, n_group=None,
                        n_routed_experts=64, n_shared_experts=2, qk_nope_head_dim=128, qk_rope_head_dim=64,
                        routed_scaling_factor=1.0, topk_group=None, topk_method="greedy", norm_topk_prob=False,
                        v_head_dim=128, num_experts_per_tok=None, moe_intermediate_size=1407,
                        scoring_func="softmax"),
    "deepseek_v3": dict(vocab_size=129280, hidden_size=7168, intermediate_size=18432, num_hidden_layers=61,
                        num_attention_heads=128, num_key_value_heads=128, rms_norm_eps=1e-6, rope_theta=10000.0,
                        max_position_embeddings=4096, attention_bias=False, first_k_dense_replace=3,
                        kv_lora_rank=512, q_lora_rank=1536, n_group=8, n_routed_experts=256, n_shared_experts=1,
                        qk_nope_head_dim=128, qk_rope_head_dim=64, routed_scaling_factor=2.5, topk_group=4,
                        norm_topk_prob=True, v_head_dim=128, num_experts_per_tok=8, moe_intermediate_size=2048,
                        rope_interleave=True, num_nextn_predict_layers=1),
}

# transformers' attribute_map: config.json may store a key under the other name (transformers
# 5.24 writes Qwen3-MoE's num_experts as num_local_experts; the hub's files say num_experts).
_ALIASES = {"qwen3_moe": {"num_experts": "num_local_experts"},
            "mixtral": {"num_local_experts": "num_experts"}, "deepseek_v2": {"n_routed_experts": "num_experts"},
            "deepseek_v3": {"n_routed_experts": "num_local_experts", "num_nextn_predict_layers": "num_mtp_layers"}}


def from_hf_dict(d: dict, source: str = "config") -> Config:
    """A Config from the dict of a Hugging Face config.json; `source` names it in errors."""
    if not isinstance(d, dict):
        raise ValueError(f"{source}: expected a JSON object, got {type(d).__name__}")
    model_type = d.get("model_type")
    if model_type not in MODEL_TYPES:
        raise ValueError(f"{source}: unsupported model_type {model_type!r}; supported: {', '.join(MODEL_TYPES)}")
    quantization = d.get("quantization_config")
    if quantization:
        method = quantization.get("quant_method", "?") if isinstance(quantization, dict) else "?"
        raise ValueError(f"{source}: quantized checkpoints are not supported (quantization_config {method!r}); "
                         f"convert the weights to bfloat16 first")
    h = {**_DEFAULTS[model_type], **d}
    for key, stored in _ALIASES.get(model_type, {}).items():
        if stored in d:
            h[key] = d[stored]
    try:
        return _from_hf(h, model_type, source)
    except KeyError as e:
        raise ValueError(f"{source}: missing key {e}") from None


def _from_hf(h: dict, model_type: str, source: str) -> Config:
    if h.get("hidden_act", "silu") != "silu":
        raise ValueError(f"{source}: hidden_act {h['hidden_act']!r} is not supported (only silu: SwiGLU experts)")
    heads = h["num_attention_heads"]
    kw = dict(
        model_type=model_type, vocab_size=h["vocab_size"], hidden_size=h["hidden_size"],
        num_hidden_layers=h["num_hidden_layers"], num_attention_heads=heads,
        num_key_value_heads=h.get("num_key_value_heads") or heads,
        head_dim=h.get("head_dim") or h["hidden_size"] // heads,
        intermediate_size=h["intermediate_size"], rms_norm_eps=float(h["rms_norm_eps"]),
        max_position_embeddings=h["max_position_embeddings"],
        tie_word_embeddings=bool(h.get("tie_word_embeddings", False)),
        initializer_range=float(h.get("initializer_range", 0.02)),
        num_experts_per_tok=h["num_experts_per_tok"],
    )
    kw["rope_theta"], kw["rope_scaling"] = _rope(h, source)
    if model_type == "mixtral":
        kw.update(num_experts=h["num_local_experts"], moe_intermediate_size=h["intermediate_size"],
                  norm_topk_prob=True, sliding_window=h.get("sliding_window"))
    elif model_type in ("qwen2_moe", "qwen3_moe"):
        kw.update(num_experts=h["num_experts"], moe_intermediate_size=h["moe_intermediate_size"],
                  norm_topk_prob=bool(h["norm_topk_prob"]), decoder_sparse_step=h["decoder_sparse_step"],
                  mlp_only_layers=tuple(h["mlp_only_layers"] or ()))
        if model_type == "qwen2_moe":
            kw.update(qkv_bias=bool(h["qkv_bias"]),
                      shared_expert_intermediate_size=h["shared_expert_intermediate_size"])
            kw.update(_qwen2_windows(h, kw["num_hidden_layers"]))
        else:
            kw.update(qkv_bias=bool(h["attention_bias"]), o_bias=bool(h["attention_bias"]), qk_norm=True,
                      sliding_window=h["sliding_window"] if h["use_sliding_window"] else None)
    else:
        kw.update(_deepseek(h, model_type, source))
    try:
        return Config(**kw)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{source}: {e}") from None


def _rope(h: dict, source: str):
    """(rope_theta, YarnScaling or None) from transformers 5's rope_parameters or 4's rope_scaling."""
    params = h.get("rope_parameters") or h.get("rope_scaling") or {}
    theta = float(params.get("rope_theta", h.get("rope_theta", _DEFAULTS[h["model_type"]]["rope_theta"])))
    kind = params.get("rope_type", params.get("type", "default"))
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError(f"{source}: partial_rotary_factor {params['partial_rotary_factor']} is not supported")
    if kind == "default":
        return theta, None
    if kind != "yarn":
        raise ValueError(f"{source}: rope type {kind!r} is not supported (only default and yarn)")
    original = params.get("original_max_position_embeddings", h["max_position_embeddings"])
    return theta, YarnScaling(
        factor=float(params.get("factor") or h["max_position_embeddings"] / original),
        original_max_position_embeddings=int(original),
        beta_fast=float(params.get("beta_fast") or 32), beta_slow=float(params.get("beta_slow") or 1),
        mscale=params.get("mscale"), mscale_all_dim=params.get("mscale_all_dim"),
        attention_factor=params.get("attention_factor"), truncate=bool(params.get("truncate", True)))


def _qwen2_windows(h: dict, layers: int) -> dict:
    """Qwen2-MoE's layer_types: given, or its default rule (odd layers below max_window_layers)."""
    types = h.get("layer_types")
    if types is None:
        types = ["sliding_attention" if (i + 1) % 2 and i < h["max_window_layers"] and h["use_sliding_window"]
                 else "full_attention" for i in range(layers)]
    if not h["use_sliding_window"] or "sliding_attention" not in types:
        return dict(sliding_window=None, layer_types=None)
    return dict(sliding_window=h["sliding_window"], layer_types=tuple(types))


def _deepseek(h: dict, model_type: str, source: str) -> dict:
    """DeepSeek-V2's and V3's keys. transformers' V3 router is always sigmoid + noaux_tc, whatever
    scoring_func and topk_method say: a file that names another is refused, not silently reread."""
    if h.get("mlp_bias"):
        raise ValueError(f"{source}: mlp_bias=true is not supported")
    if h.get("moe_layer_freq", 1) != 1:
        raise ValueError(f"{source}: moe_layer_freq {h['moe_layer_freq']} is not supported (transformers ignores it)")
    if model_type == "deepseek_v2":
        if h["scoring_func"] != "softmax":
            raise ValueError(f"{source}: scoring_func {h['scoring_func']!r} is not supported "
                             f"(DeepSeek-V2 uses softmax)")
        if h["norm_topk_prob"]:
            # transformers' DeepseekV2TopkRouter ignores it and DeepSeek's own code renormalises: refuse the
            # ambiguity (no published DeepSeek-V2 checkpoint sets it).
            raise ValueError(f"{source}: norm_topk_prob=true is not supported for deepseek_v2")
        routing = dict(topk_method=h["topk_method"] or "greedy", norm_topk_prob=False)
    else:
        if h.get("scoring_func", "sigmoid") != "sigmoid" or h.get("topk_method", "noaux_tc") != "noaux_tc":
            raise ValueError(f"{source}: deepseek_v3 routes by sigmoid scores and noaux_tc; the file says scoring_func "
                             f"{h.get('scoring_func')!r}, topk_method {h.get('topk_method')!r}")
        routing = dict(topk_method="noaux_tc", scoring_func="sigmoid", norm_topk_prob=bool(h["norm_topk_prob"]),
                       rope_interleave=bool(h["rope_interleave"]),
                       num_nextn_predict_layers=int(h["num_nextn_predict_layers"] or 0))
    return dict(
        **routing, num_experts=h["n_routed_experts"], moe_intermediate_size=h["moe_intermediate_size"],
        routed_scaling_factor=float(h["routed_scaling_factor"]),
        n_group=h["n_group"] or 1, topk_group=h["topk_group"] or 1, n_shared_experts=h["n_shared_experts"] or 0,
        first_k_dense_replace=h["first_k_dense_replace"], q_lora_rank=h["q_lora_rank"],
        kv_lora_rank=h["kv_lora_rank"], qk_nope_head_dim=h["qk_nope_head_dim"],
        qk_rope_head_dim=h["qk_rope_head_dim"], v_head_dim=h["v_head_dim"],
        qkv_bias=bool(h["attention_bias"]), o_bias=bool(h["attention_bias"]))


def read_config(path) -> Config:
    """The Config of a Hugging Face model directory's config.json."""
    file = pathlib.Path(path) / "config.json"
    if not file.is_file():
        raise ValueError(f"{file}: no config.json in the model directory")
    try:
        d = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{file}: not valid JSON ({e})") from None
    return from_hf_dict(d, str(file))


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction 0.1 * mscale * ln(scale) + 1 (1 where scale <= 1)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0
