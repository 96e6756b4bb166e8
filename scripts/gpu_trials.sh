#!/usr/bin/env bash
# The GPU runs of issue 15 on one H200, each writing under $OUT:
#   rounds            round-time table, 8B-shaped pair, bf16, context 512, heap vs plain step, B = 16..1024
#                     ($OUT/rounds/rounds.{md,json}; ~1.5 minutes)
#   decisive-8b       gate decisiveness, 8B-shaped random-weight pair ($OUT/decisive-8b/{table.md,table.json,
#                     trials.jsonl,baseline.json}; stops starting trials at 330 s, ~6.5 minutes)
#   decisive-fixture  gate decisiveness, bundled fixture pair ($OUT/decisive-fixture/...; stops at 110 s, ~2.5 minutes)
#
#   bash scripts/gpu_trials.sh rounds decisive-8b     # one command, ~7 minutes
#   bash scripts/gpu_trials.sh decisive-fixture       # one command, ~3 minutes
#
# The package runs from the source tree through a symlink shim (nothing is installed). pydantic is not
# in the H200 image: put its wheels in .whl/ (pydantic, pydantic-core, annotated-types,
# typing-inspection, for cp312 manylinux x86_64) and carry .whl; they are installed into /tmp/site.
set -euo pipefail
OUT=${OUT:-out}
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
shim=/tmp/ddtree-shim
rm -rf "$shim" && mkdir -p "$shim/ddtree_conformance"
for f in conformance/*; do ln -s "$PWD/$f" "$shim/ddtree_conformance/"; done
ln -s "$PWD/adapters" "$shim/ddtree_conformance/adapters"
ln -s "$PWD/golden" "$shim/ddtree_conformance/golden"
export PYTHONPATH="$shim:/tmp/site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
python3 -c "import ddtree_conformance.bench, torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))"
for job in "$@"; do
  case "$job" in
    rounds)
      timeout 200 python3 scripts/bench_reference_stages.py --shape 8b --device cuda --dtype bfloat16 \
        --prompt-len 512 --new-tokens 24 --repeats 3 --total-budget-s 150 --out "$OUT/rounds" || echo "rounds: exit $?" ;;
    decisive-8b)
      timeout 420 python3 scripts/gate_decisiveness.py --pair 8b --device cuda --dtype bfloat16 --prompts 1 \
        --prompt-len 128 --new-tokens 64 --budget 32 --trials 8 --band 0.01 --baseline-repeats 30 \
        --trial-budget-s 150 --max-repeats 60 --total-budget-s 330 --out "$OUT/decisive-8b" || echo "decisive-8b: exit $?" ;;
    decisive-fixture)
      timeout 180 python3 scripts/gate_decisiveness.py --pair fixture --device cuda --dtype bfloat16 --prompts 4 \
        --new-tokens 64 --budget 32 --trials 8 --band 0.01 --baseline-repeats 20 --trial-budget-s 40 \
        --total-budget-s 110 --out "$OUT/decisive-fixture" \
        || echo "decisive-fixture: exit $?" ;;
    *) echo "unknown job $job (rounds, decisive-8b, decisive-fixture)" >&2; exit 2 ;;
  esac
done
