"""te_async.models on the GPU: the async MoE block's order in the compiled program (in ENTRY for a
layer run inline, in the while body for a scanned run of layers), and the cached decode path
against the full forward there."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import te_async.models as models
from reference import rel_error
from te_async.models.model import scope_name
from test_models import PROMPT, TOTAL, random_params, tiny

pytestmark = pytest.mark.gpu


def _computations(hlo: str) -> dict:
    """{name: instruction lines} of an HLO module's text, ENTRY under "ENTRY"."""
    out, name = {}, None
    for line in hlo.splitlines():
        head = re.match(r"(ENTRY )?%?([\w.\-]+) .*\{$", line)
        if name is None and head:
            name = "ENTRY" if head.group(1) else head.group(2)
            out[name] = []
        elif name is not None and line.strip() == "}":
            name = None
        elif name is not None:
            out[name].append(line)
    return out


def _flatten(computations: dict, name: str) -> list:
    """A computation's lines, with those of the computations that its call instructions (command
    buffers) and custom fusions call inlined where the instruction is; other fusions stay one line.
    In a scanned run XLA wraps each te_async call whose weight is a scan slice in a custom fusion
    (a dynamic-slice fusion, which computes the slice's address) whose own line has no op_name."""
    lines = []
    for line in computations[name]:
        called = re.search(r"= .*? (?:call\(.*to_apply|fusion\(.*kind=kCustom, calls)=%?([\w.\-]+)", line)
        lines.extend(_flatten(computations, called.group(1)) if called and called.group(1) in computations else [line])
    return lines


def layer_schedule(hlo: str, scope: str) -> dict:
    """Positions of one run's copies, shared-expert instructions, permutation gathers and routed
    experts' grouped GEMMs (by their metadata op_name, under the run's named scope) in the scheduled computation
    that holds its copy: ENTRY for a run of one layer, the while loop's body for a scanned run
    (or ENTRY again if XLA unrolled that loop)."""
    computations = _computations(hlo)
    for name in computations:
        if name.startswith("fused"):
            continue
        where = {"copy": [], "shared": [], "gather": [], "gemm": []}
        for i, line in enumerate(_flatten(computations, name)):
            op = re.search(r'op_name="([^"]*)"', line)
            if not op or f"/{scope}/" not in "/" + op.group(1) + "/":
                continue
            if "te_async_copy_group_sizes" in line:
                where["copy"].append(i)
            elif "/shared_experts/" in op.group(1):  # its dense GEMMs are te_async calls too (te_async.dense)
                where["shared"].append(i)
            elif "/routed_experts/gather" in op.group(1):
                where["gather"].append(i)
            elif "te_async_grouped_gemm" in line and "/routed_experts/" in op.group(1):
                where["gemm"].append(i)
        if where["copy"]:
            return where
    raise AssertionError(f"no computation holds a copy under the scope {scope}")


def assert_copy_then_shared_then_gemms(where: dict) -> None:
    """Per layer (the span from one copy to the next: XLA may unroll a scan), the copy, then every
    shared-expert instruction and gather, then the grouped GEMMs; nothing of a layer before its copy."""
    assert all(where.values()), where
    copies = sorted(where["copy"])
    assert min(where["shared"] + where["gather"] + where["gemm"]) > copies[0], where
    for lo, hi in zip(copies, copies[1:] + [float("inf")]):
        mine = lambda key: [i for i in where[key] if lo < i < hi]
        assert mine("shared") + mine("gather") and mine("gemm"), (lo, hi, where)
        assert max(mine("shared") + mine("gather")) < min(mine("gemm")), (lo, hi, where)


@pytest.mark.parametrize("model_type,layers", [("qwen2_moe", None), ("deepseek_v2", None), ("deepseek_v2", 4),
                                               ("qwen2_moe", 4), ("deepseek_v3", 4)])
def test_async_copy_then_shared_experts_then_grouped_gemms(model_type, layers):
    """The default tiny configs' MoE layer is a run of one (inline, in ENTRY); with 4 layers the
    MoE layers 1-3 are one scanned run (layer 0 is dense in both), whose while body must keep the
    order."""
    config = tiny(model_type, **({} if layers is None else {"num_hidden_layers": layers}))
    params = random_params(config)
    cache = models.init_cache(config, 2, TOTAL + 1, jnp.float32)
    step = models.decode_step.lower(params, config, cache, jnp.zeros((2, 1), jnp.int32), 3, group_sizes_mode="async")
    hlo = step.compile().as_text()
    start, n = next((s, n) for s, n in models.layer_runs(config) if config.is_moe_layer(s))
    assert n == (1 if layers is None else 3), models.layer_runs(config)
    assert_copy_then_shared_then_gemms(layer_schedule(hlo, scope_name(start, n)))




@pytest.mark.parametrize("model_type", ["mixtral", "deepseek_v2", "deepseek_v3"])
@pytest.mark.parametrize("mode", ["device", "async"])
@pytest.mark.parametrize("batch", [1, 2])  # device mode decodes one sequence with the fused experts
def test_decode_matches_forward_on_gpu(model_type, mode, batch):
    config = tiny(model_type)
    params = random_params(config)
    tokens = np.random.default_rng(7).integers(0, config.vocab_size, (batch, TOTAL)).astype(np.int32)
    with jax.default_matmul_precision("float32"):
        full = np.asarray(models.forward(params, config, tokens, group_sizes_mode=mode))
        cache = models.init_cache(config, batch, TOTAL + 1, jnp.float32)
        logits, cache = models.prefill(params, config, cache, tokens[:, :PROMPT], group_sizes_mode=mode)
        assert rel_error(logits, full[:, PROMPT - 1]) < 1e-5
        for i in range(PROMPT, TOTAL):
            logits, cache = models.decode_step(params, config, cache, jnp.asarray(tokens[:, i:i + 1]), i,
                                               group_sizes_mode=mode)
            assert rel_error(logits, full[:, i]) < 1e-5, i
