"""Summary of the P1STAMP lines (p1_stamps.patch) in a bench generate log: the input projections' kernel by phase."""
import re
import statistics
import sys

PATTERN = re.compile(r"P1STAMP launch (\d+) block (\d+) grid (\d+) sm (\d+) t (\d+) (\d+) (\d+) (\d+)")


def main(path):
    launches = {}
    for line in open(path, errors="replace"):
        m = PATTERN.search(line)
        if m:
            launch, block, grid, sm, *t = map(int, m.groups())
            launches.setdefault(launch, []).append((block, grid, sm, t))
    for launch, blocks in sorted(launches.items()):
        t0 = min(b[3][0] for b in blocks)
        us = lambda ns: ns / 1000.0  # noqa: E731
        print(f"launch {launch}: {len(blocks)} blocks (grid {blocks[0][1]}) on {len({b[2] for b in blocks})} SMs, "
              f"span {us(max(b[3][3] for b in blocks) - t0):.2f} us")
        rows = (("start (kernel us)", [b[3][0] - t0 for b in blocks]),
                ("x staged, norm, weight loads issued (+us)", [b[3][1] - b[3][0] for b in blocks]),
                ("products: loads' arrival, sums (+us)", [b[3][2] - b[3][1] for b in blocks]),
                ("output written (+us)", [b[3][3] - b[3][2] for b in blocks]),
                ("end (kernel us)", [b[3][3] - t0 for b in blocks]))
        for name, v in rows:
            print(f"    {name:44s} median {us(statistics.median(v)):6.2f}  min {us(min(v)):6.2f}  max {us(max(v)):6.2f}")


if __name__ == "__main__":
    main(sys.argv[1])
