"""The params pytree: its shapes for a config (one source for init_params, the checkpoint loader's
checks and decode_bytes), and random params of those shapes.

Layout: {"embed" [V,H], "final_norm" [H], "lm_head" [V,H] (absent when tied to embed),
"layers": [per run of layers {"attn_norm", "mlp_norm", "attn": {...}, and "mlp" (dense) or "moe"}]}.
A run (layer_runs) is a maximal run of consecutive decoder layers of one structure (dense or MoE,
one attention window); its dict holds the per-layer leaves stacked on a leading layer axis, so
that the decoder runs it as one jax.lax.scan (DeepSeek-V2-Lite: a run of 1 dense layer, then one
of 26 MoE layers). per_layer(params["layers"]) gives the per-layer dicts (views of the stacks),
stack_layers the reverse. Linear weights are [in, out], but those of OUT_IN_LEAVES: MLA's
"wkv_b" is kept [out, in] as transformers stores it (te_async.models.mla says why). The
attention's projections of its normed input (q, k, v; MLA's q or q_a, and kv_a) are one weight
"w_in", their columns side by side in input_projections' order, so that one GEMM reads them
(their biases stay apart: "b" + the projection's name). The routed experts are "w_fc1" [E,H,2F]
as [gate | up] and "w_fc2" [E,F,H], grouped_mlp's layout. Routers ("router" [H,E], and DeepSeek-V3's correction bias
"router_bias" [E]) are float32 whatever the model's dtype: routing decisions are sensitive, and
DeepSeek keeps its gate in float32 (transformers' _keep_in_fp32_modules).
"""

import functools

import jax
import jax.numpy as jnp

ROUTER_DTYPE = jnp.float32
ROUTER_LEAVES = ("router", "router_bias")  # kept in ROUTER_DTYPE
OUT_IN_LEAVES = ("wkv_b",)  # Linear weights kept [out, in]


def input_projections(c) -> dict:
    """{name: output width} of the attention's projections of its normed input, in w_in's column
    order: grouped-query q, k, v; MLA's q (or q_a, with a q_lora_rank) and kv_a (latent and rope key)."""
    if c.is_mla:
        heads, qk = c.num_attention_heads, c.qk_nope_head_dim + c.qk_rope_head_dim
        q = {"q": heads * qk} if c.q_lora_rank is None else {"q_a": c.q_lora_rank}
        return {**q, "kv_a": c.kv_lora_rank + c.qk_rope_head_dim}
    kv = c.num_key_value_heads * c.head_dim
    return {"q": c.num_attention_heads * c.head_dim, "k": kv, "v": kv}


def _attention_shapes(c) -> dict:
    h = c.hidden_size
    widths = input_projections(c)
    s = {"w_in": (h, sum(widths.values()))}
    if c.qkv_bias:
        s.update({f"b{name}": (width,) for name, width in widths.items() if name != "q" or not c.is_mla})
    if c.is_mla:
        heads, qk = c.num_attention_heads, c.qk_nope_head_dim + c.qk_rope_head_dim
        if c.q_lora_rank is not None:
            s.update(q_a_norm=(c.q_lora_rank,), wq_b=(c.q_lora_rank, heads * qk))
        s.update(kv_a_norm=(c.kv_lora_rank,), wkv_b=(heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank),
                 wo=(heads * c.v_head_dim, h))
    else:
        s["wo"] = (c.num_attention_heads * c.head_dim, h)
        if c.qk_norm:
            s.update(q_norm=(c.head_dim,), k_norm=(c.head_dim,))
    if c.o_bias:
        s["bo"] = (h,)
    return s


def _mlp_shapes(hidden: int, ffn: int) -> dict:
    return {"w_gate_up": (hidden, 2 * ffn), "w_down": (ffn, hidden)}


def _moe_shapes(c) -> dict:
    h, e, f = c.hidden_size, c.num_experts, c.moe_intermediate_size
    s = {"router": (h, e), "w_fc1": (e, h, 2 * f), "w_fc2": (e, f, h)}
    if c.scoring_func == "sigmoid":
        s["router_bias"] = (e,)
    if c.shared_intermediate_size:
        s["shared"] = _mlp_shapes(h, c.shared_intermediate_size)
        if c.shared_expert_gate:
            s["shared_gate"] = (h, 1)
    return s


