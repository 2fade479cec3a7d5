"""te_async.models on tiny configs of each model type (CPU, float32): the cached decode path
against the full forward, the group-sizes modes and ragged_dot against each other, the MoE block
against a float64 reference, load_hf round trips in both expert layouts, bad input, the presets'
shapes and decode_bytes. Parity with transformers itself is tests/test_models_hf_parity.py's."""

import dataclasses
import json
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import te_async.models as models
from helpers import allocated_buffers, cuda_stablehlo, four_device_mesh, row_scatter_adds, sgd_losses
from reference import rel_error
from te_async.models.mla import softmax_scale
from te_async.models.moe_layer import moe_block

TINY = {
    "mixtral": dict(model_type="mixtral", vocab_size=61, hidden_size=32, intermediate_size=24, num_hidden_layers=1,
                    num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                    sliding_window=5),
    "qwen2_moe": dict(model_type="qwen2_moe", vocab_size=61, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, num_experts=6, num_experts_per_tok=2,
                      moe_intermediate_size=16, shared_expert_intermediate_size=24, mlp_only_layers=[0],
                      tie_word_embeddings=True),
    "qwen3_moe": dict(model_type="qwen3_moe", vocab_size=61, hidden_size=32, intermediate_size=40, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=3,
                      moe_intermediate_size=16, norm_topk_prob=True),
    "deepseek_v2": dict(model_type="deepseek_v2", vocab_size=61, hidden_size=32, intermediate_size=40,
                        num_hidden_layers=2, num_attention_heads=4, q_lora_rank=12, kv_lora_rank=16,
                        qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, n_routed_experts=8, num_experts_per_tok=3,
                        moe_intermediate_size=16, n_shared_experts=1, first_k_dense_replace=1, attention_bias=True,
                        topk_method="group_limited_greedy", n_group=4, topk_group=2, routed_scaling_factor=1.5,
                        max_position_embeddings=256,
                        rope_scaling=dict(type="yarn", factor=8, original_max_position_embeddings=32, mscale=0.707,
                                          mscale_all_dim=0.707)),
    # DeepSeek-V3's router (sigmoid, correction bias, groups by their two best), rope halves as stored,
    # no q LoRA, one multi-token-prediction layer in the checkpoint (not loaded).
    "deepseek_v3": dict(model_type="deepseek_v3", vocab_size=61, hidden_size=32, intermediate_size=40,
                        num_hidden_layers=2, num_attention_heads=4, q_lora_rank=None, kv_lora_rank=16,
                        qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, n_routed_experts=8, num_experts_per_tok=3,
                        moe_intermediate_size=16, n_shared_experts=1, first_k_dense_replace=1, n_group=4,
                        topk_group=2, norm_topk_prob=True, routed_scaling_factor=2.5, rope_interleave=False,
                        num_nextn_predict_layers=1, max_position_embeddings=256),
}
TYPES = list(TINY)
PROMPT, TOTAL = 5, 9  # prefill 5 tokens, decode 4 more, against a 9-token forward


@pytest.fixture(scope="module", autouse=True)
def float32_matmuls():
    """Full float32 dots on every backend (GPUs default to TF32), for the 1e-5 comparisons."""
    with jax.default_matmul_precision("float32"):
        yield


def tiny(kind, **kw):
    return models.from_hf_dict({**TINY[kind], **kw})


def random_params(config, seed=0):
    """float32 params of the config's shapes, every leaf random (norms around 1) so that each one matters."""
    rng = np.random.default_rng(seed)
    paths, treedef = jax.tree_util.tree_flatten_with_path(models.param_shapes(config, jnp.float32))
    leaves = [(path[-1].key.endswith("norm")) + 0.3 * rng.standard_normal(s.shape) for path, s in paths]
    return jax.tree_util.tree_unflatten(treedef, [jnp.asarray(x, jnp.float32) for x in leaves])


# Configs whose layers include runs of several layers, which the decoder scans (the TINY ones have runs of one).
SCANNED = {"deepseek_v2_scan": ("deepseek_v2", dict(num_hidden_layers=4)),  # layer 0 dense, then a scan of 3
           "mixtral_scan": ("mixtral", dict(num_hidden_layers=3))}


def config_of(name):
    kind, kw = SCANNED.get(name, (name, {}))
    return tiny(kind, **kw)


def make_model(name):
    config = config_of(name)
    tokens = np.random.default_rng(7).integers(0, config.vocab_size, (2, TOTAL)).astype(np.int32)
    params = random_params(config)
    return config, params, tokens, np.asarray(models.forward(params, config, tokens))


@pytest.fixture(scope="module", params=TYPES + ["deepseek_v2_scan"])
def model(request):
    return make_model(request.param)


def test_scanned_gqa_prefill_and_decode_match_forward():
    test_prefill_and_decode_match_forward(make_model("mixtral_scan"))


def test_prefill_and_decode_match_forward(model):
    config, params, tokens, full = model
    cache = models.init_cache(config, 2, TOTAL + 1, jnp.float32)
    logits, cache = models.prefill(params, config, cache, tokens[:, :PROMPT])
    assert logits.dtype == jnp.float32 and logits.shape == (2, config.vocab_size)
    assert rel_error(logits, full[:, PROMPT - 1]) < 1e-5
    for i in range(PROMPT, TOTAL):
        logits, cache = models.decode_step(params, config, cache, jnp.asarray(tokens[:, i:i + 1]), i)
        assert rel_error(logits, full[:, i]) < 1e-5, i


