"""Scratch probe: DeepSeek-V2-Lite greedy decode steps (generate's loop, device mode) at each batch:
compiled HLO (and its big transposes), wall-clock p50 of blocked steps, optionally a perfetto trace."""
import functools, pathlib, re, sys, time
import jax, jax.numpy as jnp, numpy as np
from te_async import models
from te_async.bench import generate
from te_async.models.model import greedy_tokens, _greedy_step, _GreedyState

out = pathlib.Path(sys.argv[1]); tag = sys.argv[2]; trace = sys.argv[3] == "trace"; batches = [int(b) for b in sys.argv[4:]]
out.mkdir(parents=True, exist_ok=True)
params, config = generate.load_model("deepseek-v2-lite", dtype=jnp.bfloat16)
for batch in batches:
    cache, logits = generate.filled_cache(params, config, batch, 4096, 16)
    n = 120
    unroll = models.model.unrolls(batch)
    step = functools.partial(_greedy_step, params, config, group_sizes_mode="device", experts="te_async", unroll=unroll)
    tokens = jnp.zeros((batch, n + 1), jnp.int32).at[:, :1].set(greedy_tokens(logits))
    state = _GreedyState(cache, tokens, jnp.asarray(1, jnp.int32), jnp.asarray(4096 - n - 2, jnp.int32))
    del cache
    hlo = _greedy_step.lower(params, config, state, "device", "te_async", unroll).compile().as_text()
    (out / f"hlo_{tag}_B{batch}.txt").write_text(hlo)
    big = [l.strip()[:160] for l in hlo.splitlines() if re.search(r"= bf16\[\d+,\d+,\d+\]\S* (fusion|transpose|copy)\(", l) and "ENTRY" not in l and ("transpose" in l or "copy" in l)]
    times = []
    for i in range(100):
        t0 = time.perf_counter(); state = step(state); jax.block_until_ready(state); times.append(1e3 * (time.perf_counter() - t0))
    t = np.array(times[10:])
    print(f"{tag} B={batch} unroll={unroll} p50={np.median(t):.3f} ms min={t.min():.3f} p90={np.percentile(t, 90):.3f}; big transposes/copies: {len(big)}", flush=True)
    for l in big[:4]: print("   ", l, flush=True)
    if trace and batch == batches[0]:
        with jax.profiler.trace(str(out / f"trace_{tag}_B{batch}"), create_perfetto_trace=True):
            for i in range(6):
                with jax.profiler.StepTraceAnnotation("decode", step_num=i):
                    state = step(state); jax.block_until_ready(state)
    del state
