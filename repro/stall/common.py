"""Shared harness for the GroupedLinear stall reproductions.

The seed report (TE 1.13 + Megatron-core r0.10, 8xH800) shows a module NVTX
range of ~206 ms whose inner ``nvte_multi_stream_cublas_gemm`` range starts
~206 ms late and lasts only 0.39 ms.  TE and Megatron are not available on the
GPU machine, so ``GroupedLinear`` below rebuilds the host-side shape of TE
1.13's forward in plain PyTorch:

* ``torch.split`` of the input by a host list ``m_splits`` and a
  ``torch.empty`` output (grouped_linear.py, _GroupedLinear.forward);
* one GEMM per non-empty expert, round-robin over 4 high-priority side
  streams, forked from and joined back to the current stream with events
  (cublaslt_gemm.cu, nvte_multi_stream_cublas_gemm, ``num_streams = 4``).

Every call is timed on the host at three points so that each mechanism can be
judged against the seed's signature:

* ``module_ms``           -- whole module range (TERowParallelGroupedLinear forward)
* ``gemm_start_delay_ms`` -- module start -> start of the GEMM-launch range
* ``gemm_launch_ms``      -- the GEMM-launch range (nvte_multi_stream_cublas_gemm)
* ``gemm_gpu_ms``         -- GPU time of the GEMMs, from CUDA events

Scripts write ``$OUT/mech_<name>.json`` (OUT defaults to ./out).
"""
import copy
import json
import os
import platform
import statistics
import sys
import time
import traceback

import torch

OUT = os.environ.get("OUT", "./out")

# DeepSeek-V2-Lite MoE, as in the seed's micro-benchmark (EP=1: 64 local experts).
HIDDEN, FFN, EXPERTS, TOPK, SEQ = 2048, 1408, 64, 6, 4096
TOKENS = SEQ * TOPK  # 24576 routed rows, 384 per expert when balanced
SHAPES = {"fc1": (2 * FFN, HIDDEN), "fc2": (HIDDEN, FFN)}  # (out_features N, in_features K)
NUM_STREAMS = 4  # transformer_engine::num_streams in TE 1.13 (gemm.h)
MODULE_RANGE = "TERowParallelGroupedLinear forward"
GEMM_RANGE = "nvte_multi_stream_cublas_gemm"

_PROFILING = False  # when True, ranges also appear in torch.profiler traces


def now_ms():
    return time.perf_counter_ns() / 1e6


class _Range:
    """NVTX range (seen by nsys) plus, while profiling, a record_function range."""

    def __init__(self, name):
        self.name = name
        self.rf = None

    def __enter__(self):
        try:
            torch.cuda.nvtx.range_push(self.name)
        except Exception:
            pass
        if _PROFILING:
            self.rf = torch.profiler.record_function(self.name)
            self.rf.__enter__()
        return self

    def __exit__(self, *exc):
        if self.rf is not None:
            self.rf.__exit__(*exc)
        try:
            torch.cuda.nvtx.range_pop()
        except Exception:
            pass
        return False


def set_profiling(flag):
    global _PROFILING
    _PROFILING = bool(flag)


def even_splits(total=TOKENS, groups=EXPERTS):
    base, rem = divmod(total, groups)
    return [base + (1 if i < rem else 0) for i in range(groups)]


def random_splits(total, rng, groups=EXPERTS, skew=1.0):
    """Imbalanced routing: the sizes a dropless MoE hands to the experts."""
    w = [rng.random() ** skew + 1e-3 for _ in range(groups)]
    s = sum(w)
    sizes = [int(total * x / s) for x in w]
    sizes[0] += total - sum(sizes)
    return sizes


class GroupedLinear:
    """Per-expert GEMM loop over 4 side streams, shaped like TE 1.13 GroupedLinear."""

    def __init__(self, which="fc2", streams=None, dtype=torch.bfloat16):
        self.n, self.k = SHAPES[which]
        self.which = which
        self.w = torch.randn(EXPERTS, self.n, self.k, device="cuda", dtype=dtype) * 0.02
        self.weights = list(self.w.unbind(0))
        self.streams = streams or [torch.cuda.Stream(priority=-1) for _ in range(NUM_STREAMS)]
        self.fork = torch.cuda.Event()
        self.joins = [torch.cuda.Event() for _ in self.streams]
        self.workspace = None

    def with_streams(self, streams):
        """Same weights, different side streams (first use of fresh streams)."""
        twin = copy.copy(self)
        twin.streams = streams
        twin.fork = torch.cuda.Event()
        twin.joins = [torch.cuda.Event() for _ in streams]
        return twin

    def forward(self, x, m_splits, pre_gemm=None, pre_kernels=False, te_workspace=False):
        """One module call.

        m_splits     -- list of ints, or a callable returning one (called inside the
                        module range, where a device->host read would sit).
        pre_gemm     -- callable run inside the module range before the GEMM launches:
                        the injection point for allocator / GC / other host work.
        pre_kernels  -- launch one small kernel per expert on the current stream before
                        the GEMMs, as TE's FP8 path does (cast / cast-transpose).
        te_workspace -- allocate 4 x 32 MiB cuBLAS workspaces on first use, before the
                        GEMM range, as get_multi_stream_cublas_workspace() does.
        Returns (out, rec); rec['gemm_gpu_ms'] is filled by finish().
        """
        main = torch.cuda.current_stream()
        rec = {}
        with _Range(MODULE_RANGE):
            t0 = now_ms()
            if pre_gemm is not None:
                pre_gemm()
            if callable(m_splits):
                m_splits = m_splits()
            if te_workspace and self.workspace is None:
                self.workspace = [torch.empty(32 << 20, dtype=torch.uint8, device="cuda")
                                  for _ in range(NUM_STREAMS)]
            xs = torch.split(x, m_splits)
            out = torch.empty(sum(m_splits), self.n, device=x.device, dtype=x.dtype)
            outs = torch.split(out, m_splits)
            if pre_kernels:
                xs = [xi * 1.0 for xi in xs]
            t1 = now_ms()
            with _Range(GEMM_RANGE):
                ev0 = torch.cuda.Event(enable_timing=True)
                ev1 = torch.cuda.Event(enable_timing=True)
                ev0.record(main)
                self.fork.record(main)
                used = min(len(self.streams), len(m_splits))
                for s in self.streams[:used]:
                    s.wait_event(self.fork)
                for i, rows in enumerate(m_splits):
                    if rows == 0:  # TE skips empty groups (te_grouped_gemm, gemm.cpp)
                        continue
                    with torch.cuda.stream(self.streams[i % used]):
                        torch.mm(xs[i], self.weights[i].t(), out=outs[i])
                for s, ev in zip(self.streams[:used], self.joins):
                    ev.record(s)
                    main.wait_event(ev)
                ev1.record(main)
                t2 = now_ms()
            t3 = now_ms()
        rec.update(module_ms=t3 - t0, gemm_start_delay_ms=t1 - t0,
                   gemm_launch_ms=t2 - t1, _ev=(ev0, ev1), _keep=(xs, outs))
        return out, rec


