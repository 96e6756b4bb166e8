#!/usr/bin/env bash
# issue 29: A/A with each build in its own process on CUDA (bench-and-gates.md: "on an H200 it is measured by aa-procs")
export PACK=0 WORK=$OUT/w
mkdir -p $WORK
cat /proc/sys/kernel/random/boot_id > $WORK/boot_id; nvidia-smi -L >> $WORK/boot_id
timeout 560 bash scripts/gpu_trials.sh aa-procs 2>&1 | tail -30
cd $OUT && tar czf w.tgz w && rm -rf w; ls
