#!/usr/bin/env bash
# the whole `pytest -m gpu` tier as a user runs it (defaults), cut by SIGINT at LEFT s so the summary and junit still come back
export WORK=$OUT/w
mkdir -p $WORK
T0=$SECONDS
bash scripts/gpu_trials.sh setup-only > $OUT/setup.txt 2>&1
export PYTHONPATH=/tmp/ddtree-shim:/tmp/site PYTHONUNBUFFERED=1
cat /proc/sys/kernel/random/boot_id > $OUT/boot_id; nvidia-smi -L >> $OUT/boot_id; cat $OUT/boot_id
python3 -c "import pytest, xdist; print('pytest', pytest.__version__)" 2>&1 | tail -1
left=$(( ${LEFT:-540} - (SECONDS-T0) ))
timeout -s INT -k 25 $left python3 -m pytest -v -rs -p no:cacheprovider -p ddtree_conformance.pytest_plugin -m gpu tests \
  -o addopts="" --durations=40 --junitxml=$OUT/gpu-tier.xml ${PYARGS:-} 2>&1 \
  | while IFS= read -r l; do printf '%4d %s\n' $((SECONDS-T0)) "$l"; done > $OUT/pytest-gpu.txt
echo "pytest rc ${PIPESTATUS[0]} t=$((SECONDS-T0))"
grep -c PASSED $OUT/pytest-gpu.txt; grep -c SKIPPED $OUT/pytest-gpu.txt; grep -E "FAILED|ERROR" $OUT/pytest-gpu.txt | head -20
tail -60 $OUT/pytest-gpu.txt | cut -c1-220
