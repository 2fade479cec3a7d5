"""The MoE models the benchmarks, tools and examples are sized after, in one place.

The real models' numbers live in te_async.models.presets (each model's published config.json):
config(name) returns that te_async.models.Config, and PRESETS[name] is the expert-layer shape
derived from it that the GEMM and layer benchmarks use: routed experts, hidden size, expert FFN
size, experts per token and MoE layers. "tiny" is for trying things on a CPU: a DeepSeek-V2-Lite
config shrunk to 8 experts of hidden 64, expert FFN 96, top-2 and 3 decoder layers (one dense, two
MoE), small enough that every benchmark runs on a CPU in under a minute.
"""

import argparse
from typing import NamedTuple

import jax

from .. import models

# The tiny model: overrides of DeepSeek-V2-Lite's config (MLA attention, shared experts, a dense
# first layer, like the real one), sized for a CPU.
TINY_OVERRIDES = dict(
    vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
    num_key_value_heads=4, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
    num_experts=8, num_experts_per_tok=2, moe_intermediate_size=96, n_shared_experts=1,
)
TINY_BASE = "deepseek-v2-lite"
GPU_DEFAULT, CPU_DEFAULT = "deepseek-v2-lite", "tiny"


def config(name: str, **overrides) -> models.Config:
    """The te_async.models.Config of a preset; overrides replace Config fields (e.g. num_hidden_layers=4)."""
    if name == "tiny":
        return models.preset(TINY_BASE, **{**TINY_OVERRIDES, **overrides})
    return models.preset(name, **overrides)


class Model(NamedTuple):
    experts: int
    hidden: int
    ffn: int
    top_k: int
    layers: int

    @classmethod
    def of(cls, config: models.Config) -> "Model":
        """A model config's expert-layer shape; layers counts its MoE layers only."""
        moe_layers = sum(map(config.is_moe_layer, range(config.num_hidden_layers)))
        return cls(config.num_experts, config.hidden_size, config.moe_intermediate_size, config.num_experts_per_tok,
                   moe_layers)

    def expert_bytes(self, dtype) -> int:
        """One expert's fc1 (swiglu: [hidden, 2 * ffn]) and fc2 ([ffn, hidden]) weights."""
        return 3 * self.hidden * self.ffn * jax.numpy.dtype(dtype).itemsize


NAMES = (*models.PUBLISHED, "tiny")
PRESETS = {name: Model.of(config(name)) for name in NAMES}


def positive_int(text: str) -> int:
    """An argparse type for counts: a whole number above 0, else argparse's error naming the option."""
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def positive_float(text: str) -> float:
    """An argparse type for sizes: a finite number above 0, else argparse's error naming the option."""
    value = float(text)
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def add_argument(parser) -> None:
    """--preset, the same in every benchmark and tool; resolve() reads it."""
    parser.add_argument("--preset", choices=list(PRESETS),
                        help=f"model shapes (default: {GPU_DEFAULT} on a GPU; elsewhere {CPU_DEFAULT}, small enough for a CPU)")


def default_name(name=None) -> str:
    """The preset asked for, or the backend's default."""
    return name or (GPU_DEFAULT if jax.default_backend() == "gpu" else CPU_DEFAULT)


def resolve(name=None) -> tuple:
    """(name, Model): the one asked for, or the backend's default."""
    name = default_name(name)
    return name, PRESETS[name]


def prefill_tokens(name: str) -> int:
    """Tokens of a prefill (training) sequence: 4096, the TransformerEngine stall report's, or 256 for tiny."""
    return 256 if name == "tiny" else 4096