def layer_runs(config) -> tuple:
    """((first layer, number of layers), ...): the maximal runs of consecutive layers that share
    a structure (dense or MoE, and the attention window), in order."""
    runs = []
    for i in range(config.num_hidden_layers):
        key = (config.is_moe_layer(i), config.window(i))
        if runs and runs[-1][2] == key:
            runs[-1][1] += 1
        else:
            runs.append([i, 1, key])
    return tuple((start, n) for start, n, _ in runs)


def _is_shape(x) -> bool:
    return isinstance(x, tuple)


def per_layer(layers: list) -> list:
    """The per-layer dicts of params["layers"] (or of param_shapes' or a cache's runs): leaf [i]
    of each stacked run (a jax.ShapeDtypeStruct leaf loses its leading axis)."""
    out = []
    for run in layers:
        n = jax.tree_util.tree_leaves(run)[0].shape[0]
        take = lambda j: lambda a: (jax.ShapeDtypeStruct(a.shape[1:], a.dtype)
                                    if isinstance(a, jax.ShapeDtypeStruct) else a[j])
        out.extend(jax.tree_util.tree_map(take(j), run) for j in range(n))
    return out


def stack_layers(layers: list, config) -> list:
    """params["layers"] from per-layer dicts (the reverse of per_layer): jnp.stack per run."""
    if len(layers) != config.num_hidden_layers:
        raise ValueError(f"{len(layers)} layers for a config of {config.num_hidden_layers}")
    return [jax.tree_util.tree_map(lambda *a: jnp.stack(a), *layers[start:start + n])
            for start, n in layer_runs(config)]


def param_shapes(config, dtype=jnp.bfloat16) -> dict:
    """The params pytree with jax.ShapeDtypeStruct leaves (each run's leaves [layers, ...])."""
    c = config
    layers = []
    for start, n in layer_runs(c):
        layer = {"attn_norm": (c.hidden_size,), "mlp_norm": (c.hidden_size,), "attn": _attention_shapes(c)}
        if c.is_moe_layer(start):
            layer["moe"] = _moe_shapes(c)
        else:
            layer["mlp"] = _mlp_shapes(c.hidden_size, c.intermediate_size)
        layers.append(jax.tree_util.tree_map(lambda s, n=n: (n, *s), layer, is_leaf=_is_shape))
    tree = {"embed": (c.vocab_size, c.hidden_size), "final_norm": (c.hidden_size,), "layers": layers}
    if not c.tie_word_embeddings:
        tree["lm_head"] = (c.vocab_size, c.hidden_size)

    def leaf(path, shape):
        name = path[-1].key
        return jax.ShapeDtypeStruct(shape, ROUTER_DTYPE if name in ROUTER_LEAVES else dtype)

    return jax.tree_util.tree_map_with_path(leaf, tree, is_leaf=_is_shape)


@functools.partial(jax.jit, static_argnames=("config", "dtype"))
def init_params(config, key: jax.Array, dtype=jnp.bfloat16) -> dict:
    """Random params of the config's real sizes: weights normal(0, initializer_range), norms 1,
    biases (the router's too) 0, as transformers initialises. One jitted program, made on the device;
    jax.eval_shape(init_params, config, key) allocates nothing."""
    shapes = param_shapes(config, dtype)
    paths, treedef = jax.tree_util.tree_flatten_with_path(shapes)
    keys = jax.random.split(key, len(paths))

    def make(path, s, k):
        name = path[-1].key
        if name.endswith("norm"):
            return jnp.ones(s.shape, s.dtype)
        if name.startswith("b") or name == "router_bias":
            return jnp.zeros(s.shape, s.dtype)
        return jax.random.normal(k, s.shape, s.dtype) * jnp.asarray(config.initializer_range, s.dtype)

    return jax.tree_util.tree_unflatten(treedef, [make(p, s, k) for (p, s), k in zip(paths, keys)])


def check_params(params, config) -> None:
    """Raises ValueError naming the first leaf whose presence or shape disagrees with the config."""
    want = jax.tree_util.tree_flatten_with_path(param_shapes(config))[0]
    got = dict(jax.tree_util.tree_flatten_with_path(params)[0])
    for path, s in want:
        name = jax.tree_util.keystr(path)
        if path not in got:
            raise ValueError(f"params{name} is missing for this {config.model_type} config")
        if jnp.shape(got[path]) != s.shape:
            raise ValueError(f"params{name} has shape {jnp.shape(got[path])}, the config needs {s.shape}")
    if len(got) != len(want):
        extra = sorted(jax.tree_util.keystr(p) for p in set(got) - {p for p, _ in want})
        raise ValueError(f"params has leaves this config does not use: {', '.join(extra[:5])}")
