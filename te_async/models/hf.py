"""load_hf: a local Hugging Face checkpoint (config.json + safetensors, one file or sharded with
model.safetensors.index.json) into the params pytree of params.py, read with safetensors' numpy API.

Both expert layouts load: the per-expert tensors of published checkpoints (Mixtral's
block_sparse_moe.experts.{e}.w1/w3/w2, Qwen's and DeepSeek's mlp.experts.{e}.gate_proj/up_proj/
down_proj) and the fused ones transformers 5 holds in memory and can save (mlp.experts.gate_up_proj
[E, 2F, H] as [gate; up], mlp.experts.down_proj [E, H, F]; transformers' conversion_mapping.py).
Every tensor's shape is checked against the config, and a tensor the config does not use is an
error: a checkpoint with more layers or experts than its config.json is never silently cut.
"""

import contextlib
import functools
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np

from .config import DEEPSEEK_TYPES, read_config
from .params import OUT_IN_LEAVES, ROUTER_DTYPE, ROUTER_LEAVES, input_projections, layer_runs, param_shapes, per_layer

# Buffers some checkpoints carry that are derived, not learned.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
_MLP_NAMES = ("gate_proj", "up_proj", "down_proj")


def _safe_open(file: pathlib.Path):
    from safetensors import safe_open  # the optional "models" extra: only loading needs it

    try:
        return safe_open(str(file), framework="numpy")
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error types
        raise ValueError(f"{file}: not a readable safetensors file ({e})") from None


class _Checkpoint:
    """The tensors of a checkpoint directory by name, files opened once, with the names read so far."""

    def __init__(self, directory: pathlib.Path, stack: contextlib.ExitStack):
        self.directory, self.used, self._stack, self._files = directory, set(), stack, {}
        index = directory / "model.safetensors.index.json"
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise ValueError(f"{index}: not a safetensors index with a weight_map ({e!r})") from None
            self.file_of = {name: directory / file for name, file in weight_map.items()}
            for file in sorted(set(self.file_of.values())):
                if not file.is_file():
                    raise ValueError(f"{index} lists {file.name}, which is not in {directory}")
        else:
            files = sorted(directory.glob("*.safetensors"))
            if not files:
                raise ValueError(f"{directory}: no *.safetensors file and no model.safetensors.index.json")
            self.file_of = {}
            for file in files:
                for name in self._open(file)[1]:
                    if name in self.file_of:
                        raise ValueError(f"tensor {name!r} is in both {self.file_of[name].name} and {file.name}")
                    self.file_of[name] = file

    def _open(self, file: pathlib.Path) -> tuple:
        """(handle, names in the file), opened on first use."""
        if file not in self._files:
            handle = self._stack.enter_context(_safe_open(file))
            self._files[file] = handle, set(handle.keys())
        return self._files[file]

    def has(self, name: str) -> bool:
        return name in self.file_of

    def get(self, name: str, shape: tuple) -> np.ndarray:
        """The tensor `name`, which must have this shape."""
        if name not in self.file_of:
            raise ValueError(f"{self.directory}: tensor {name!r} (shape {shape}) is missing from the checkpoint")
        file = self.file_of[name]
        handle, names = self._open(file)
        if name not in names:
            raise ValueError(f"{file}: tensor {name!r} is missing, though the index lists it there")
        actual = tuple(handle.get_slice(name).get_shape())
        if actual != tuple(shape):
            raise ValueError(f"{file}: tensor {name!r} has shape {actual}, the config needs {tuple(shape)}")
        self.used.add(name)
        return handle.get_tensor(name)

    def check_all_used(self, ignored_layers=()) -> None:
        """ignored_layers: decoder layers past the config's (DeepSeek-V3's multi-token prediction),
        which transformers does not load either."""
        ignored = tuple(f"model.layers.{i}." for i in ignored_layers)
        unused = sorted(n for n in set(self.file_of) - self.used
                        if not n.endswith(_IGNORED_SUFFIXES) and not n.startswith(ignored))
        if unused:
            more = f" and {len(unused) - 10} more" if len(unused) > 10 else ""
            raise ValueError(f"{self.directory}: tensors the config.json does not account for: "
                             f"{', '.join(unused[:10])}{more}")


