"""Summarises ffn_stamps.patch's lines: TokenFfnKernel's phases, one FFNSTAMP line a block (globaltimer ns at
entry, x loaded and normalised, the wait for the routing returned, fc1 summed, the cluster's sums and the
activation, fc2 summed and stored, the cluster left) and RouteTokenKernel's end (ROUTESTAMP), for a few
launches of one run. Per launch: the grid, the phases' medians / min / max per kind of block (shared, routed) in
us from the kernel's first block start, the weights' read rate (each block's fc1 and fc2 bytes spread evenly
over its phase) by microsecond, and the SMs' blocks. argv: the run's log."""
import collections
import statistics
import sys

rows = collections.defaultdict(list)
route_end = {}
for line in open(sys.argv[1], errors="replace"):
    f = line.split()
    if line.startswith("FFNSTAMP"):
        d = dict(zip(f[1:19:2], map(int, f[2:19:2])))
        d["t"] = [int(x) for x in f[20:27]]
        rows[d["launch"]].append(d)
    elif line.startswith("ROUTESTAMP"):
        route_end[int(f[2])] = int(f[4])

H = 2048  # DeepSeek-V2-Lite's hidden size (the probe's model)


def line(name, values):
    print(f"    {name:34s} median {statistics.median(values):7.2f}  min {min(values):7.2f}  max {max(values):7.2f}")


for launch, blocks in sorted(rows.items()):
    t0 = min(b["t"][0] for b in blocks)
    rel = lambda b, i: (b["t"][i] - t0) / 1e3
    b0 = blocks[0]
    print(f"launch {launch}: {len(blocks)} blocks (grid {b0['grid']}), units {b0['units']}, slices {b0['slices']}, "
          f"kernel span {max(rel(b, 6) for b in blocks):.2f} us" +
          (f", routing ended at {(route_end[launch] - t0) / 1e3:.2f} us" if launch in route_end else ""))
    for kind in (0, 1):
        sel = [b for b in blocks if b["routed"] == kind]
        if not sel:
            continue
        print(f"  {'routed' if kind else 'shared'} blocks: {len(sel)}")
        line("start (kernel us)", [rel(b, 0) for b in sel])
        line("x loaded and normalised (+us)", [rel(b, 1) - rel(b, 0) for b in sel])
        line("routing's wait returned (kernel us)", [rel(b, 2) for b in sel])
        line("fc1 (us)", [rel(b, 3) - rel(b, 2) for b in sel])
        line("cluster sums + activation (us)", [rel(b, 4) - rel(b, 3) for b in sel])
        line("fc2 (us)", [rel(b, 5) - rel(b, 4) for b in sel])
        line("cluster left (us)", [rel(b, 6) - rel(b, 5) for b in sel])
        line("end (kernel us)", [rel(b, 6) for b in sel])
    # read rate by microsecond: fc1 = rows/slices x 2 units x 2 bytes, fc2 = units x H/slices x 2 bytes
    rate = collections.Counter()
    for b in blocks:
        for (a, z), nbytes in (((rel(b, 2), rel(b, 3)), H / b["slices"] * 2 * b["units"] * 2),
                               ((rel(b, 4), rel(b, 5)), b["units"] * H / b["slices"] * 2)):
            if z <= a:
                continue
            for us in range(int(a), int(z) + 1):
                overlap = min(z, us + 1) - max(a, us)
                if overlap > 0:
                    rate[us] += nbytes * overlap / (z - a)
    print("  weights read by microsecond (TB/s, spread evenly over each block's phase):")
    print("    " + " ".join(f"{us}:{rate[us] / 1e6:.2f}" for us in range(0, max(rate) + 1)))
    per_sm = collections.Counter(b["sm"] for b in blocks)
    print(f"  SMs with 1 / 2 / more blocks: {sum(v == 1 for v in per_sm.values())} / "
          f"{sum(v == 2 for v in per_sm.values())} / {sum(v > 2 for v in per_sm.values())}; SMs used {len(per_sm)}")