def test_layer_runs_and_stacked_layout():
    config = config_of("deepseek_v2_scan")
    assert models.layer_runs(config) == ((0, 1), (1, 3))
    assert models.layer_runs(models.preset("deepseek-v2-lite")) == ((0, 1), (1, 26))
    assert models.layer_runs(models.preset("qwen3-30b-a3b")) == ((0, 48),)
    params = random_params(config)
    assert [jax.tree_util.tree_leaves(run)[0].shape[0] for run in params["layers"]] == [1, 3]
    layers = models.per_layer(params["layers"])
    assert [("moe" in layer) for layer in layers] == [False, True, True, True]
    again = models.stack_layers(layers, config)
    assert jax.tree_util.tree_structure(again) == jax.tree_util.tree_structure(params["layers"])
    for x, y in zip(jax.tree_util.tree_leaves(again), jax.tree_util.tree_leaves(params["layers"])):
        np.testing.assert_array_equal(x, y)
    cache = models.init_cache(config, 2, 7, jnp.float32)
    assert [run["ckv"].shape for run in cache] == [(1, 2, 7, 16), (3, 2, 7, 16)]


def _is_custom_vjp_of(eqn, needle: str) -> bool:
    """A custom_vjp call whose forward's jaxpr mentions `needle` (a primitive or an FFI target)."""
    return eqn.primitive.name == "custom_vjp_call" and needle in str(eqn.params["call_jaxpr"])


def _is_grouped_mlp(eqn) -> bool:
    return _is_custom_vjp_of(eqn, "te_async_grouped_gemm") and "routed_experts" in str(eqn.source_info.name_stack)


def test_one_scan_per_run_of_layers():
    """The compiled program has one body per run: the jaxpr of a decode step of the 4-layer
    DeepSeek config holds one scan (over layers 1-3), whose body holds the async MoE block's copy
    and its two barriers, and tracing is no longer per layer."""
    config = config_of("deepseek_v2_scan")
    params = random_params(config)
    cache = models.init_cache(config, 2, 7, jnp.float32)
    step = lambda p, c, t: models.model._decode_step(p, config, c, t, jnp.int32(3), "async", "te_async", False)
    jaxpr = jax.make_jaxpr(step)(params, cache, jnp.zeros((2, 1), jnp.int32))
    inner = jaxpr.eqns[0].params["jaxpr"].jaxpr  # the jit
    scans = [e for e in inner.eqns if e.primitive.name == "scan"]
    assert len(scans) == 1 and scans[0].params["length"] == 3
    assert "layers1-3" in str(scans[0].source_info.name_stack)
    body = scans[0].params["jaxpr"].jaxpr
    names = [e.primitive.name for e in body.eqns]
    copies = [i for i, e in enumerate(body.eqns) if "copy_group_sizes" in str(e.params.get("target_name", ""))]
    barriers = [i for i, n in enumerate(names) if n == "optimization_barrier"]
    mlp = [i for i, e in enumerate(body.eqns) if _is_grouped_mlp(e)]
    assert len(copies) == 1 and len(barriers) == 2 and len(mlp) == 1
    assert copies[0] < barriers[0] < barriers[1] < mlp[0]


@pytest.mark.parametrize("name", ["deepseek_v2_scan"])
def test_decode_step_returns_the_routing(name):
    config, params, tokens, full = make_model(name)
    moe_layers = sum(map(config.is_moe_layer, range(config.num_hidden_layers)))
    outs = {}
    for name, kw in {"te_async": {}, "ragged_dot": dict(experts="ragged_dot")}.items():
        cache = models.init_cache(config, 2, TOTAL + 1, jnp.float32)
        _, cache = models.prefill(params, config, cache, tokens[:, :PROMPT], **kw)
        logits, cache, routing = models.decode_step(params, config, cache, jnp.asarray(tokens[:, PROMPT:PROMPT + 2]),
                                                    PROMPT, return_routing=True, **kw)
        assert rel_error(logits, full[:, PROMPT + 1]) < 1e-5
        routing = np.asarray(routing)
        assert routing.dtype == np.int32 and routing.shape == (moe_layers, 4, config.num_experts_per_tok)
        assert ((routing >= 0) & (routing < config.num_experts)).all()
        assert all(len(set(row)) == len(row) for row in routing.reshape(-1, routing.shape[-1]))
        outs[name] = routing
    np.testing.assert_array_equal(outs["te_async"], outs["ragged_dot"])


def test_python_and_device_positions_share_one_compilation():
    config = tiny("qwen3_moe", rms_norm_eps=1.5e-6)  # a config of its own, compiled here first
    params = random_params(config)
    cache = models.init_cache(config, 2, TOTAL + 1, jnp.float32)
    token = jnp.ones((2, 1), jnp.int32)
    _, cache = models.decode_step(params, config, cache, token, 0)
    compiled = models.model._decode_step._cache_size()
    for position in (jnp.int32(1), np.int64(2), jnp.asarray(3), np.int32(4), 5):
        logits, cache = models.decode_step(params, config, cache, token, position)
    assert np.isfinite(np.asarray(logits)).all()
    assert models.model._decode_step._cache_size() == compiled
    with pytest.raises(ValueError, match="integer scalar"):
        models.decode_step(params, config, cache, token, 1.5)


