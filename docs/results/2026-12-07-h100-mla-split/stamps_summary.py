"""Summarises split_stamps.patch's SPLITSTAMP lines (the MLA split kernel of one layer, one line a block):
per phase the median, min and max over the blocks of the last trip, in us, from the block's start (clock64,
converted by each block's cycles over its globaltimer span) and, for the wait, from the grid's first start.
argv: the probe's log."""
import statistics
import sys

PHASES = ["prefetch issued", "wait returned", "q copies issued", "tile in smem", "scores", "scores barrier",
          "softmax", "P.V", "final barrier", "partials stored"]
rows = [l.split() for l in open(sys.argv[1]) if l.startswith("SPLITSTAMP")]
blocks = max(int(r[2]) for r in rows) + 1
last = rows[-blocks:]
t0 = min(int(r[6]) for r in last)
print(f"{len(rows)} lines, {blocks} blocks a trip; the last trip:")
spans = []
for r in last:
    gt0, gtwait, gtend = int(r[6]), int(r[8]), int(r[10])
    clk = [int(x) for x in r[12:22]]
    ghz = clk[-1] / max(gtend - gt0, 1)
    spans.append((gt0 - t0, gtwait - t0, gtend - t0, [c / ghz / 1e3 for c in clk], ghz))
def line(name, values):
    print(f"  {name:24s} median {statistics.median(values):7.2f}  min {min(values):7.2f}  max {max(values):7.2f}")
line("block start (grid us)", [s[0] / 1e3 for s in spans])
line("wait returned (grid us)", [s[1] / 1e3 for s in spans])
line("block end (grid us)", [s[2] / 1e3 for s in spans])
print("  from each block's start, us:")
for i, name in enumerate(PHASES):
    line(name, [s[3][i] for s in spans])
print("  after the wait, us:")
for i, name in enumerate(PHASES[2:], start=2):
    line(name, [s[3][i] - s[3][1] for s in spans])
line("clock GHz", [s[4] for s in spans])
