"""Run one benchmark: it prints a table and writes its results under --out as JSON (with where
they came from: date, commit, build, jax, GPU), markdown and, where it makes them, plots.
`python -m te_async.bench <benchmark> --help` says what each measures. Every benchmark defaults
to real model shapes (DeepSeek-V2-Lite) on a GPU and to the tiny preset, which runs in a minute
or so, on a CPU; --preset picks another."""

import argparse
import importlib
import json
import pathlib

from . import timing

BENCHMARKS = {
    "prefill": "te_async.bench.prefill",
    "train": "te_async.bench.train",
    "train-model": "te_async.bench.train_model",
    "layer": "te_async.bench.layer",
    "decode": "te_async.bench.decode",
    "decode-gemm": "te_async.bench.decode_gemm",
    "ep": "te_async.bench.ep",
    "generate": "te_async.bench.generate",
    "dense": "te_async.bench.dense",
    "attention": "te_async.bench.attention",
    "read": "te_async.bench.read",
}


def parser() -> argparse.ArgumentParser:
    """One sub-command per benchmark, its one-line summary and help from its module's docstring."""
    top = argparse.ArgumentParser(prog="python -m te_async.bench", description=__doc__)
    subs = top.add_subparsers(dest="benchmark", metavar="benchmark", title="benchmarks")
    for name, path in BENCHMARKS.items():
        module = importlib.import_module(path)
        sub = subs.add_parser(name, help=module.__doc__.splitlines()[0], description=module.__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
        sub.add_argument("--out", type=pathlib.Path, default=pathlib.Path("out"), help="folder for the results (default: out)")
        module.add_arguments(sub)
        sub.set_defaults(module=module)
    return top


def main(argv=None) -> None:
    top = parser()
    args = top.parse_args(argv)
    if args.benchmark is None:
        top.print_help()
        return
    args.out.mkdir(parents=True, exist_ok=True)
    # Flags a benchmark needs from XLA (its XLA_FLAGS), set before environment() starts the backend.
    timing.add_xla_flags(getattr(args.module, "XLA_FLAGS", ()))
    environment = timing.environment()
    result = {**args.module.run(args), "environment": environment}
    path = args.out / f"{args.benchmark}.json"
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
