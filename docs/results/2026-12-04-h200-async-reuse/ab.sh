#!/usr/bin/env bash
# A/B of the async backward: c37b6e6 (wheel cea1f2a5, its Python) against this tree (wheel in
# $NEW_WHEELS), interleaved, under lax.scan (RUNS pairs) and unrolled (one pair).
set -uo pipefail
install() {  # install <wheel dir> <python tree>
  python3 -m pip install -q --no-deps --force-reinstall "$1"/te_async-0.1.0-cp312-cp312-linux_x86_64.whl >/dev/null 2>&1
  site=$(cd / && python3 -c "import te_async, os; print(os.path.dirname(te_async.__file__))")
  cp "$2"/te_async/*.py "$site/" && cp "$2"/te_async/bench/*.py "$site/bench/" && cp "$2"/te_async/models/*.py "$site/models/"
}
bench() {  # bench <build> <name> <args...>
  local build=$1 name=$2; shift 2
  if [ $build = old ]; then install .gpubuild/cea1f2a5 .gpubuild/old_head; export TE_ASYNC_COMMIT=c37b6e6; else install "$NEW_WHEELS" .; export TE_ASYNC_COMMIT=$NEW_COMMIT; fi
  echo "=== $(date +%T) $name $build"
  (cd / && timeout 150 python3 -P -m te_async.bench train --contenders sync async --reps ${REPS:-10} --out "$OUT/$name" "$@") 2>&1 | grep -E "^(even|skewed) |^- |error"
}
for i in $(seq 1 ${RUNS:-3}); do
  bench old scan_${i}_old --scan
  bench new scan_${i}_new --scan
done
bench old unrolled_old
bench new unrolled_new
