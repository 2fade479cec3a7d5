"""The MoE models the benchmarks, tools and example are sized after, in one place.

Shapes are each model's expert layers (from its published config): routed experts, hidden size,
expert FFN size, experts per token and MoE layers. "tiny" is for trying things on a CPU.
"""

from typing import NamedTuple

import jax


class Model(NamedTuple):
    experts: int
    hidden: int
    ffn: int
    top_k: int
    layers: int

    def expert_bytes(self, dtype) -> int:
        """One expert's fc1 (swiglu: [hidden, 2 * ffn]) and fc2 ([ffn, hidden]) weights."""
        return 3 * self.hidden * self.ffn * jax.numpy.dtype(dtype).itemsize


PRESETS = {
    "deepseek-v2-lite": Model(64, 2048, 1408, 6, 26),
    "mixtral-8x7b": Model(8, 4096, 14336, 2, 32),
    "qwen3-30b-a3b": Model(128, 2048, 768, 8, 48),
    "tiny": Model(8, 64, 96, 2, 2),
}
GPU_DEFAULT, CPU_DEFAULT = "deepseek-v2-lite", "tiny"


def add_argument(parser) -> None:
    """--preset, the same in every benchmark and tool; resolve() reads it."""
    parser.add_argument("--preset", choices=list(PRESETS),
                        help=f"model shapes (default: {GPU_DEFAULT} on a GPU; elsewhere {CPU_DEFAULT}, small enough for a CPU)")


def resolve(name=None) -> tuple:
    """(name, Model): the one asked for, or the backend's default."""
    name = name or (GPU_DEFAULT if jax.default_backend() == "gpu" else CPU_DEFAULT)
    return name, PRESETS[name]


def prefill_tokens(name: str) -> int:
    """Tokens of a prefill (training) sequence: 4096, the TransformerEngine stall report's, or 256 for tiny."""
    return 256 if name == "tiny" else 4096
