"""python -m te_async.bench {prefill,layer,decode,decode-gemm,ep} [options]: run one benchmark, write JSON
(and markdown, plots where the benchmark makes them) under --out, print a table."""

import argparse
import importlib
import json
import pathlib

BENCHMARKS = {
    "prefill": "te_async.bench.prefill",  # seed 000's grouped GEMMs, TFLOP/s per mode
    "layer": "te_async.bench.layer",  # one MoE layer forward, async against sync
    "decode": "te_async.bench.decode",  # the L-layer decode step and its bubble
    "decode-gemm": "te_async.bench.decode_gemm",  # decode-size expert GEMMs against the weight-read floor
    "ep": "te_async.bench.ep",  # the expert-parallel MoE block on N devices against one
}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m te_async.bench", description=__doc__, add_help=False)
    parser.add_argument("benchmark", choices=BENCHMARKS, nargs="?")
    first, rest = parser.parse_known_args(argv)
    if first.benchmark is None:  # -h, or nothing: the top-level usage; "<name> -h" reaches the benchmark
        parser.print_help()
        return
    module = importlib.import_module(BENCHMARKS[first.benchmark])
    sub = argparse.ArgumentParser(prog=f"python -m te_async.bench {first.benchmark}", description=module.__doc__)
    sub.add_argument("--out", type=pathlib.Path, default=pathlib.Path("out"), help="folder for results")
    module.add_arguments(sub)
    args = sub.parse_args(rest)
    args.out.mkdir(parents=True, exist_ok=True)
    result = module.run(args)
    path = args.out / f"{first.benchmark}.json"
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
