"""The floors' HBM read probe by size: how near the floor a read of a decode kernel's size gets.

Every floor here is bytes over the read bandwidth of one 2 GiB sum (timing.hbm_bandwidth). A
decode step's kernels read far less each: at DeepSeek-V2-Lite's batch 1 a MoE layer's experts are
138 MB, its shared experts 34.6 MB, one routed expert 17.3 MB, so a kernel's start, ramp and tail
weigh more than they do in 2 GiB. This times the same probe, XLA's sum of a float32 buffer (its
kernels' GPU busy time on a GPU, wall clock elsewhere), at each size, each read cold (sizes under
timing.COLD_BYTES read copies in turn: one buffer read again sits in L2, which made a 34.6 MB read
look as fast as the floor on an H100), and gives its time over the floor of its bytes: about what
"within 1.3× of the floor" asks of a kernel of that size.
"""

import jax

from . import presets, timing

# DeepSeek-V2-Lite: a layer's 4096-token latent cache 4.7 MB, one expert 17.3, the shared MLP 34.6,
# a B=1 MoE layer 138.4; 2147.5 MB is the floor's 2 GiB
GPU_MB = (1.0, 4.7, 17.3, 34.6, 69.2, 138.4, 276.8, 553.6, 2147.5)
CPU_MB = (0.25, 1.0, 33.6)


def add_arguments(p) -> None:
    p.add_argument("--mb", type=presets.positive_float, nargs="+",
                   help=f"buffer sizes in MB (default: {' '.join(map(str, GPU_MB))} on a GPU, "
                        f"{' '.join(map(str, CPU_MB))} elsewhere; the largest is the floor's bandwidth)")


def run(args) -> dict:
    sizes = sorted(args.mb or (GPU_MB if jax.default_backend() == "gpu" else CPU_MB))
    bandwidths = []
    for mb in sizes:
        bandwidths.append(timing.hbm_bandwidth(mb * 1e6 / 2**30))
        print(f"{mb:9g} MB  {mb / bandwidths[-1] * 1e12:10.2f} us  {bandwidths[-1] / 1e12:6.3f} TB/s")
    rows = [{"mb": mb, "us": mb / bw * 1e12, "tb_s": bw / 1e12, "over_floor": bandwidths[-1] / bw}
            for mb, bw in zip(sizes, bandwidths)]
    result = {"benchmark": "read", "floor_mb": sizes[-1], "results": rows}
    (args.out / "read.md").write_text(markdown(result))
    print(markdown(result))
    return result


def markdown(result) -> str:
    lines = [f"| MB | us | TB/s | over the floor ({result['floor_mb']:g} MB's bandwidth) |", "|---|---|---|---|"]
    lines += [f"| {r['mb']:g} | {r['us']:.2f} | {r['tb_s']:.3f} | {r['over_floor']:.2f}x |" for r in result["results"]]
    return "\n".join(lines) + "\n"
