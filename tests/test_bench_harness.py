"""The GEMM benchmarks' layer stacks and contenders, at tiny shapes on whatever backend runs: every
mode computes what it claims, so that a timing never comes from a wrong or empty computation."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from te_async.bench import __main__ as cli
from te_async import dense, models, token_ffn
from te_async.bench import attention as attention_bench, decode_gemm, dense as dense_bench, prefill, presets, train
from te_async.bench import timing, train_model

from reference import grouped_gemm_reference, mlp_reference, random_group_sizes, rel_error

LAYERS, EXPERTS, HIDDEN, FFN, ROWS = 2, 64, 16, 8, 12


def _stack_inputs(rng):
    f32 = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.float32)
    sizes = np.stack([random_group_sizes(rng, EXPERTS, ROWS, "zeros") for _ in range(LAYERS)])
    return f32(LAYERS, EXPERTS, HIDDEN, 2 * FFN), f32(LAYERS, EXPERTS, FFN, HIDDEN), f32(LAYERS, ROWS, HIDDEN), \
        f32(LAYERS, ROWS, FFN), jnp.asarray(sizes)


@pytest.mark.parametrize("unroll", [False, True])
def test_decode_gemm_modes_compute_their_layers(rng, unroll):
    w1, w2, x, h, gs = args = _stack_inputs(rng)
    active = decode_gemm.mean_active_experts([args])
    experts = decode_gemm.read_experts(active)
    assert experts == max(1, round(np.count_nonzero(np.asarray(gs)) / LAYERS))
    y1, y2 = decode_gemm.layer_stack("device", active, unroll)(*args)
    read = decode_gemm.layer_stack("read", active, unroll)(*args)
    with jax.default_matmul_precision("highest"):  # no TF32 on a GPU
        dense = decode_gemm.layer_stack("dense", active, unroll)(*args)
    rows = ROWS // experts
    for i in range(LAYERS):
        sizes = np.asarray(gs[i])
        np.testing.assert_allclose(y1[i], grouped_gemm_reference(x[i], w1[i], sizes), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(y2[i], grouped_gemm_reference(h[i], w2[i], sizes), rtol=1e-4, atol=1e-4)
        w1_e, w2_e = np.asarray(w1[i, :experts], np.float64), np.asarray(w2[i, :experts], np.float64)
        np.testing.assert_allclose(read[0][i], w1_e.sum(-1), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(read[1][i], w2_e.sum(-1), rtol=1e-4, atol=1e-4)
        x_e = np.asarray(x[i, : experts * rows], np.float64).reshape(experts, rows, HIDDEN)
        np.testing.assert_allclose(dense[0][i], np.einsum("erk,ekn->ern", x_e, w1_e), rtol=1e-4, atol=1e-4)


def test_decode_gemm_mlp_mode_matches_scan_and_unrolled(rng):
    args = _stack_inputs(rng)
    active = decode_gemm.mean_active_experts([args])
    scanned, unrolled = (decode_gemm.layer_stack("mlp", active, u)(*args) for u in (False, True))
    assert scanned.shape == (LAYERS, ROWS, HIDDEN)
    np.testing.assert_allclose(scanned, unrolled, rtol=1e-5, atol=1e-5)
    assert float(jnp.abs(scanned[:, : int(np.asarray(args[-1][0]).sum())]).max()) > 0


@pytest.mark.parametrize("gemm", list(prefill.GEMMS))
def test_prefill_contenders_agree_with_reference(rng, gemm):
    form, _, _ = prefill.GEMMS[gemm]
    k, n, rows = 16, 24, 40
    sizes = random_group_sizes(rng, prefill.EXPERTS, rows, "skewed")
    lhs = jnp.asarray(rng.standard_normal((rows, k)), jnp.float32)
    rhs = prefill.make_rhs(form, k, n, rows, jax.random.key(int(rng.integers(1 << 30))), jnp.float32)
    assert rhs.shape == {"m": (prefill.EXPERTS, k, n), "mT": (prefill.EXPERTS, n, k), "k": (rows, n)}[form]
    want = grouped_gemm_reference(lhs, rhs, sizes, **prefill.FORMS[form])
    fns = prefill.contenders(form, k, n)
    assert "dense_same_flops" in fns and ("xla_ragged_dot" in fns) == (form != "k")
    for name, fn in fns.items():
        if name.startswith("te_async") or name == "xla_ragged_dot":
            with jax.default_matmul_precision("highest"):  # no TF32 on a GPU
                got = fn(lhs, rhs, jnp.asarray(sizes))
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=name)


@pytest.mark.parametrize("per_layer", [False, True], ids=["shared_sizes", "sizes_per_layer"])
@pytest.mark.parametrize("scan", [None, "lax", "te_async"], ids=["unrolled", "lax_scan", "te_async_scan"])
@pytest.mark.parametrize("contender", [train.REFERENCE, train.DROP_IN, "device", "async"])
def test_train_stack_matches_float64(rng, scan, contender, per_layer):
    """bench train's timed step: x + mlp(x) per layer, forward and every gradient, unrolled or as a
    scan (jax.lax.scan or te_async.scan) over stacked weights, with one size vector or one per
    layer, against the float64 reference's jax.vjp."""
    per = [random_group_sizes(rng, EXPERTS, ROWS, kind) for kind in ("zeros", "skewed", "random")[:LAYERS]]
    layer_sizes = per if per_layer else [per[0]] * LAYERS
    sizes = np.stack(per) if per_layer else per[0]
    f32 = lambda *shape: jnp.asarray(rng.standard_normal(shape) / np.sqrt(shape[-2] if len(shape) > 2 else 1), jnp.float32)
    layers = [(f32(EXPERTS, HIDDEN, 2 * FFN), f32(EXPERTS, FFN, HIDDEN), 1 + 0.1 * f32(HIDDEN)) for _ in range(LAYERS)]
    x, dy = f32(ROWS, HIDDEN), f32(ROWS, HIDDEN)
    weights = tuple(jnp.stack(w) for w in zip(*layers)) if scan else layers
    with jax.default_matmul_precision("highest"):  # no TF32 on a GPU
        y, (dx, d_weights) = train.forward_backward(contender, scan)(x, jnp.asarray(sizes), weights, dy)

    def reference(x_, layers_):
        for (w1, w2, scale), s in zip(layers_, layer_sizes):
            x_ = x_ + mlp_reference(x_, s, w1, w2, scale, eps=train.EPS)
        return x_

    y_ref, pull = jax.vjp(reference, x.astype(jnp.float64), [tuple(w.astype(jnp.float64) for w in l) for l in layers])
    dx_ref, d_layers_ref = pull(dy.astype(jnp.float64))
    d_ref = tuple(jnp.stack(g) for g in zip(*d_layers_ref)) if scan else d_layers_ref
    for got, want in zip([y, dx, *jax.tree.leaves(d_weights)], [y_ref, dx_ref, *jax.tree.leaves(d_ref)]):
        assert got.shape == want.shape and rel_error(got, want) < 1e-4


