"""The token embedding lookup, with a deterministic float32 gradient.

JAX's derivative of table[ids] is a scatter-add of the rows' gradients into a zero table, which
XLA's GPU backend runs with atomic adds in the table's dtype: a token that appears n times gets
its n bf16 gradients added in no fixed order, rounded after every add. Here the backward sorts the
positions by token, sums each token's rows in float32 with a segmented scan (a fixed order), rounds
each sum once and writes it with a scatter that never adds (one row per token)."""

import functools

import jax
import jax.numpy as jnp

from ..manual_axes import vary_alike


def embed(table: jax.Array, tokens: jax.Array) -> jax.Array:
    """table [V, H], integer tokens [...] -> [..., H]; a token outside [0, V) gives a row of NaN
    (te_async.models rejects those before a call where it can see them)."""
    if table.ndim != 2 or not jnp.issubdtype(tokens.dtype, jnp.integer):
        raise ValueError(f"embed needs a table [V, H] and integer tokens, got table {table.shape} and tokens "
                         f"{tokens.dtype}")
    tokens = tokens.astype(jnp.int32)
    valid = (tokens >= 0) & (tokens < table.shape[0])
    rows = _take_rows(table.shape[0], *vary_alike(table, jnp.where(valid, tokens, 0)))
    return jnp.where(valid[..., None], rows, jnp.nan)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _take_rows(vocab, table, ids):
    return jnp.take(table, ids, axis=0)


def _take_rows_fwd(vocab, table, ids):
    return _take_rows(vocab, table, ids), ids


def _segment_sum(a, b):
    """The segmented-sum operator: (start flag, running sum); b's segment restarts at its flag."""
    (fa, va), (fb, vb) = a, b
    return fa | fb, jnp.where(fb[:, None], vb, va + vb)


def _take_rows_bwd(vocab, ids, g):
    ids, g = ids.reshape(-1), g.reshape(-1, g.shape[-1])
    order = jnp.argsort(ids, stable=True)
    sorted_ids = ids[order]
    differs = sorted_ids[1:] != sorted_ids[:-1]
    starts = jnp.concatenate([jnp.ones((1,), bool), differs])
    _, sums = jax.lax.associative_scan(_segment_sum, (starts, g[order].astype(jnp.float32)))
    last = jnp.concatenate([differs, jnp.ones((1,), bool)])  # a token's running sum is whole at its last row
    target = jnp.where(last, sorted_ids, vocab)  # vocab: out of range, dropped
    table_grad = jnp.zeros((vocab, g.shape[1]), g.dtype).at[target].set(sums.astype(g.dtype), mode="drop")
    return table_grad, None


_take_rows.defvjp(_take_rows_fwd, _take_rows_bwd)
