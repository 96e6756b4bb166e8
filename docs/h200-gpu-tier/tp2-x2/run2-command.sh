set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
t0=$(date +%s)
timeout 230 python3 -m pytest -p ddtree_conformance.pytest_plugin -m gpu -q -rP -k "reference and tensor" > $OUT/tp2.log 2>&1; echo "tp rc=$? $(( $(date +%s) - t0 )) s"
grep -E "^reference .*(pass|fail|skip)|passed|failed" $OUT/tp2.log
t1=$(date +%s)
timeout 100 python3 -m pytest -p ddtree_conformance.pytest_plugin -m gpu -q -rP --gpu-engines ddtree_conformance.testing.tp_engines:DriverOnlyKvMove --gpu-limit 10 --budgets 16 -k "tensor and float32" > $OUT/mut.log 2>&1; echo "mutant rc=$? $(( $(date +%s) - t1 )) s"
grep -E "tensor-parallel.*: (pass|fail|skip)|passed|failed" $OUT/mut.log
