#!/usr/bin/env bash
# issue 28 CUDA cell-runs, one process each: CELLS="label|catalogue|dtype|seed;..." (JOBS at once, RT per cell)
# PRETEST=1: first the GPU tier's tests (gpu-tests: FlashAttention-order attention == the recurrence on CUDA, bits)
export PACK=0 WORK=$OUT/w
mkdir -p $WORK
cat /proc/sys/kernel/random/boot_id > $WORK/boot_id; nvidia-smi -L >> $WORK/boot_id
[ "${PRETEST:-0}" = 1 ] && { bash scripts/gpu_trials.sh gpu-tests 2>&1 | tail -6 | tee $WORK/gpu-tests.txt; }
ROUND_TIMEOUT=${RT:-480} ROUND_JOBS=${JOBS:-12} ROUND_CELLS="$CELLS" bash scripts/gpu_trials.sh rounding-cells 2>&1 | tail -20
cd $OUT && tar czf w.tgz w && rm -rf w; ls
