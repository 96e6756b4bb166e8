#!/usr/bin/env bash
# session 23 call 1: reproduce tree kernels, rounds table, skinny gemm, parts, PAD + CUBLASLT switches, pytest -m gpu
export PACK=0 WORK=$OUT/w
mkdir -p $WORK
T0=$SECONDS
bash scripts/gpu_trials.sh setup-only > $OUT/setup.txt 2>&1
export PYTHONPATH=/tmp/ddtree-shim:/tmp/site PYTHONUNBUFFERED=1
cat /proc/sys/kernel/random/boot_id > $OUT/boot_id; nvidia-smi -L >> $OUT/boot_id; cat $OUT/boot_id
head -4 $OUT/setup.txt
fin() { cd $OUT && tar czf w.tgz w && rm -rf w; }
timeout 60 python3 scripts/bench_tree_graph.py --budgets 16,32,64 > $WORK/tree-graph.md 2>&1; grep -v Warn $WORK/tree-graph.md | tail -10
echo "t=$((SECONDS-T0))"
PATHS=fast-device BUDGETS="16 32 64" WORK=$WORK/rounds1 bash scripts/gpu_trials.sh rounds 2>&1 | grep "^|" | tail -6
echo "t=$((SECONDS-T0))"
WORK=$WORK bash scripts/gpu_trials.sh skinny-gemm 2>&1 | tail -45
echo "t=$((SECONDS-T0))"
SWITCH=lean.PAD_VERIFY_ROWS_TO SWITCH_VALUES="0 16 32" SWITCH_RUNS=2 WORK=$WORK/pad bash scripts/gpu_trials.sh switch-rounds 2>&1 | grep "run [0-9]:"
echo "t=$((SECONDS-T0))"
SWITCH=lean.VERIFY_CUBLASLT SWITCH_RUNS=2 WORK=$WORK/lt bash scripts/gpu_trials.sh switch-rounds 2>&1 | grep "run [0-9]:"
echo "t=$((SECONDS-T0))"
PARTS_BUDGETS="64" WORK=$WORK/parts bash scripts/gpu_trials.sh round-parts 2>&1 | tail -14
echo "t=$((SECONDS-T0))"
left=$(( 560 - (SECONDS-T0) ))
if [ $left -gt 40 ]; then
  timeout $left python3 -m pytest -q -p no:cacheprovider -p ddtree_conformance.pytest_plugin -m gpu tests -o addopts="" -x > $WORK/pytest-gpu.txt 2>&1; echo "pytest -m gpu rc $?"; tail -5 $WORK/pytest-gpu.txt
fi
echo "t=$((SECONDS-T0))"
fin
