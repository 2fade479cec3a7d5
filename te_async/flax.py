"""te_async.flax.GroupedLayerNormMLP: grouped_mlp as a Flax NNX module (flax is optional).

Parameters carry logical sharding names, so expert parallelism is a matter of mapping
"expert" to a mesh axis: wi [expert, embed, mlp], wo [expert, mlp, embed], norm_scale and
norm_bias [embed]. The names are annotations only (eager sharding off), so the module builds
without a mesh; apply them with nnx.get_partition_spec and your logical-axis rules. Parameters
are kept in `param_dtype` and cast to `dtype` (default: the input's) for the call.
"""

from typing import Optional

import jax
import jax.numpy as jnp
from flax import nnx

from .group_sizes import HostGroupSizes
from .mlp import GATED_ACTIVATIONS, NORMS, grouped_mlp

EXPERT_KERNEL_INIT = nnx.initializers.variance_scaling(1.0, "fan_in", "truncated_normal", in_axis=-2, out_axis=-1, batch_axis=(0,))


class GroupedLayerNormMLP(nnx.Module):
    def __init__(
        self,
        num_experts: int,
        hidden: int,
        ffn: int,
        *,
        activation: str = "swiglu",
        norm: Optional[str] = "rmsnorm",
        eps: float = 1e-6,
        dtype=None,
        param_dtype=jnp.float32,
        kernel_init=EXPERT_KERNEL_INIT,
        group_sizes_mode: Optional[str] = None,
        rngs: nnx.Rngs,
    ):
        if norm not in NORMS:
            raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")
        f1 = 2 * ffn if activation in GATED_ACTIVATIONS else ffn
        self.activation, self.norm, self.eps, self.dtype = activation, norm, eps, dtype
        self.group_sizes_mode = group_sizes_mode
        def param(init, names, shape):
            return nnx.Param(nnx.with_partitioning(init, names, eager_sharding=False)(rngs.params(), shape, param_dtype))

        self.wi = param(kernel_init, ("expert", "embed", "mlp"), (num_experts, hidden, f1))
        self.wo = param(kernel_init, ("expert", "mlp", "embed"), (num_experts, ffn, hidden))
        self.norm_scale = param(nnx.initializers.ones, ("embed",), (hidden,)) if norm is not None else None
        self.norm_bias = param(nnx.initializers.zeros, ("embed",), (hidden,)) if norm == "layernorm" else None

    def __call__(self, x: jax.Array, group_sizes: jax.Array, host_group_sizes: Optional[HostGroupSizes] = None) -> jax.Array:
        dtype = self.dtype or x.dtype
        value = lambda p: None if p is None else p[...]
        return grouped_mlp(
            x.astype(dtype),
            group_sizes,
            value(self.wi).astype(dtype),
            value(self.wo).astype(dtype),
            norm_scale=value(self.norm_scale),
            norm_bias=value(self.norm_bias),
            norm=self.norm,
            eps=self.eps,
            activation=self.activation,
            group_sizes_mode=self.group_sizes_mode,
            host_group_sizes=host_group_sizes,
        )
