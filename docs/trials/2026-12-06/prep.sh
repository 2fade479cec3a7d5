#!/bin/bash
# The Python trees of variants A (a362086, with 186d41a's bench/train_model.py: the same step and
# its temp GB column) and B (186d41a) for call2.sh, in the ignored .gpubuild/s56.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
for v in A:a362086 B:186d41a; do
  rm -rf .gpubuild/s56/${v%%:*} && mkdir -p .gpubuild/s56/${v%%:*}
  git archive ${v#*:} te_async | tar -x -C .gpubuild/s56/${v%%:*}
done
git show 186d41a:te_async/bench/train_model.py > .gpubuild/s56/A/te_async/bench/train_model.py
ls .gpubuild/s56