def test_generate_is_greedy_over_forward(model):
    config, params, tokens, full = model
    out = np.asarray(models.generate(params, config, tokens[:, :PROMPT], TOTAL - PROMPT, max_len=TOTAL + 1))
    assert out.shape == (2, TOTAL) and (out[:, :PROMPT] == tokens[:, :PROMPT]).all()
    again = np.asarray(models.forward(params, config, out))
    assert (out[:, PROMPT:] == again[:, PROMPT - 1:-1].argmax(-1)).all()
    one = np.asarray(models.generate(params, config, tokens[:, :PROMPT], 1))  # the prefill's token alone
    np.testing.assert_array_equal(one, out[:, :PROMPT + 1])


@pytest.mark.parametrize("name", ["deepseek_v2_scan", "mixtral_scan"])
def test_generate_unrolled_matches_the_scan(name):
    """generate's layers written out (unroll_layers; by default at the batches of
    models.model.UNROLL_MAX_BATCH) give the scan's tokens, and the unrolled step holds no scan."""
    config, params, tokens, _ = make_model(name)
    prompt = tokens[:, :PROMPT]
    scanned = np.asarray(models.generate(params, config, prompt, TOTAL - PROMPT, unroll_layers=False))
    unrolled = np.asarray(models.generate(params, config, prompt, TOTAL - PROMPT, unroll_layers=True))
    np.testing.assert_array_equal(unrolled, scanned)
    assert [models.model.unrolls(b) for b in (1, 2, 3, 32, 64, 65)] == [True] * 5 + [False]
    assert models.model.unrolls(8, "device") and not models.model.unrolls(8, "async")
    assert not models.model.unrolls(8, None, "ragged_dot")
    with pytest.raises(ValueError, match="unroll_layers must be None, True or False"):
        models.generate(params, config, prompt, 2, unroll_layers="yes")
    cache = models.init_cache(config, 2, TOTAL, jnp.float32)
    state = models.model._GreedyState(cache, jnp.zeros((2, 4), jnp.int32), jnp.int32(1), jnp.int32(PROMPT))
    for unroll, scans in ((False, 1), (True, 0)):
        jaxpr = jax.make_jaxpr(lambda s: models.model._greedy_step(params, config, s, None, "te_async", unroll))(state)
        assert str(jaxpr).count("scan[") == scans


@pytest.mark.parametrize("name", ["deepseek_v2_scan", "mixtral_scan"])
def test_forward_gradients_through_te_async_scan(name):
    """forward scans its layer runs with te_async.scan (the pass a training step differentiates):
    its gradients with respect to every parameter are those of the same layers written out, and,
    lowered for the GPU, its gradient allocates the stacked buffers (the run's weight gradients and
    residuals) without filling any with zeros."""
    config, params, tokens, _ = make_model(name)
    layers = models.layer_runs(config)[-1][1]

    def loss(p, unroll):
        x, _, _ = models.model._decoder(p, config, jnp.asarray(tokens), None, None, None, "te_async", unroll)
        return jnp.sum(models.model._logits(p, x) ** 2)

    grad = jax.jit(jax.grad(loss), static_argnums=1)
    paths = jax.tree_util.tree_leaves_with_path(grad(params, False))
    for (path, ours), ref in zip(paths, jax.tree.leaves(grad(params, True))):
        assert float(jnp.max(jnp.abs(ref))) > 0, path
        assert rel_error(ours, ref) < 1e-4, path
    lowered = cuda_stablehlo(jax.grad(lambda p: loss(p, False)), params)
    fills = re.findall(rf"broadcast_in_dim %\S+, dims = \[\] : \(tensor<\w+>\) -> tensor<{layers}x", lowered)
    stacks = [shape for shape in allocated_buffers(lowered) if shape.startswith(f"{layers}x")]
    assert not fills and len(stacks) >= len(jax.tree.leaves(params["layers"][-1]))


@pytest.mark.parametrize("name, experts", [(t, "te_async") for t in TYPES] + [("deepseek_v2", "ragged_dot")])
def test_mixed_precision_training_learns(name, experts):
    """30 SGD steps of next-token cross-entropy on one batch, float32 master weights cast to bf16
    for the forward (the routers stay float32), the gradient through te_async's bf16 backward
    (mixed_precision, dispatch_rows, combine, the checkpointed norm, activation and attention):
    the loss falls from about log(vocab) to under a quarter of it."""
    config = tiny(name)
    master = jax.tree.map(lambda a: 0.3 * a if a.ndim > 1 else a, random_params(config))
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, config.vocab_size, (2, 9)), jnp.int32)

    def loss(p):
        cast = lambda path, a: a if path[-1].key in ("router", "router_bias") else a.astype(jnp.bfloat16)
        return models.next_token_loss(jax.tree_util.tree_map_with_path(cast, p), config, tokens, experts=experts)

    losses = sgd_losses(loss, master, 30, 0.5)
    assert all(np.isfinite(losses)) and losses[0] > 0.8 * math.log(config.vocab_size)
    assert losses[-1] < 0.25 * losses[0], losses


