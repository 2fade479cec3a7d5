"""te_async.models on the GPU: the async MoE block's order in the compiled program, and the
cached decode path against the full forward there."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import te_async.models as models
from reference import rel_error
from test_models import PROMPT, TOTAL, random_params, tiny

pytestmark = pytest.mark.gpu


def layer_schedule(hlo: str, layer: int) -> dict:
    """Positions in the scheduled entry computation of one layer's copy, shared-expert
    instructions, permutation gather and grouped GEMMs (by their metadata op_name)."""
    entry = hlo[hlo.index("\nENTRY"):].splitlines()[1:]
    where = {"copy": [], "shared": [], "gather": [], "gemm": []}
    for i, line in enumerate(entry):
        name = re.search(r'op_name="([^"]*)"', line)
        if not name or f"/layer{layer}/" not in name.group(1) + "/":
            continue
        if "te_async_copy_group_sizes" in line:
            where["copy"].append(i)
        elif "te_async_grouped_gemm" in line:
            where["gemm"].append(i)
        elif "/shared_experts/" in name.group(1):
            where["shared"].append(i)
        elif "/routed_experts/gather" in name.group(1):
            where["gather"].append(i)
    return where


@pytest.mark.parametrize("model_type", ["qwen2_moe", "deepseek_v2"])
def test_async_copy_then_shared_experts_then_grouped_gemms(model_type):
    config = tiny(model_type)
    params = random_params(config)
    cache = models.init_cache(config, 2, TOTAL + 1, jnp.float32)
    step = models.decode_step.lower(params, config, cache, jnp.zeros((2, 1), jnp.int32), 3, group_sizes_mode="async")
    hlo = step.compile().as_text()
    layer = next(i for i in range(config.num_hidden_layers) if config.is_moe_layer(i))
    where = layer_schedule(hlo, layer)
    assert all(where.values()), where
    assert max(where["copy"]) < min(where["shared"] + where["gather"]), where
    assert max(where["shared"] + where["gather"]) < min(where["gemm"]), where


@pytest.mark.parametrize("model_type", ["mixtral", "deepseek_v2"])
@pytest.mark.parametrize("mode", ["device", "async"])
def test_decode_matches_forward_on_gpu(model_type, mode):
    config = tiny(model_type)
    params = random_params(config)
    tokens = np.random.default_rng(7).integers(0, config.vocab_size, (2, TOTAL)).astype(np.int32)
    with jax.default_matmul_precision("float32"):
        full = np.asarray(models.forward(params, config, tokens, group_sizes_mode=mode))
        cache = models.init_cache(config, 2, TOTAL + 1, jnp.float32)
        logits, cache = models.prefill(params, config, cache, tokens[:, :PROMPT], group_sizes_mode=mode)
        assert rel_error(logits, full[:, PROMPT - 1]) < 1e-5
        for i in range(PROMPT, TOTAL):
            logits, cache = models.decode_step(params, config, cache, jnp.asarray(tokens[:, i:i + 1]), i,
                                               group_sizes_mode=mode)
            assert rel_error(logits, full[:, i]) < 1e-5, i
