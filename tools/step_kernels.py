"""Where a profiled step's GPU time goes, from a benchmark's timeline file.

bench generate and bench decode write the profiled step of each mode as `*_timeline_*.json`
({mode: [[stream, start_us, duration_us, kernel name], ...]}). This prints, per kernel (the name
shortened: te_async's kernels by their function name, XLA's fusions without their numeric
suffix), the launches, the GPU time, and the idle time just before each launch (the gaps of the
step, charged to the kernel that ended them: the trip boundaries of a scan show up on the first
kernel of its body); then the step's span and busy time.

    python3 tools/step_kernels.py docs/results/.../generate_timeline_B1.json [--mode device] [--top 30]
"""
import argparse
import collections
import json
import re

_TE_ASYNC = re.compile(r"te_async::\(anonymous namespace\)::(\w+)")


def short_name(name: str) -> str:
    match = _TE_ASYNC.search(name)
    return match.group(1) if match else re.sub(r"[._]\d+$", "", name)[:60]


def breakdown(intervals: list) -> tuple:
    """({kernel: [launches, busy_us, idle_before_us]}, span_us, busy_us) of one step's intervals."""
    intervals = sorted(intervals, key=lambda iv: iv[1])
    start = intervals[0][1]
    end = max(s + d for _, s, d, _ in intervals)
    table = collections.defaultdict(lambda: [0, 0.0, 0.0])
    covered = start
    for _, s, d, name in intervals:
        row = table[short_name(name)]
        row[0] += 1
        row[1] += d
        row[2] += max(0.0, s - covered)
        covered = max(covered, s + d)
    busy = sum(d for _, _, d, _ in intervals)
    return dict(table), end - start, busy


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("timeline")
    ap.add_argument("--mode", help="the mode to show (default: the file's first)")
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    timelines = json.load(open(args.timeline))
    mode = args.mode or next(iter(timelines))
    table, span, busy = breakdown(timelines[mode])
    print(f"{mode}: {sum(r[0] for r in table.values())} launches, span {span:.1f} us, kernels {busy:.1f} us "
          f"(overlaps counted twice)")
    print(f"{'kernel':60s} {'launches':>8s} {'GPU us':>9s} {'idle before us':>15s}")
    for name, (n, us, idle) in sorted(table.items(), key=lambda kv: -(kv[1][1] + kv[1][2]))[:args.top]:
        print(f"{name:60s} {n:8d} {us:9.1f} {idle:15.1f}")


if __name__ == "__main__":
    main()