@pytest.mark.parametrize("name", ["deepseek_v2_scan", "mixtral_scan"])
def test_remat_keeps_each_layers_input_alone(name):
    """forward(remat=True): the same gradients as without, and lowered for the GPU the scanned
    run's gradient stacks nothing but its weight gradients and each layer's input [L, B, S, H]."""
    config, params, tokens, _ = make_model(name)
    loss = lambda p, remat: jnp.sum(models.forward(p, config, jnp.asarray(tokens), remat=remat) ** 2)
    grad = jax.jit(jax.grad(loss), static_argnums=1)
    for ours, ref in zip(jax.tree.leaves(grad(params, True)), jax.tree.leaves(grad(params, False))):
        assert rel_error(ours, ref) < 1e-5
    layers = models.layer_runs(config)[-1][1]
    weights = {"x".join(map(str, a.shape)) + "xf32" for a in jax.tree.leaves(params["layers"][-1])}
    lowered = cuda_stablehlo(jax.grad(lambda p: loss(p, True)), params)
    stacks = set(allocated_buffers(lowered)) - weights
    assert stacks == {f"{layers}x{tokens.shape[0]}x{tokens.shape[1]}x{config.hidden_size}xf32"}, stacks
    with pytest.raises(TypeError, match="remat must be True or False"):
        models.forward(params, config, tokens, remat="layer")


@pytest.mark.parametrize("check_vma", [True, False])
def test_data_parallel_training_gradient_is_the_single_device_one(check_vma):
    """Data-parallel training: the batch split over 4 devices by jax.shard_map (the params
    replicated; with and without its varying-axes check), the loss averaged with pmean: the gradient
    of every parameter is the one-device gradient of the whole batch (te_async.scan, the custom VJPs
    and the grouped GEMMs run on each device's shard)."""
    from jax.sharding import PartitionSpec as P

    config, params, _, _ = make_model("deepseek_v2_scan")
    tokens = jnp.asarray(np.random.default_rng(3).integers(0, config.vocab_size, (4, TOTAL)), jnp.int32)
    loss = lambda p, t: jnp.mean(jnp.tanh(models.forward(p, config, t)))
    mesh = four_device_mesh("data")
    parallel = jax.shard_map(lambda p, t: jax.lax.pmean(loss(p, t), "data"), mesh=mesh, in_specs=(P(), P("data")),
                             out_specs=P(), check_vma=check_vma)
    got, want = jax.jit(jax.grad(parallel))(params, tokens), jax.jit(jax.grad(loss))(params, tokens)
    for (path, ours), ref in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want)):
        assert float(jnp.max(jnp.abs(ref))) > 0 and rel_error(ours, ref) < 1e-5, path


@pytest.mark.parametrize("name", ["deepseek_v2_scan", "qwen2_moe"])
def test_bf16_training_gradient_is_the_same_bits_twice(name):
    """Two gradients of a bf16 model's loss on one batch are bit-identical, on whatever backend
    runs the tests (on a GPU this is what the scatter-free backward buys: JAX's own derivative
    added rows with bf16 atomics)."""
    config, params, tokens, _ = make_model(name)
    params = jax.tree_util.tree_map_with_path(
        lambda path, a: a if path[-1].key in ("router", "router_bias") else a.astype(jnp.bfloat16), params)
    grad = jax.jit(jax.grad(lambda p: jnp.mean(jax.nn.log_softmax(models.forward(p, config, jnp.asarray(tokens)))[..., 1])))
    first, again = (jax.tree.leaves(jax.device_get(grad(params))) for _ in range(2))
    assert any(float(np.abs(np.asarray(a, np.float32)).max()) > 0 for a in first)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))


@pytest.mark.parametrize("name", TYPES)
def test_training_gradient_adds_no_rows_by_scatter(name):
    """Lowered for the GPU, a model's training gradient adds no rows by scatter (atomics on a GPU):
    its MoE blocks' permutation and unpermutation transpose to gathers (te_async.routing's
    dispatch_rows and combine), the embedding's lookup to a segmented sum and a scatter that sets
    (te_async.models.embedding)."""
    config, params, tokens, _ = make_model(name)
    loss = lambda p: jnp.sum(models.forward(p, config, jnp.asarray(tokens)) ** 2)
    lowered = cuda_stablehlo(jax.grad(loss), params)
    assert "te_async_grouped_gemm" in lowered and not row_scatter_adds(lowered, config.hidden_size)


def _moe_reference(p, config, x):
    """The MoE block in float64 numpy, one token and one expert at a time."""
    p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), p)
    silu = lambda a: a / (1 + np.exp(-a))

    def mlp(w, v):
        gate, up = np.split(v @ w["w_gate_up"], 2)
        return (silu(gate) * up) @ w["w_down"]

    out = []
    for v in np.asarray(x, np.float64):
        logits = v @ p["router"]
        if config.scoring_func == "sigmoid":
            probs = 1 / (1 + np.exp(-logits))
            choice = (probs + p["router_bias"]).reshape(config.n_group, -1)
            keep = np.argsort(-np.sort(choice, axis=1)[:, -2:].sum(1))[:config.topk_group]
            choice = np.where(np.isin(np.arange(config.n_group), keep)[:, None], choice, -np.inf).reshape(-1)
        else:
            probs = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
            choice = probs
            if config.topk_method == "group_limited_greedy":
                groups = probs.reshape(config.n_group, -1)
                keep = np.argsort(-groups.max(1))[:config.topk_group]
                choice = np.where(np.isin(np.arange(config.n_group), keep)[:, None], groups, 0).reshape(-1)
        chosen = np.argsort(-choice)[:config.num_experts_per_tok]
        weights = probs[chosen] / (probs[chosen].sum() if config.norm_topk_prob else 1) * config.routed_scaling_factor
        y = sum(w * mlp({"w_gate_up": p["w_fc1"][e], "w_down": p["w_fc2"][e]}, v) for w, e in zip(weights, chosen))
        if "shared" in p:
            gate = 1 / (1 + np.exp(-(v @ p["shared_gate"]))) if "shared_gate" in p else 1
            y = y + gate * mlp(p["shared"], v)
        out.append(y)
    return np.stack(out)