def _linear(ckpt: _Checkpoint, name: str, in_out: tuple) -> np.ndarray:
    """A torch Linear weight [out, in] as [in, out]."""
    return ckpt.get(name, in_out[::-1]).T


def _mlp(ckpt: _Checkpoint, prefix: str, names: tuple, shapes: dict) -> dict:
    """w_gate_up [H, 2F] and w_down [F, H] from three Linear weights named (gate, up, down)."""
    hidden, ffn = shapes["w_down"][::-1]
    gate, up, down = (f"{prefix}{n}.weight" for n in names)
    return {"w_gate_up": np.concatenate([_linear(ckpt, gate, (hidden, ffn)), _linear(ckpt, up, (hidden, ffn))], axis=1),
            "w_down": _linear(ckpt, down, (ffn, hidden))}


def _experts(ckpt: _Checkpoint, prefix: str, names: tuple, shapes: dict) -> dict:
    """w_fc1 [E, H, 2F] and w_fc2 [E, F, H], fused or stacked from per-expert tensors."""
    e, hidden, f2 = shapes["w_fc1"]
    if ckpt.has(f"{prefix}gate_up_proj"):
        return {"w_fc1": ckpt.get(f"{prefix}gate_up_proj", (e, f2, hidden)).transpose(0, 2, 1),
                "w_fc2": ckpt.get(f"{prefix}down_proj", (e, hidden, f2 // 2)).transpose(0, 2, 1)}
    per_expert = [_mlp(ckpt, f"{prefix}{i}.", names, {"w_down": shapes["w_fc2"][1:]}) for i in range(e)]
    return {"w_fc1": np.stack([m["w_gate_up"] for m in per_expert]),
            "w_fc2": np.stack([m["w_down"] for m in per_expert])}


# params.input_projections' names -> transformers' Linear modules under self_attn (w_in's parts).
_INPUT_PROJECTIONS = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "q_a": "q_a_proj", "kv_a": "kv_a_proj_with_mqa"}
# params.py's other attention leaves -> transformers' tensor names under self_attn.
_ATTENTION = {"wo": "o_proj.weight", "bo": "o_proj.bias", "q_norm": "q_norm.weight", "k_norm": "k_norm.weight",
              "q_a_norm": "q_a_layernorm.weight", "wq_b": "q_b_proj.weight", "kv_a_norm": "kv_a_layernorm.weight",
              "wkv_b": "kv_b_proj.weight",
              **{f"b{name}": f"{module}.bias" for name, module in _INPUT_PROJECTIONS.items()}}


def _attention(ckpt: _Checkpoint, prefix: str, config, shapes: dict) -> dict:
    """w_in from the input projections' Linear weights, side by side; the other Linear weights
    ("w*") transposed but those of OUT_IN_LEAVES; biases and norm weights as they are."""
    hidden = shapes["w_in"][0]
    out = {"w_in": np.concatenate([_linear(ckpt, f"{prefix}{_INPUT_PROJECTIONS[name]}.weight", (hidden, width))
                                   for name, width in input_projections(config).items()], axis=1)}
    out.update({key: _linear(ckpt, prefix + _ATTENTION[key], shape) if key.startswith("w") and key not in OUT_IN_LEAVES
                else ckpt.get(prefix + _ATTENTION[key], shape) for key, shape in shapes.items() if key != "w_in"})
    return out


def _moe(ckpt: _Checkpoint, prefix: str, model_type: str, shapes: dict) -> dict:
    """The router, the routed experts and the shared experts of one layer."""
    names = _MLP_NAMES
    if model_type == "mixtral":  # published: block_sparse_moe and w1/w3/w2; transformers 5 in memory: mlp
        legacy = ckpt.has(f"{prefix}block_sparse_moe.gate.weight")
        prefix, names = prefix + ("block_sparse_moe." if legacy else "mlp."), ("w1", "w3", "w2")
    else:
        prefix += "mlp."
    out = {"router": _linear(ckpt, f"{prefix}gate.weight", shapes["router"]),
           **_experts(ckpt, f"{prefix}experts.", names, shapes)}
    if "router_bias" in shapes:
        out["router_bias"] = ckpt.get(f"{prefix}gate.e_score_correction_bias", shapes["router_bias"])
    if "shared" in shapes:
        shared = "shared_experts." if model_type in DEEPSEEK_TYPES else "shared_expert."
        out["shared"] = _mlp(ckpt, prefix + shared, _MLP_NAMES, shapes["shared"])
    if "shared_gate" in shapes:
        out["shared_gate"] = _linear(ckpt, f"{prefix}shared_expert_gate.weight", shapes["shared_gate"])
    return out


def load_hf(path, dtype=None) -> tuple:
    """(params, config) from a local Hugging Face model directory.

    dtype=None keeps the checkpoint's dtype (that of model.embed_tokens.weight; other tensors are
    cast to it); a dtype casts every weight. Routers stay float32 (params.py says why). Each leaf
    is moved to the default device as soon as it is built, so host memory holds one layer at a time.
    Bad input raises ValueError naming the file, the tensor or the key.
    """
    directory = pathlib.Path(path)
    if not directory.is_dir():
        raise ValueError(f"{directory}: not a model directory")
    config = read_config(directory)
    shapes = jax.tree_util.tree_map(lambda s: s.shape, param_shapes(config))
    shapes["layers"] = [jax.tree_util.tree_map(lambda s: s.shape, layer)
                        for layer in per_layer(param_shapes(config)["layers"])]
    with contextlib.ExitStack() as stack:
        ckpt = _Checkpoint(directory, stack)
        embed = ckpt.get("model.embed_tokens.weight", shapes["embed"])
        target = np.dtype(dtype) if dtype is not None else embed.dtype
        put = lambda a: jnp.asarray(np.asarray(a, target))
        params = {"embed": put(embed), "final_norm": put(ckpt.get("model.norm.weight", shapes["final_norm"]))}
        if "lm_head" in shapes:
            params["lm_head"] = put(ckpt.get("lm_head.weight", shapes["lm_head"]))
        else:  # tied: transformers ties lm_head.weight to the embedding whatever the file holds
            ckpt.used.add("lm_head.weight")
        layers = []
        for i, s in enumerate(shapes["layers"]):
            prefix = f"model.layers.{i}."
            layer = {"attn_norm": ckpt.get(f"{prefix}input_layernorm.weight", s["attn_norm"]),
                     "mlp_norm": ckpt.get(f"{prefix}post_attention_layernorm.weight", s["mlp_norm"]),
                     "attn": _attention(ckpt, f"{prefix}self_attn.", config, s["attn"])}
            if "moe" in s:
                layer["moe"] = _moe(ckpt, prefix, config.model_type, s["moe"])
            else:
                layer["mlp"] = _mlp(ckpt, f"{prefix}mlp.", _MLP_NAMES, s["mlp"])
            layers.append(_to_device(layer, put))
            run = next(r for r, (start, n) in enumerate(layer_runs(config)) if start <= i < start + n)
            start, n = layer_runs(config)[run]
            if i == start:
                stack = jax.tree_util.tree_map(lambda a: jnp.zeros((n, *a.shape), a.dtype), layers[-1])
            stack = _set_layer(stack, layers.pop(), jnp.asarray(i - start, jnp.int32))
            if i == start + n - 1:
                params.setdefault("layers", []).append(stack)
        ckpt.check_all_used(ignored_layers=range(config.num_hidden_layers,
                                                 config.num_hidden_layers + config.num_nextn_predict_layers))
    return params, config


@functools.partial(jax.jit, donate_argnums=0)
def _set_layer(stack, layer, index):
    """Layer `index` of a run's stacked params set to `layer`, in place (the stack is donated), so
    that loading holds the device's copy of the weights and one layer more, never two copies."""
    return jax.tree_util.tree_map(lambda s, a: jax.lax.dynamic_update_index_in_dim(s, a.astype(s.dtype), index, 0),
                                  stack, layer)


def _to_device(tree: dict, put) -> dict:
    return {k: _to_device(v, put) if isinstance(v, dict) else
            (jnp.asarray(np.asarray(v, ROUTER_DTYPE)) if k in ROUTER_LEAVES else put(v)) for k, v in tree.items()}