@pytest.mark.parametrize("argv,message", [(["decode-gemm", "--modes", "reed"], "invalid choice"),
                                          (["decode", "--unroll", "sometimes"], "invalid choice"),
                                          (["prefill", "--gemms", "fc3"], "invalid choice"),
                                          (["dense", "--rows", "0"], "must be a positive integer"),
                                          (["dense", "--layers", "-2"], "must be a positive integer"),
                                          (["train", "--depth", "0"], "must be a positive integer"),
                                          (["train", "--contenders", "torch"], "invalid choice"),
                                          (["train", "--scan", "flax"], "invalid choice"),
                                          (["train-model", "--layers", "0"], "must be a positive integer"),
                                          (["train-model", "--contenders", "xla"], "invalid choice")])
def test_unknown_mode_or_gemm_is_refused_before_any_work(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as e:
        cli.main([*argv, "--out", str(tmp_path)])
    assert e.value.code == 2 and message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


# Contenders against the first, bf16: XLA's CPU dots keep float32 where a GPU's kernels round to
# bf16 at other points (an H200 gave 4e-3 on the gradients, 2.4e-6 on the loss).
LOSS_TOL, GRAD_TOL = (1e-6, 1e-5) if jax.default_backend() == "cpu" else (1e-4, 2e-2)


def test_train_bench_runs_each_contender_under_each_scan(tmp_path):
    """bench train --scan lax te_async: every contender under both scans in one run, the reference
    once (under the first), and both scans' gradients the reference's."""
    cli.main(["train", "--preset", "tiny", "--scan", "lax", "te_async", "--contenders", train.REFERENCE, "device",
              "--depth", "2", "--reps", "2", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "train.json").read_text())
    assert result["scan"] == ["lax", "te_async"]
    for split in ("even", "skewed"):
        rows = [r for r in result["results"] if r["split"] == split]
        assert [(r["scan"], r["contender"]) for r in rows] == [("lax", train.REFERENCE), ("lax", "device"),
                                                               ("te_async", "device")]
        for r in rows[1:]:
            assert "error" not in r and r["rel_error_vs_ragged_dot"] < GRAD_TOL and r["slope_ms"] is not None
    assert "| device, te_async.scan |" in (tmp_path / "train.md").read_text()


@pytest.mark.parametrize("remat", [False, True])
def test_train_model_step_is_next_token_cross_entropy(rng, remat):
    """bench train-model's step: the loss is the float64 next-token cross-entropy of the model's
    logits, and every parameter gets a gradient (with and without --remat)."""
    config = presets.config("tiny", num_hidden_layers=2)
    params = models.init_params(config, jax.random.key(3), jnp.float32)
    tokens = jnp.asarray(rng.integers(0, config.vocab_size, (2, 9)), jnp.int32)
    loss, grads = train_model.train_step(config, "device", remat)(params, tokens)
    logits = np.asarray(models.forward(params, config, tokens[:, :-1]), np.float64)
    targets = np.asarray(tokens[:, 1:])
    top = logits.max(-1)
    lse = top + np.log(np.exp(logits - top[..., None]).sum(-1))
    want = np.mean(lse - np.take_along_axis(logits, targets[..., None], -1)[..., 0])
    assert abs(float(loss) - want) < 1e-6 * abs(want)
    assert all(float(jnp.max(jnp.abs(g))) > 0 for g in jax.tree.leaves(grads))


def test_train_model_bench_runs_checks_and_slopes(tmp_path):
    """bench train-model: every contender at both depths, checked against the first, deterministic,
    TFLOP/s the model FLOPs over the step's time, and the slope between the depths."""
    cli.main(["train-model", "--preset", "tiny", "--layers", "1", "2", "--seq", "16", "--batch", "2",
              "--contenders", "device", "ragged_dot", "--reps", "1", "--profile", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "train-model.json").read_text())
    rows = result["results"]
    assert [(r["layers"], r["contender"]) for r in rows] == [(1, "device"), (1, "ragged_dot"), (2, "device"),
                                                             (2, "ragged_dot")]
    for r in rows:
        assert "error" not in r and r["deterministic"] and r["tokens"] == 32
        flops = models.train_flops(presets.config("tiny", num_hidden_layers=r["layers"]), 2, 16)
        assert r["model_flops"] == flops and r["tflops"] == pytest.approx(flops / r["median_ms"] * 1e-9)
    for r in rows[1::2]:
        assert r["loss_rel_error"] < LOSS_TOL and r["grad_rel_error"] < GRAD_TOL
    for shallow, deep in zip(rows[:2], rows[2:]):  # a second layer's residuals
        assert 0 < shallow["temp_gb"] < deep["temp_gb"], (shallow, deep)
    assert set(result["slopes"]) == {"device", "ragged_dot"}
    profiled = [r for r in rows if "idle_fraction" in r]  # the deepest model's, one profiled step each
    assert [r["layers"] for r in profiled] == [2, 2] and (jax.default_backend() == "gpu") == all(
        r["idle_fraction"] is not None for r in profiled)
    assert "| ragged_dot |" in (tmp_path / "train_model.md").read_text()


def test_dense_bench_contenders_agree_and_cover_the_layer(rng):
    """bench dense: every dense weight of an MoE layer (and the LM head) is timed, and both kernels
    (XLA's alone for the LM head's transposed weight) compute the GEMM of each weight copy as
    float64 does."""
    config = presets.config("tiny")
    cases = dense_bench.gemms(config)
    attn = {f"attn.{k}" for k, s in models.param_shapes(config)["layers"][1]["attn"].items() if len(s.shape) == 3}
    assert set(cases) == attn | {"router", "lm_head", "shared.w_gate_up", "shared.w_down"}
    for name, (k, n, transpose) in cases.items():
        w = rng.standard_normal((2, n, k) if transpose else (2, k, n))
        x = rng.standard_normal((2, k))
        want = np.einsum("rk,lnk->lrn" if transpose else "rk,lkn->lrn", x, w)
        for kernel in ("xla",) if transpose else [k for k in dense_bench.KERNELS if k in dense.KERNELS]:
            fn = dense_bench._unrolled(lambda x, w, kernel=kernel: dense.linear(x, w, transpose_w=transpose, kernel=kernel))
            got = fn(jnp.asarray(x, jnp.float32), [(jnp.asarray(c, jnp.float32),) for c in w])
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"{name} {kernel}")