# On the CPU, sync and device mode run the same handler (they differ in its name): sync once.
VARIANTS = [(t, v) for t in TYPES for v in ("device", "async", "ragged_dot")] + [("deepseek_v2", "sync")]


@pytest.mark.parametrize("model_type,variant", VARIANTS)
def test_moe_block_matches_float64_reference(model_type, variant):
    """Every group-sizes mode and the ragged_dot experts give the reference's output."""
    config = tiny(model_type)
    p = next(layer["moe"] for layer in models.per_layer(random_params(config)["layers"]) if "moe" in layer)
    x = jnp.asarray(np.random.default_rng(3).standard_normal((2, 7, config.hidden_size)), jnp.float32)
    kw = dict(group_sizes_mode=None, experts="ragged_dot") if variant == "ragged_dot" else dict(
        group_sizes_mode=variant, experts="te_async")
    y = jax.jit(lambda p, x: moe_block(p, config, x, **kw))(p, x)
    assert y.shape == x.shape
    assert rel_error(y.reshape(14, -1), _moe_reference(p, config, x.reshape(14, -1))) < 1e-5


def test_async_order_copy_then_shared_experts_then_grouped_gemms():
    """The jaxpr of an async MoE block: the copy's handle and x go through an optimization_barrier
    whose x is the only one the shared experts and the permutation read; the shared experts'
    output and the permuted rows go through a second one whose rows are what grouped_mlp reads.
    (The GPU removes barriers only after scheduling, so its compiled order keeps them.)"""
    config = tiny("qwen2_moe")
    p = next(layer["moe"] for layer in models.per_layer(random_params(config)["layers"]) if "moe" in layer)
    x = jnp.ones((3, config.hidden_size), jnp.float32)
    block = lambda p, x: moe_block(p, config, x, group_sizes_mode="async", experts="te_async")
    jaxpr = jax.make_jaxpr(block)(p, x).jaxpr
    eqns = list(jaxpr.eqns)
    producer = {v: e for e in eqns for v in e.outvars}
    copy = next(e for e in eqns if "copy_group_sizes" in str(e.params.get("target_name", "")))
    first, second = [e for e in eqns if e.primitive.name == "optimization_barrier"]
    x_after = first.outvars[first.invars.index(jaxpr.invars[-1])]
    assert copy.outvars[0] in first.invars
    shared = [e for e in eqns if "shared_experts" in str(e.source_info.name_stack)]
    gather = next(e for e in eqns if _is_custom_vjp_of(e, "gather") and not _is_grouped_mlp(e))  # dispatch_rows
    assert any(x_after in e.invars for e in shared) and x_after in gather.invars
    assert all(jaxpr.invars[-1] not in e.invars for e in shared + [gather])
    assert gather.outvars[0] in second.invars and any(producer.get(v) in shared for v in second.invars)
    rows = second.outvars[second.invars.index(gather.outvars[0])]
    assert any("custom_vjp" in e.primitive.name and rows in e.invars for e in eqns)  # grouped_mlp reads them


def test_yarn_softmax_scale_of_deepseek_v2_lite():
    config = models.preset("deepseek-v2-lite")
    mscale = 0.1 * 0.707 * math.log(40) + 1
    assert softmax_scale(config) == pytest.approx(192 ** -0.5 * mscale ** 2)


# --- presets, init_params, decode_bytes ---

PUBLISHED_PARAMS = {"deepseek-v2-lite": 15.7e9, "qwen3-30b-a3b": 30.5e9, "mixtral-8x7b": 46.7e9, "deepseek-v3": 671e9}


@pytest.mark.parametrize("name", list(PUBLISHED_PARAMS))
def test_preset_init_params_have_the_published_sizes(name):
    config = models.preset(name)
    shapes = jax.eval_shape(lambda k: models.init_params(config, k), jax.random.key(0))
    assert sum(x.size for x in jax.tree_util.tree_leaves(shapes)) == pytest.approx(PUBLISHED_PARAMS[name], rel=2e-3)
    moe = next(layer["moe"] for layer in models.per_layer(shapes["layers"]) if "moe" in layer)
    e, h, f = config.num_experts, config.hidden_size, config.moe_intermediate_size
    assert moe["w_fc1"].shape == (e, h, 2 * f) and moe["w_fc2"].shape == (e, f, h)
    assert moe["w_fc1"].dtype == jnp.bfloat16 and moe["router"].dtype == jnp.float32
    short = models.preset(name, num_hidden_layers=2)
    assert len(models.per_layer(jax.eval_shape(lambda k: models.init_params(short, k), jax.random.key(0))["layers"])) == 2


def test_preset_layer_kinds():
    layers = models.per_layer(models.param_shapes(models.preset("deepseek-v2-lite"))["layers"])
    assert [("moe" in layer) for layer in layers[:3]] == [False, True, True]
    with pytest.raises(ValueError, match="unknown preset"):
        models.preset("llama")
    with pytest.raises(TypeError, match="no Config field: num_layers"):
        models.preset("mixtral-8x7b", num_layers=2)


