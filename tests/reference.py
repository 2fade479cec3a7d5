"""Float64 references for te_async, written from numpy / jnp ops, never from te_async."""

import jax.numpy as jnp
import numpy as np

SIZE_KINDS = ("random", "skewed", "zeros", "underfull", "one_group")


def random_group_sizes(rng, groups: int, rows: int, kind: str) -> np.ndarray:
    """int32 sizes of the given kind: random splits (rarely multiples of 8), heavy skew, many
    empty groups, a sum below `rows` (rows past it must come out zero), or all rows in one group."""
    if kind == "random":
        sizes = rng.multinomial(rows, np.ones(groups) / groups)
    elif kind == "skewed":
        sizes = rng.multinomial(rows, rng.dirichlet(np.full(groups, 0.1)))
    elif kind == "zeros":
        p = np.where(rng.random(groups) < 0.5, 0.0, 1.0)
        p[rng.integers(groups)] = 1.0
        sizes = rng.multinomial(rows, p / p.sum())
    elif kind == "underfull":
        sizes = rng.multinomial(int(rng.integers(0, rows)), np.ones(groups) / groups)
    elif kind == "one_group":
        sizes = np.zeros(groups, np.int64)
        sizes[rng.integers(groups)] = rows
    else:
        raise ValueError(kind)
    return sizes.astype(np.int32)


def row_groups(sizes, rows: int) -> np.ndarray:
    """Group of each row, -1 for rows past the sum."""
    gid = np.full(rows, -1, np.int64)
    gid[: int(np.sum(sizes))] = np.repeat(np.arange(len(sizes)), sizes)
    return gid


def grouped_gemm_reference(lhs, rhs, sizes, ragged="m", transpose_rhs=False) -> np.ndarray:
    lhs, rhs = np.asarray(lhs, np.float64), np.asarray(rhs, np.float64)
    off = np.concatenate([[0], np.cumsum(sizes)])
    if ragged == "k":
        return np.stack([lhs[off[g] : off[g + 1]].T @ rhs[off[g] : off[g + 1]] for g in range(len(sizes))])
    w = np.swapaxes(rhs, 1, 2) if transpose_rhs else rhs
    out = np.zeros((lhs.shape[0], w.shape[2]))
    for g in range(len(sizes)):
        out[off[g] : off[g + 1]] = lhs[off[g] : off[g + 1]] @ w[g]
    return out


def mlp_reference(x, sizes, w_fc1, w_fc2, norm_scale=None, norm_bias=None, *, norm="rmsnorm", eps=1e-6, activation="swiglu"):
    """GroupedLayerNormMLP in float64 jnp ops (differentiable): a dense per-row gather of weights."""
    f64 = jnp.float64
    x = x.astype(f64)
    if norm is not None:
        if norm == "layernorm":
            x_c = x - x.mean(-1, keepdims=True)
        else:
            x_c = x
        y = x_c / jnp.sqrt((x_c * x_c).mean(-1, keepdims=True) + eps)
        if norm_scale is not None:
            y = y * norm_scale.astype(f64)
        if norm_bias is not None:
            y = y + norm_bias.astype(f64)
    else:
        y = x
    gid = row_groups(np.asarray(sizes), x.shape[0])
    live = jnp.asarray(gid >= 0)[:, None]
    idx = np.maximum(gid, 0)
    h = jnp.einsum("mh,mhf->mf", y, w_fc1.astype(f64)[idx])
    silu = lambda v: v / (1 + jnp.exp(-v))
    gelu = lambda v: 0.5 * v * (1 + jnp.tanh(np.sqrt(2 / np.pi) * (v + 0.044715 * v**3)))
    if activation in ("swiglu", "geglu"):
        gate, lin = jnp.split(h, 2, axis=-1)
        a = (silu(gate) if activation == "swiglu" else gelu(gate)) * lin
    else:
        a = {"silu": silu, "gelu": gelu, "relu": lambda v: jnp.maximum(v, 0)}[activation](h)
    out = jnp.einsum("mf,mfh->mh", a, w_fc2.astype(f64)[idx])
    return jnp.where(live, out, 0.0)


def rel_error(out, ref) -> float:
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    assert np.all(np.isfinite(out)), "non-finite values in the output"
    return float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30))