def test_dense_bench_shared_mlp_contenders_agree(rng):
    """bench dense's shared-MLP row: every contender (token_ffn at one row only) computes the SwiGLU
    MLP of each weight copy as float64 does, fc1's output and the activation rounded to bfloat16."""
    hidden, ffn = 64, 24
    w1 = rng.standard_normal((2, hidden, 2 * ffn)) / np.sqrt(hidden)
    w2 = rng.standard_normal((2, ffn, hidden)) / np.sqrt(ffn)
    bf16 = lambda a: jnp.asarray(a, jnp.bfloat16)
    rnd = lambda a: np.asarray(bf16(a), np.float64)
    for rows in (1, 2):
        x = rnd(rng.standard_normal((rows, hidden)))
        h = rnd(x @ rnd(w1))
        gate, lin = np.split(h, 2, axis=-1)
        want = rnd(gate / (1 + np.exp(-gate)) * lin) @ rnd(w2)
        for kernel in dense_bench.KERNELS:
            fn = dense_bench._shared_mlp(kernel, rows, hidden)
            if fn is None:
                assert kernel == "token_ffn" and rows > 1
                continue
            got = np.asarray(dense_bench._unrolled(fn)(bf16(x), [(bf16(a), bf16(b)) for a, b in zip(w1, w2)]), np.float64)
            assert np.abs(got - want).max() < 2e-2 * np.abs(want).max(), (kernel, rows)
    assert dense_bench._shared_mlp("token_ffn", 1, token_ffn.MAX_HIDDEN + 8) is None  # DeepSeek-V3's 7168: past the kernel