def finish(recs):
    """After a synchronize: turn the CUDA events into GPU milliseconds."""
    for r in recs:
        ev = r.pop("_ev", None)
        r.pop("_keep", None)
        if ev is not None:
            r["gemm_gpu_ms"] = ev[0].elapsed_time(ev[1])
    return recs


def summarize(recs, extra=None):
    keys = ("module_ms", "gemm_start_delay_ms", "gemm_launch_ms", "gemm_gpu_ms")
    s = {"n": len(recs)}
    for k in keys:
        v = [r[k] for r in recs if k in r]
        if v:
            s[k + "_median"] = round(statistics.median(v), 3)
            s[k + "_max"] = round(max(v), 3)
    if extra:
        s.update(extra)
    return s


def row(variant, summary, extra=""):
    """One line of run_all's markdown table."""
    return {"variant": variant,
            "module_ms_max": summary.get("module_ms_max"),
            "gemm_start_delay_ms_max": summary.get("gemm_start_delay_ms_max"),
            "gemm_launch_ms_max": summary.get("gemm_launch_ms_max"),
            "gemm_gpu_ms_median": summary.get("gemm_gpu_ms_median"),
            "extra": extra}


class SleepCalib:
    """torch.cuda._sleep spins for clock cycles; convert to milliseconds once."""

    def __init__(self):
        torch.cuda._sleep(1000)
        torch.cuda.synchronize()
        cycles = 20_000_000
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        torch.cuda._sleep(cycles)
        b.record()
        b.synchronize()
        self.cycles_per_ms = cycles / max(a.elapsed_time(b), 1e-3)

    def sleep(self, ms):
        """Queue ~ms of GPU busy time on the current stream; returns at once."""
        torch.cuda._sleep(int(ms * self.cycles_per_ms))


def env_info():
    info = {"python": platform.python_version(), "torch": torch.__version__,
            "cuda_runtime": torch.version.cuda,
            "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
            "CUDA_MODULE_LOADING": os.environ.get("CUDA_MODULE_LOADING"),
            "CUDA_DEVICE_MAX_CONNECTIONS": os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS")}
    try:
        p = torch.cuda.get_device_properties(0)
        info.update(device=p.name, sm_count=p.multi_processor_count,
                    total_memory_gib=round(p.total_memory / 2**30, 1))
    except Exception as e:  # no GPU: still record why
        info["device_error"] = repr(e)
    return info


def guarded(results, name, fn):
    """Run one variant; record its error instead of losing the whole script."""
    try:
        results[name] = fn()
    except Exception as e:
        results[name] = {"error": repr(e), "traceback": traceback.format_exc()[-2000:]}
    return results[name]


def write_result(name, payload):
    os.makedirs(OUT, exist_ok=True)
    payload.setdefault("env", env_info())
    path = os.path.join(OUT, "mech_%s.json" % name)
    with open(path, "w") as f:
        json.dump(payload, f, indent=1, default=str)
    print("wrote", path)
    return path


def warmup(gl, x, m_splits, n=3):
    for _ in range(n):
        gl.forward(x, m_splits)
    torch.cuda.synchronize()


def run_child(script, args, env_updates, timeout):
    """Run a variant that needs a fresh process (allocator config, module loading).

    The child prints one line 'RESULT_JSON: {...}'; that dict is returned, or an
    error dict with the output tail when the child fails or times out."""
    import subprocess
    env = dict(os.environ)
    for k, v in env_updates.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    cmd = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), script)]
    t0 = time.time()
    try:
        p = subprocess.run(cmd + list(args), env=env, capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired as e:
        tail = (e.stdout or "")[-1500:] if isinstance(e.stdout, str) else ""
        return {"error": "timeout after %ss" % timeout, "output_tail": tail}
    for line in reversed(p.stdout.splitlines()):
        if line.startswith("RESULT_JSON: "):
            res = json.loads(line[len("RESULT_JSON: "):])
            res["child_seconds"] = round(time.time() - t0, 1)
            return res
    return {"error": "child rc=%s without result" % p.returncode,
            "output_tail": (p.stdout + p.stderr)[-1500:]}


def child_print(result):
    print("RESULT_JSON: " + json.dumps(result, default=str))
