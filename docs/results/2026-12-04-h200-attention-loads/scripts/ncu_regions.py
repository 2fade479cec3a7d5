"""Warp-stall samples and executed instructions of ncu's source page (`ncu -i REP --page source --csv
--print-source sass`), summed over the phases of aa0c869's MLA split kernel. The phase bounds are
row indices of this build's SASS listing, read off its barriers and loop branches (LDGDEPBAR,
BAR.SYNC, the score loop's backward branch); another build needs its own.
Usage: python3 ncu_regions.py ncu_source_B64_mla_aa0c869.csv.gz"""
import collections
import csv
import gzip
import sys

PHASES = [("prologue (query, offsets)", 0, 1576), ("tile start: wait + barrier", 1576, 1587),
          ("loads (18 copies)", 1587, 1877), ("scores (ldmatrix + mma loop)", 1877, 1901),
          ("scores out (mask, to shared)", 1901, 2054), ("softmax", 2054, 2153), ("P.V", 2153, 2278),
          ("epilogue", 2278, None)]

rows = list(csv.reader(gzip.open(sys.argv[1], "rt")))
header, data = rows[1], rows[2:]
col = {h: i for i, h in enumerate(header)}
samples = [int(r[col["Warp Stall Sampling (All Samples)"]] or 0) for r in data]
executed = [int(r[col["Instructions Executed"]] or 0) for r in data]
tiles = executed[1577]  # the tile loop's barrier runs once per warp and tile
for name, a, b in PHASES:
    s, e = sum(samples[a:b]), sum(executed[a:b])
    print(f"{name:32s} {100 * s / sum(samples):5.1f} % of samples, {100 * e / sum(executed):5.1f} % of instructions, "
          f"{e / tiles:.0f} per warp and tile")
reasons = collections.Counter()
for r in data:
    for h in header:
        if h.startswith("stall_") and "Not Issued" not in h:
            reasons[h] += int(r[col[h]] or 0)
print(", ".join(f"{h} {100 * v / sum(samples):.1f} %" for h, v in reasons.most_common(5)))