@pytest.mark.parametrize("preset", ["tiny", "qwen3-30b-a3b"])
def test_attention_bench_scans_every_layer_of_the_stack(preset):
    """bench attention: the scanned call attends over each stacked layer in turn (as float64
    does), and the floor counts each cached key, rope key and value once."""
    shape = attention_bench.heads(presets.config(preset))
    assert (shape["dv"] is None) == (preset == "tiny")  # tiny is DeepSeek-shaped: MLA
    layers, batch, context = 3, 2, 40
    q, keys, values, q_rope, key_rope = ops = attention_bench.operands(shape, batch, context, layers, jax.random.key(1))
    got = np.asarray(attention_bench.scanned("xla", 0.1, context - 1, layers)(*ops), np.float64)
    f64 = lambda x: None if x is None else np.asarray(x, np.float64)
    for layer in range(layers):
        k = f64(keys)[layer]
        v = k if values is None else f64(values)[layer]
        group = shape["heads"] // shape["kv_heads"]
        for h in range(shape["heads"]):
            s = np.einsum("bd,bnd->bn", f64(q)[:, 0, h], k[:, :, h // group])
            if q_rope is not None:
                s += np.einsum("bd,bnd->bn", f64(q_rope)[:, 0, h], f64(key_rope)[layer][:, :, h // group])
            p = np.exp(0.1 * s - (0.1 * s).max(-1, keepdims=True))
            want = np.einsum("bn,bnd->bd", p / p.sum(-1, keepdims=True), v[:, :, h // group])
            np.testing.assert_allclose(got[layer, :, 0, h], want, rtol=3e-2, atol=3e-2)
    per_token = shape["dk"] + shape["dr"] + (shape["dv"] or 0)
    assert attention_bench.cache_bytes(shape, batch, context) == batch * context * shape["kv_heads"] * per_token * 2


def test_attention_bench_scans_the_absorbed_mla_over_every_layer():
    """bench attention, MLA: the scanned call is the whole absorbed attention of each stacked layer
    in turn, against the float64 expanded attention of test_mla_decode."""
    from test_mla_decode import numpy_mla
    shape = attention_bench.heads(presets.config("tiny"))
    layers, batch, context = 3, 2, 40
    ops = attention_bench.mla_operands(shape, batch, context, layers, jax.random.key(1))
    got = np.asarray(attention_bench.mla_scanned("xla", 0.1, context - 1, layers)(*ops), np.float64)
    for layer in range(layers):
        want = numpy_mla(*ops, context - 1, layer, 0.1, None)
        np.testing.assert_allclose(got[layer], want, rtol=3e-2, atol=3e-2 * np.abs(want).max())


def test_attention_bench_runs_on_this_backend(tmp_path):
    cli.main(["attention", "--preset", "tiny", "--batches", "1", "--context", "32", "--reps", "2", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "attention.json").read_text())
    assert [r["batch"] for r in result["results"]] == [1]
    row = result["results"][0]
    assert row["xla_us"] > 0 and row["floor_us"] > 0
    gpu = jax.default_backend() == "gpu"
    assert (row["xla_gpu_us"] > 0) if gpu else row["xla_gpu_us"] is None  # no kernels in a CPU profile
    assert f"| 1 | {row['floor_us']:.2f} | {row['xla_us']:.2f} (" in (tmp_path / "attention.md").read_text()


def test_read_bench_gives_each_size_against_the_largest(tmp_path):
    cli.main(["read", "--mb", "4", "0.5", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "read.json").read_text())
    rows = result["results"]
    assert [r["mb"] for r in rows] == [0.5, 4] and result["floor_mb"] == 4
    for r in rows:  # time = bytes / bandwidth; over the floor = the largest's bandwidth / this one's
        assert r["us"] > 0 and r["us"] == pytest.approx(r["mb"] / r["tb_s"])
        assert r["over_floor"] == pytest.approx(rows[-1]["tb_s"] / r["tb_s"])
    assert rows[-1]["over_floor"] == 1
    assert f"| 0.5 | {rows[0]['us']:.2f} | {rows[0]['tb_s']:.3f} | {rows[0]['over_floor']:.2f}x |" in \
        (tmp_path / "read.md").read_text()


@pytest.mark.parametrize("gib,copies", [(2 / 1024, 128), (0.1, 3), (0.3, 1)])
def test_read_probe_reads_each_buffer_cold(monkeypatch, gib, copies):
    """A buffer under timing.COLD_BYTES is one of as many distinct copies as fill it, read in turn, so
    that no read finds the last one's bytes in L2; the bandwidth is the bytes of one over a read."""
    seen = []

    def fake_time(fn, inputs, **kw):
        seen.append(inputs)
        return 1e-3

    monkeypatch.setattr(timing, "device_time_s", fake_time)
    n = int(gib * 2**30) // 4
    assert timing.hbm_bandwidth(gib) == pytest.approx(4 * n / 1e-3)
    (inputs,) = seen
    assert len(inputs) == copies and len(inputs) * 4 * n >= min(timing.COLD_BYTES, 4 * n)
    firsts = [float(x[0]) for (x,) in inputs]
    assert len(set(firsts)) == copies and all(x.shape == (n,) for (x,) in inputs)  # distinct buffers


def test_prefill_bench_gives_three_rates(tmp_path):
    """Batches of 3 calls, a stream of STREAM_CALLS blocked on once, and GPU time where there is one."""
    cli.main(["prefill", "--preset", "tiny", "--gemms", "fc1", "--contenders", "te_async_device", "--reps", "3",
              "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "prefill.json").read_text())["results"]
    assert [(r["gemm"], r["split"]) for r in rows] == [("fc1", "even"), ("fc1", "skewed")]
    for r in rows:
        assert r["stream_tflops"] > 0 and r["stream_tflops"] == pytest.approx(
            2 * r["m"] * r["k"] * r["n"] / (r["stream_ms"] * 1e-3) / 1e12)
        assert (r["gpu_tflops"] is None) == (jax.default_backend() != "gpu")
    md = (tmp_path / "prefill.md").read_text()
    assert f"| te_async_device | {rows[0]['tflops']:.3g} / {rows[0]['stream_tflops']:.3g}" in md
    assert f"of a stream of {prefill.STREAM_CALLS} calls" in md


@pytest.mark.parametrize("mb", ["0", "-1", "inf"])
def test_read_bench_refuses_a_size_that_is_not_positive(tmp_path, capsys, mb):
    with pytest.raises(SystemExit):
        cli.main(["read", "--mb", mb, "--out", str(tmp_path)])
    assert "must be a positive number" in capsys.readouterr().err
    assert not (tmp_path / "read.json").exists()


def test_results_name_the_tree_that_ran(tmp_path, monkeypatch):
    """timing.source_commit: the tree id of the files as they are matches the commit's tree when
    nothing changed, and changes with a file (tracked or not), while HEAD stays; TE_ASYNC_COMMIT
    names the commit but not the tree."""
    import shutil
    import subprocess

    if shutil.which("git") is None:
        pytest.skip("no git here")
    git = lambda *a: subprocess.run(["git", "-C", str(tmp_path), *a], capture_output=True, text=True,
                                    check=True).stdout.strip()
    (tmp_path / "te_async" / "bench").mkdir(parents=True)
    (tmp_path / "te_async" / "bench" / "timing.py").write_text("# a te_async checkout\n")
    git("init", "-q")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TE_ASYNC_COMMIT", raising=False)
    clean = timing.source_commit()
    assert clean == {"commit": git("rev-parse", "HEAD"), "dirty": False, "tree": git("rev-parse", "HEAD^{tree}")}
    (tmp_path / "new.py").write_text("x = 1\n")
    changed = timing.source_commit()
    assert changed["commit"] == clean["commit"] and changed["dirty"] and changed["tree"] != clean["tree"]
    assert git("status", "--porcelain") == "?? new.py"  # the checkout's own index is untouched
    monkeypatch.setenv("TE_ASYNC_COMMIT", "abc1234")
    assert timing.source_commit() == {"commit": "abc1234", "dirty": None, "tree": changed["tree"]}


def test_chained_calls_feed_each_state_back_and_keep_the_callers_arrays():
    """timing.chained_calls: every call takes the previous call's state (a decode loop), and the
    caller's arrays survive the donation."""
    seen = []

    def step(c, state):
        jax.debug.callback(lambda v: seen.append(float(v[0])), state[1])
        return state[0] + 1, state[1] + c

    state = (jnp.int32(0), jnp.zeros(4, jnp.float32))
    assert timing.chained_calls(step, jnp.float32(1.0), state, steps=4, warmup=2) > 0
    jax.effects_barrier()
    assert seen == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    np.testing.assert_array_equal(state[1], np.zeros(4, np.float32))
