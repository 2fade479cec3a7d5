"""te_async: grouped GEMMs and a GroupedLayerNormMLP for JAX MoE layers, without the
group-sizes host-sync bubble.

Path of a call: mlp.py (grouped_mlp) -> gemm.py (grouped_gemm) -> csrc/.
"""

from ._ffi import MAX_GROUPS, cuda_extension_built, host_size_stats, size_errors
from .gemm import grouped_gemm
from .group_sizes import GROUP_SIZES_MODES, HostGroupSizes, copy_group_sizes, keep_group_sizes, reuse_group_sizes
from .expert_parallel import moe_block_ep
from .mlp import grouped_mlp
from .ragged import ragged_dot
from .scan_vjp import scan
from . import dense, models, plan

__all__ = [
    "GROUP_SIZES_MODES",
    "HostGroupSizes",
    "MAX_GROUPS",
    "copy_group_sizes",
    "cuda_extension_built",
    "dense",
    "grouped_gemm",
    "grouped_mlp",
    "host_size_stats",
    "keep_group_sizes",
    "models",
    "moe_block_ep",
    "plan",
    "ragged_dot",
    "reuse_group_sizes",
    "scan",
    "size_errors",
]