def test_decode_bytes_adds_up():
    config = models.preset("deepseek-v2-lite")
    shapes = models.param_shapes(config)
    nbytes = lambda tree: sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(tree))
    moe = [layer["moe"] for layer in models.per_layer(shapes["layers"]) if "moe" in layer]
    expert = nbytes([moe[0]["w_fc1"], moe[0]["w_fc2"]]) // config.num_experts
    # everything, less the unused experts, less the embedding but one row per token, plus the cache
    batch, length, active = 4, 100, 20
    want = (nbytes(shapes) - len(moe) * (config.num_experts - active) * expert - nbytes(shapes["embed"])
            + batch * config.hidden_size * 2 + batch * length * config.num_hidden_layers * (512 + 64) * 2)
    assert models.decode_bytes(config, batch, length, active) == want
    assert models.decode_bytes(config, batch, length + 1, active) > want
    assert models.decode_bytes(config, batch, length, [active] * len(moe)) == want
    for bad in (0, 25, [active] * 3):
        with pytest.raises(ValueError, match="active"):
            models.decode_bytes(config, batch, length, bad)


def test_train_flops_by_hand():
    """The tiny configs' counts written out from their config.json numbers."""
    batch, seq = 2, 7
    # Mixtral: q 4x8, k and v 2x8 from hidden 32; wo; router; 2 of 4 experts (32 -> 2x24 -> 32); the
    # LM head over 61 ids. Sliding window 5: the 7 queries see 1, 2, 3, 4, 5, 5, 5 keys of 8 + 8 dims.
    weights = 32 * 64 + 32 * 32 + 32 * 4 + 2 * (32 * 48 + 24 * 32) + 61 * 32
    attention = 4 * (8 + 8) * (1 + 2 + 3 + 4 + 5 + 5 + 5)
    assert models.train_flops(tiny("mixtral"), batch, seq) == 6 * (batch * seq * weights + batch * attention)
    # DeepSeek-V2: per layer q_a 32x12, kv_a 32x(16+4), q_b 12x(4x12), kv_b 16x(4x(8+8)), wo (4x8)x32;
    # layer 0 a dense MLP of 40, layer 1 a router over 8, one shared expert and 3 routed ones of 16.
    attn = 32 * 12 + 32 * 20 + 12 * 48 + 16 * 64 + 32 * 32
    weights = 2 * attn + 32 * 80 + 40 * 32 + 32 * 8 + 4 * (32 * 32 + 16 * 32) + 61 * 32
    attention = 2 * 4 * (12 + 8) * sum(range(1, seq + 1))
    assert models.train_flops(tiny("deepseek_v2"), batch, seq) == 6 * (batch * seq * weights + batch * attention)
    with pytest.raises(ValueError, match="seq must be a positive integer"):
        models.train_flops(tiny("mixtral"), 2, 0)


# --- bad input ---

def test_bad_tokens_and_lengths():
    config = tiny("qwen3_moe")
    params = random_params(config)
    with pytest.raises(ValueError, match=r"token id 61 at \[1, 2\] is outside the vocabulary \[0, 61\)"):
        models.forward(params, config, np.array([[1, 2, 3], [4, 5, 61]]))
    with pytest.raises(ValueError, match="token id -1"):
        models.generate(params, config, np.array([[-1, 2]]), 3)
    with pytest.raises(ValueError, match="integer"):
        models.forward(params, config, np.zeros((2, 3), np.float32))
    cache = models.init_cache(config, 1, 4, jnp.float32)
    with pytest.raises(ValueError, match="the prompt has 5 tokens, longer than the cache"):
        models.prefill(params, config, cache, np.zeros((1, 5), np.int32))
    with pytest.raises(ValueError, match="exceed max_len 6"):
        models.generate(params, config, np.zeros((1, 4), np.int32), 3, max_len=6)
    with pytest.raises(ValueError, match="experts must be one of"):
        models.forward(params, config, np.zeros((1, 2), np.int32), experts="dense")
    with pytest.raises(ValueError, match="applies to experts='te_async'"):
        models.forward(params, config, np.zeros((1, 2), np.int32), experts="ragged_dot", group_sizes_mode="sync")
    with pytest.raises(ValueError, match=r"params\['layers'\]\[0\]\['moe'\]\['w_fc1'\] has shape"):
        models.forward(params, dataclasses.replace(config, moe_intermediate_size=8), np.zeros((1, 2), np.int32))


def test_decode_step_poisons_what_it_cannot_check(model):
    """Inside jit token values and positions are not known to the host: NaN instead of an answer."""
    config, params, _, _ = model
    cache = models.init_cache(config, 2, TOTAL + 1, jnp.float32)
    logits, cache = models.decode_step(params, config, cache, jnp.array([[99], [1]], jnp.int32), 0)
    assert np.isnan(np.asarray(logits[0])).all() and np.isfinite(np.asarray(logits[1])).all()
    logits, cache = models.decode_step(params, config, cache, jnp.ones((2, 1), jnp.int32), TOTAL + 1)
    assert np.isnan(np.asarray(logits)).all()


@pytest.mark.parametrize("change,match", [
    (dict(model_type="llama"),
     "unsupported model_type 'llama'; supported: mixtral, qwen2_moe, qwen3_moe, deepseek_v2, deepseek_v3"),
    (dict(hidden_act="gelu"), "hidden_act 'gelu' is not supported"),
    (dict(num_experts_per_tok=9), "num_experts_per_tok 9 > num_experts 8"),
    (dict(rope_scaling=dict(type="linear", factor=2.0)), "rope type 'linear' is not supported"),
    (dict(num_key_value_heads=3), "not a multiple of num_key_value_heads 3"),
])
def test_bad_configs(change, match):
    with pytest.raises(ValueError, match=match):
        tiny("qwen3_moe", **change)


