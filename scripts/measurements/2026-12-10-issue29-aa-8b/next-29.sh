#!/usr/bin/env bash
# issue 29 on a newly started machine (H200 if one comes): tree kernels, rounds, cuBLASLt-from-33 pairs, parts (~330 s)
export PACK=0 WORK=$OUT/w
mkdir -p $WORK
T0=$SECONDS
bash scripts/gpu_trials.sh setup-only > $OUT/setup.txt 2>&1
export PYTHONPATH=/tmp/ddtree-shim:/tmp/site PYTHONUNBUFFERED=1
cat /proc/sys/kernel/random/boot_id > $WORK/boot_id; nvidia-smi -L >> $WORK/boot_id; cat $WORK/boot_id
fin() { cd $OUT && tar czf w.tgz w && rm -rf w; }
timeout 60 python3 scripts/bench_tree_graph.py --budgets 16,32,64 > $WORK/tree-graph.md 2>&1; grep -v Warn $WORK/tree-graph.md | tail -6
echo "t=$((SECONDS-T0))"
PATHS=fast-device WORK=$WORK/rounds bash scripts/gpu_trials.sh rounds 2>&1 | grep "^|" | tail -9
echo "t=$((SECONDS-T0))"
SWITCH=lean.VERIFY_CUBLASLT_FROM_ROWS SWITCH_VALUES="33 0" SWITCH_RUNS=3 WORK=$WORK/lt bash scripts/gpu_trials.sh switch-rounds 2>&1 | grep "run [0-9]:"
echo "t=$((SECONDS-T0))"
WORK=$WORK bash scripts/gpu_trials.sh skinny-gemm 2>&1 | grep -A12 "One forward"
echo "t=$((SECONDS-T0))"
PARTS_BUDGETS="16 64" WORK=$WORK/parts bash scripts/gpu_trials.sh round-parts 2>&1 | grep -A14 "B=64" | head -16
echo "t=$((SECONDS-T0))"
fin
