"""Run every stall reproduction, each in its own process, within ~4 minutes.

    OUT=/some/dir python repro/stall/run_all.py

Each script writes $OUT/mech_<name>.json; this collects them, with return
codes and output tails, into $OUT/stall_results.json and prints one markdown
table (maxima over the calls of a variant, GPU time as a median).  A script
that fails or times out is recorded as such and the others still run: the
mechanisms are independent.  Separate processes keep one mechanism's allocator
and GC state out of the next one's numbers.
"""
import json
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.environ.get("OUT", "./out")
BUDGET_S = 235
SCRIPTS = [  # (name, script, timeout seconds)
    ("baseline", "baseline.py", 45),
    ("i_d2h", "mech_i_d2h.py", 45),
    ("ii_alloc", "mech_ii_alloc.py", 100),
    ("iii_gc", "mech_iii_gc.py", 60),
    ("iv_launchq", "mech_iv_launchq.py", 40),
    ("v_firstcall", "mech_v_firstcall.py", 130),
]
COLS = ("variant", "module_ms_max", "gemm_start_delay_ms_max", "gemm_launch_ms_max",
        "gemm_gpu_ms_median", "extra")


def fmt(v):
    if v is None:
        return ""
    if isinstance(v, float):
        return "%.3f" % v if v < 10 else "%.1f" % v
    return str(v).replace("|", "/")


def main():
    os.makedirs(OUT, exist_ok=True)
    env = dict(os.environ, OUT=os.path.abspath(OUT), PYTHONUNBUFFERED="1")
    start = time.time()
    report = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "results": {}}
    for name, script, timeout in SCRIPTS:
        left = BUDGET_S - (time.time() - start)
        entry = {"script": script}
        if left < 10:
            entry["skipped"] = "time budget used up"
            report["results"][name] = entry
            continue
        t0 = time.time()
        # Own process group, so a timeout also ends the script's own child processes.
        p = subprocess.Popen([sys.executable, os.path.join(HERE, script)], env=env, cwd=HERE,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
        try:
            out, _ = p.communicate(timeout=min(timeout, left - 5))
            entry.update(rc=p.returncode)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, _ = p.communicate()
            entry.update(rc=None, timed_out=True)
        entry["output_tail"] = (out or "")[-3000:]
        entry["seconds"] = round(time.time() - t0, 1)
        path = os.path.join(OUT, "mech_%s.json" % name)
        if os.path.exists(path) and os.path.getmtime(path) >= t0:
            with open(path) as f:
                entry["result"] = json.load(f)
        report["results"][name] = entry
        print("%-12s rc=%s %5.1fs" % (name, entry.get("rc"), entry["seconds"]), flush=True)
    report["total_seconds"] = round(time.time() - start, 1)
    with open(os.path.join(OUT, "stall_results.json"), "w") as f:
        json.dump(report, f, indent=1, default=str)

    print("\n| mechanism | " + " | ".join(COLS) + " |")
    print("|" + "---|" * (len(COLS) + 1))
    for name, entry in report["results"].items():
        res = entry.get("result")
        if not res:
            why = entry.get("skipped") or ("timed out" if entry.get("timed_out") else
                                           "rc=%s, no result" % entry.get("rc"))
            print("| %s | %s |%s" % (name, why, " |" * (len(COLS) - 1)))
            continue
        for r in res.get("rows", []):
            print("| %s | " % name + " | ".join(fmt(r.get(c)) for c in COLS) + " |")
    print("\nwrote", os.path.join(OUT, "stall_results.json"), "in %.0f s" % report["total_seconds"])


if __name__ == "__main__":
    main()