@pytest.mark.parametrize("change,match", [
    (dict(scoring_func="softmax"), "deepseek_v3 routes by sigmoid scores and noaux_tc"),
    (dict(topk_method="group_limited_greedy"), "deepseek_v3 routes by sigmoid scores and noaux_tc"),
    (dict(n_group=8, topk_group=3), "noaux_tc ranks groups by their two best experts"),
    (dict(n_group=3), "noaux_tc needs n_group \\(3\\) to divide num_experts"),
    (dict(quantization_config=dict(quant_method="fp8")),
     "quantized checkpoints are not supported \\(quantization_config 'fp8'\\)"),
])
def test_bad_deepseek_v3_configs(change, match):
    with pytest.raises(ValueError, match=match):
        tiny("deepseek_v3", **change)


def test_deepseek_v3_config_reads_as_transformers_does():
    """The defaults of transformers' DeepseekV3Config (sigmoid, noaux_tc, renormalised, x2.5,
    interleaved rope) where the file is silent; the file's spellings of those accepted."""
    config = models.from_hf_dict({"model_type": "deepseek_v3"})
    assert (config.scoring_func, config.topk_method, config.norm_topk_prob, config.routed_scaling_factor) == (
        "sigmoid", "noaux_tc", True, 2.5)
    assert (config.num_experts, config.n_group, config.topk_group, config.num_experts_per_tok) == (256, 8, 4, 8)
    assert config.rope_interleave and config.q_lora_rank == 1536 and config.num_nextn_predict_layers == 1
    assert config.is_mla and config.shared_intermediate_size == 2048 and not config.is_moe_layer(2)
    hub = tiny("deepseek_v3", scoring_func="sigmoid", topk_method="noaux_tc", num_local_experts=8)
    assert hub == tiny("deepseek_v3")


# --- load_hf ---

def hf_tensors(params, config, fused):
    """The params as a Hugging Face checkpoint: torch Linear weights [out, in]; experts per expert
    (published names) or fused (transformers 5's gate_up_proj [E, 2F, H], down_proj [E, H, F])."""
    t = lambda a: np.ascontiguousarray(np.asarray(a).T)
    out = {"model.embed_tokens.weight": params["embed"], "model.norm.weight": params["final_norm"]}
    if "lm_head" in params:
        out["lm_head.weight"] = params["lm_head"]
    names = {"wo": "o_proj", "wq_b": "q_b_proj", "wkv_b": "kv_b_proj", "q_a_norm": "q_a_layernorm.weight",
             "kv_a_norm": "kv_a_layernorm.weight", "q_norm": "q_norm.weight", "k_norm": "k_norm.weight",
             "bq": "q_proj.bias", "bk": "k_proj.bias", "bv": "v_proj.bias", "bo": "o_proj.bias",
             "bq_a": "q_a_proj.bias", "bkv_a": "kv_a_proj_with_mqa.bias"}
    projections = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "q_a": "q_a_proj", "kv_a": "kv_a_proj_with_mqa"}
    mixtral = config.model_type == "mixtral"

    def mlp(prefix, p, gate="gate_proj", up="up_proj", down="down_proj"):
        f = p["w_down"].shape[0]
        return {f"{prefix}{gate}.weight": t(p["w_gate_up"][:, :f]), f"{prefix}{up}.weight": t(p["w_gate_up"][:, f:]),
                f"{prefix}{down}.weight": t(p["w_down"])}

    for i, layer in enumerate(models.per_layer(params["layers"])):
        pre = f"model.layers.{i}."
        out[pre + "input_layernorm.weight"] = layer["attn_norm"]
        out[pre + "post_attention_layernorm.weight"] = layer["mlp_norm"]
        for k, v in layer["attn"].items():
            if k == "w_in":  # the input projections side by side, in input_projections' order
                bounds = np.cumsum([0, *models.input_projections(config).values()])
                for (name, lo, hi) in zip(models.input_projections(config), bounds, bounds[1:]):
                    out[f"{pre}self_attn.{projections[name]}.weight"] = t(v[:, lo:hi])
                continue
            name = names[k]
            as_stored = "." in name or k in models.params.OUT_IN_LEAVES
            out[f"{pre}self_attn.{name}" + ("" if "." in name else ".weight")] = v if as_stored else t(v)
        if "mlp" in layer:
            out.update(mlp(pre + "mlp.", layer["mlp"]))
            continue
        moe, block = layer["moe"], pre + ("block_sparse_moe." if mixtral and not fused else "mlp.")
        out[block + "gate.weight"] = t(moe["router"])
        if "router_bias" in moe:
            out[block + "gate.e_score_correction_bias"] = moe["router_bias"]
        if fused:
            out[block + "experts.gate_up_proj"] = np.asarray(moe["w_fc1"]).transpose(0, 2, 1).copy()
            out[block + "experts.down_proj"] = np.asarray(moe["w_fc2"]).transpose(0, 2, 1).copy()
        else:
            for e in range(config.num_experts):
                p = {"w_gate_up": moe["w_fc1"][e], "w_down": moe["w_fc2"][e]}
                out.update(mlp(f"{block}experts.{e}.", p, *(("w1", "w3", "w2") if mixtral else ())))
        if "shared" in moe:
            shared = "shared_experts." if config.model_type.startswith("deepseek") else "shared_expert."
            out.update(mlp(block + shared, moe["shared"]))
        if "shared_gate" in moe:
            out[block + "shared_expert_gate.weight"] = t(moe["shared_gate"])
    return {k: np.asarray(v, np.float32) for k, v in out.items()}


