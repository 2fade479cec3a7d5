"""Where a profiled step's GPU time goes, from a benchmark's timeline file.

bench generate and bench decode write the profiled step of each mode as `*_timeline_*.json`
({mode: [[stream, start_us, duration_us, kernel name], ...]}) and, since this table was added,
its GPU time per kernel beside it as `*_timeline_*_kernels.md`. This prints that table, with one
scan trip's launches (trace.trip_table), for a timeline file of any age, gzipped or not
(te_async.bench.trace.kernel_table says what each column holds).

    python3 -P tools/step_kernels.py docs/results/.../generate_timeline_B1.json[.gz] [--mode device] [--top 30]
"""
import argparse
import gzip
import json

from te_async.bench import trace


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("timeline")
    ap.add_argument("--mode", help="the mode to show (default: every mode in the file)")
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    timelines = json.load((gzip.open if args.timeline.endswith(".gz") else open)(args.timeline, "rt"))
    if args.mode:
        timelines = {args.mode: timelines[args.mode]}
    print(trace.kernel_markdown(timelines, args.top))


if __name__ == "__main__":
    main()
