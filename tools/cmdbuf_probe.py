"""Which ops XLA puts in command buffers for a device-mode grouped_mlp step: prints, per
computation of the compiled HLO, the custom-call targets and fusions it holds. GPU only.
With XLA's thunk-level command buffers (--xla_gpu_experimental_enable_command_buffer_on_thunks,
default on in recent XLA) the HLO shows none; add --xla_dump_to=DIR and read the thunk dump.

    python3 -P tools/cmdbuf_probe.py     (set XLA_FLAGS to compare command-buffer settings)
"""

import os
import re

import jax
import jax.numpy as jnp

import te_async

rows, groups, hidden, ffn = 24, 64, 256, 128
gs = jnp.zeros(groups, jnp.int32).at[:rows].set(1)
x = jnp.ones((rows, hidden), jnp.bfloat16)
w1 = jnp.ones((groups, hidden, 2 * ffn), jnp.bfloat16)
w2 = jnp.ones((groups, ffn, hidden), jnp.bfloat16)
f = jax.jit(lambda x, w1, w2, gs: jnp.tanh(te_async.grouped_mlp(x * 2, gs, w1, w2, group_sizes_mode="device")) + 1)
text = f.lower(x, w1, w2, gs).compile().as_text()
print("XLA_FLAGS:", os.environ.get("XLA_FLAGS", ""))
current = None
for line in text.splitlines():
    head = re.match(r"^(?:ENTRY )?%?([\w.\-]+) ", line)
    if head and line.rstrip().endswith("{"):
        current = head.group(1)
        print("computation", current)
    for what in re.findall(r'custom_call_target="([\w\-.]+)"|(command_buffer[\w.]*)|calls=%?(fused[\w.\-]*)', line):
        item = next(w for w in what if w)
        print("   ", item)
