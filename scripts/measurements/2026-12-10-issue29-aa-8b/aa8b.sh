#!/usr/bin/env bash
# issue 29: A/A, one process per build, 8B-shaped pair (bf16, CUDA graphs default) on CUDA
export PACK=0 WORK=$OUT/w AA_SHAPE=8b AA_TIMEOUT=${AA_TIMEOUT:-260} AA_RUNS=${AA_RUNS:-8}
mkdir -p $WORK
cat /proc/sys/kernel/random/boot_id > $WORK/boot_id; nvidia-smi -L >> $WORK/boot_id
timeout ${AA_TOTAL:-530} bash scripts/gpu_trials.sh aa-procs 2>&1 | grep -v "Writing\|Loading" | tail -14
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv
cd $OUT && tar czf w.tgz w && rm -rf w; ls
