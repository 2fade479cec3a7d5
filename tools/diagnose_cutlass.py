"""Where device mode's CUTLASS kernel disagrees with float64: per form and config, the error and
the map of bad output tiles. GPU machine only; each config runs in its own process, so that no
cached executable or recorded command buffer carries one config's kernel into the next.

    python3 -P tools/diagnose_cutlass.py            # all forms, default configs, then each m config
"""

import json
import os
import subprocess
import sys

import numpy as np

from te_async.bench import presets

MODEL = presets.PRESETS[presets.GPU_DEFAULT]
CASES = [  # (groups, rows per group, K, N): 8 of the model's fc1 GEMMs at a prefill's rows per expert, and a small one
    (8, 384, MODEL.hidden, 2 * MODEL.ffn),
    (4, 256, 256, 256),
]


def check(form: str) -> list:
    import jax.numpy as jnp

    import te_async
    from te_async import plan

    report = []
    rng = np.random.default_rng(0)
    for groups, per, k, n in CASES:
        rows = groups * per
        sizes = np.full(groups, per, np.int32)
        lhs = jnp.asarray(rng.standard_normal((rows, k)), jnp.bfloat16)
        shape = {"k": (rows, n), "mt": (groups, n, k), "m": (groups, k, n)}[form]
        rhs = jnp.asarray(rng.standard_normal(shape), jnp.bfloat16)
        ragged = "k" if form == "k" else "m"
        kernel = plan.plan_device_gemm(plan.GemmShape(groups, rows, k, n, ragged_k=form == "k", transpose_rhs=form == "mt")).label
        out = np.asarray(te_async.grouped_gemm(lhs, rhs, jnp.asarray(sizes), ragged=ragged, transpose_rhs=form == "mt",
                                               group_sizes_mode="device"), np.float64)
        a, b = np.asarray(lhs, np.float64), np.asarray(rhs, np.float64)
        if form == "k":
            ref = np.stack([a[g * per:(g + 1) * per].T @ b[g * per:(g + 1) * per] for g in range(groups)])
            flat, ref_flat = out.reshape(-1, n), ref.reshape(-1, n)
        else:
            w = np.swapaxes(b, 1, 2) if form == "mt" else b
            ref = np.concatenate([a[g * per:(g + 1) * per] @ w[g] for g in range(groups)])
            flat, ref_flat = out, ref
        bad = np.abs(flat - ref_flat) > 0.05 * np.sqrt(np.mean(ref_flat ** 2))
        tiles = sorted({(int(r) // 128, int(c) // 128) for r, c in zip(*np.nonzero(bad))})
        entry = dict(form=form, case=[groups, per, k, n], kernel=kernel,
                     rel_error=float(np.linalg.norm(out - ref) / np.linalg.norm(ref)),
                     bad_fraction=float(bad.mean()), nan=int(np.isnan(out).sum()), bad_tiles_128=len(tiles),
                     of_tiles=int(np.ceil(flat.shape[0] / 128) * np.ceil(n / 128)), first_bad_tiles=tiles[:12])
        if tiles:
            r0, c0 = tiles[0]
            sub = bad[r0 * 128:(r0 + 1) * 128, c0 * 128:(c0 + 1) * 128]
            rr, cc = np.nonzero(sub)
            ratio = flat[bad] / np.where(ref_flat[bad] == 0, 1, ref_flat[bad])
            entry.update(first_tile_bad_rows=[int(rr.min()), int(rr.max())], first_tile_bad_cols=[int(cc.min()), int(cc.max())],
                         first_tile_bad_count=int(sub.sum()), out_over_ref_median=float(np.median(ratio)),
                         bad_out_zero_fraction=float(np.mean(flat[bad] == 0)))
        report.append(entry)
    return report


def main():
    if len(sys.argv) > 1:  # child: one form under the inherited TE_ASYNC_CUTLASS_CONFIG
        print(json.dumps(check(sys.argv[1])))
        return
    from te_async import plan
    from te_async.bench import timing

    print(json.dumps({"environment": timing.environment()}), flush=True)
    runs = [(form, None) for form in plan.FORMS] + [("m", c) for c in plan.cutlass_configs("m")]
    for form, config in runs:
        env = dict(os.environ)
        if config:
            env["TE_ASYNC_CUTLASS_CONFIG"] = config
        p = subprocess.run([sys.executable, "-P", __file__, form], env=env, capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            print(f"{form} {config}: FAILED\n{p.stderr[-1500:]}")
            continue
        for e in json.loads(p.stdout.strip().splitlines()[-1]):
            print(json.dumps(e), flush=True)


if __name__ == "__main__":
    main()