def write_checkpoint(directory, model_type, tensors, shards=1):
    save_file = pytest.importorskip("safetensors.numpy").save_file
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(TINY[model_type]))
    names = sorted(tensors)
    if shards == 1:
        save_file(tensors, str(directory / "model.safetensors"))
        return directory
    weight_map = {}
    for s in range(shards):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = names[s::shards]
        save_file({n: tensors[n] for n in part}, str(directory / file))
        weight_map.update({n: file for n in part})
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return directory


@pytest.mark.parametrize("model_type", TYPES)
@pytest.mark.parametrize("fused", [False, True], ids=["per_expert", "fused"])
def test_load_hf_round_trip(tmp_path, model_type, fused):
    config = tiny(model_type)
    params = random_params(config)
    directory = write_checkpoint(tmp_path / "ckpt", model_type, hf_tensors(params, config, fused), shards=1 + fused)
    loaded, loaded_config = models.load_hf(directory)
    assert loaded_config == config
    assert jax.tree_util.tree_structure(loaded) == jax.tree_util.tree_structure(params)
    for a, b in zip(jax.tree_util.tree_leaves(loaded), jax.tree_util.tree_leaves(params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    cast, _ = models.load_hf(directory, dtype=jnp.bfloat16)
    assert cast["embed"].dtype == jnp.bfloat16 and cast["layers"][-1]["moe"]["router"].dtype == jnp.float32


@pytest.fixture
def checkpoint(tmp_path):
    config = tiny("deepseek_v2")
    tensors = hf_tensors(random_params(config), config, fused=False)
    return write_checkpoint(tmp_path / "ckpt", "deepseek_v2", tensors), tensors


def _rewrite(directory, tensors):
    pytest.importorskip("safetensors.numpy").save_file(tensors, str(directory / "model.safetensors"))


def test_load_hf_bad_directories(tmp_path, checkpoint):
    directory, tensors = checkpoint
    with pytest.raises(ValueError, match="not a model directory"):
        models.load_hf(tmp_path / "nowhere")
    (directory / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="config.json: not valid JSON"):
        models.load_hf(directory)
    (directory / "config.json").write_text(json.dumps({**TINY["deepseek_v2"], "model_type": "gpt2"}))
    with pytest.raises(ValueError, match="config.json: unsupported model_type 'gpt2'; supported: mixtral"):
        models.load_hf(directory)
    (directory / "config.json").unlink()
    with pytest.raises(ValueError, match="no config.json"):
        models.load_hf(directory)
    (directory / "config.json").write_text(json.dumps(TINY["deepseek_v2"]))
    (directory / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="no \\*.safetensors file"):
        models.load_hf(directory)


def test_load_hf_skips_deepseek_v3_prediction_layers(tmp_path):
    """The tensors of the num_nextn_predict_layers layers after the last are not loaded (as in
    transformers); a tensor of a layer past those is still an error."""
    config = tiny("deepseek_v3")
    params = random_params(config)
    tensors = hf_tensors(params, config, fused=False)
    tensors["model.layers.2.eh_proj.weight"] = np.ones((32, 64), np.float32)  # DeepSeek-V3's MTP projection
    directory = write_checkpoint(tmp_path / "ckpt", "deepseek_v3", tensors)
    loaded, _ = models.load_hf(directory)
    np.testing.assert_array_equal(loaded["layers"][1]["moe"]["router_bias"], params["layers"][1]["moe"]["router_bias"])
    tensors["model.layers.3.eh_proj.weight"] = np.ones((32, 64), np.float32)
    _rewrite(directory, tensors)
    with pytest.raises(ValueError, match="does not account for: model.layers.3.eh_proj.weight"):
        models.load_hf(directory)


@pytest.mark.parametrize("edit,match", [
    (lambda t: t.pop("model.layers.1.mlp.experts.3.up_proj.weight"),
     "tensor 'model.layers.1.mlp.experts.3.up_proj.weight' \\(shape \\(16, 32\\)\\) is missing"),
    (lambda t: t.update({"model.layers.0.self_attn.kv_b_proj.weight": np.zeros((64, 15), np.float32)}),
     "model.safetensors: tensor 'model.layers.0.self_attn.kv_b_proj.weight' has shape \\(64, 15\\), "
     "the config needs \\(64, 16\\)"),
    # the parts of w_in (the input projections side by side) are each checked and named
    (lambda t: t.update({"model.layers.1.self_attn.kv_a_proj_with_mqa.weight": np.zeros((20, 31), np.float32)}),
     "tensor 'model.layers.1.self_attn.kv_a_proj_with_mqa.weight' has shape \\(20, 31\\), the config needs \\(20, 32\\)"),
    (lambda t: t.pop("model.layers.1.self_attn.q_a_proj.weight"),
     "tensor 'model.layers.1.self_attn.q_a_proj.weight' \\(shape \\(12, 32\\)\\) is missing"),
    (lambda t: t.update({"model.layers.2.input_layernorm.weight": np.ones(32, np.float32),
                         "model.layers.1.mlp.experts.8.up_proj.weight": np.ones((16, 32), np.float32)}),
     "tensors the config.json does not account for: model.layers.1.mlp.experts.8.up_proj.weight, model.layers.2"),
])
def test_load_hf_bad_tensors(checkpoint, edit, match):
    directory, tensors = checkpoint
    edit(tensors)
    _rewrite(directory, tensors)
    with pytest.raises(ValueError, match=match):
        models.load_hf(directory)
