#!/usr/bin/env bash
# GPU runs on one H200 (issue 22: the reference engine's fast path and the gate's decisiveness), each
# writing under $WORK (default $OUT); with PACK=1, $WORK is packed into $OUT/runs.tgz after every job, so
# that a lent machine's few returned files hold everything (and a job cut short keeps what it wrote).
#   equality          fast path vs eager: outputs, acceptance, graph counts (fixture fp32 + bf16, then the
#                     8B-shaped pair in bf16) -> $WORK/equality/, $WORK/equality-8b/          (~2 minutes)
#   rounds            round-time table, 8B-shaped pair, bf16, context 512, the paths in $PATHS (eager, graphs,
#                     fast: the tree on the host between two graphs, fast-device: the round after the draft in
#                     one graph), plain step and B = 16..1024, GPU-busy share -> $WORK/rounds/ (~2.5 minutes)
#   switch-rounds     issue 29: one fast-path switch (SWITCH, a `bench_reference_stages.py --switch` name) at each of
#                     SWITCH_VALUES (on off) in turn, SWITCH_RUNS (3) times, PATHS (fast-device), BUDGETS (16 32 64),
#                     context 512, 16 new tokens -> $WORK/switch-rounds/runK-VALUE/; prints every run's rows
#                     (~20 s a run). `rounds` takes SWITCHES ("NAME=VALUE NAME=VALUE") for its one run.
#   equality-8b       the same on the tiny shaped pair (grouped KV heads) in fp32 and the 8B-shaped pair in bf16
#   gpu-tests         pytest -m gpu: the fast path == eager in fp32 on CUDA, and the tree's one-launch beams as
#                     compiled == the heap (tests/test_beam_kernel.py), the FlashAttention-order engine's attention ==
#                     the recurrence as written, bit for bit (tests/test_rounding_engines.py); stops the script on a
#                     failure (~0.5 minute)
#   decisive-smoke    2 trials per engine (correct, verify +5 %), fast path -> $WORK/decisive-smoke/
#   decisive-8b       gate decisiveness, 8B-shaped random-weight pair, fast path, band 2 %: a baseline of 30
#                     repeats, then $TRIALS (default 12) trials per engine (correct, verify +5 %), each a
#                     sequential bench with at most 60 s -> $WORK/decisive-8b/                  (~4 minutes)
#   decisive-eager    the same on the eager path (graphs off), for comparison
#   trials-29         issue 29: gate trials with the machine's state, 8B-shaped pair, fast path, B=32, band 2 %:
#                     correct and verify +5 % under A/B (the correct one is the A/A run) and under the stored
#                     gate (a baseline measured in this machine's first call, merged into $BASELINES: default
#                     the four H200 runs of issue 22, scripts/measurements/2026-12-02-issue29/seed-baselines.json),
#                     $STRESS (16) busy CPU processes beside every second trial, started $STRESS_SETTLE (5) s before
#                     it; each trial times at most $TRIAL_BUDGET (54) s, so that a verdict, its priming calls and
#                     its last repeat's overshoot included, stays within one GPU-minute; trials until $TOTAL_BUDGET (420) s.
#                     Rows accumulate in $STATE (/tmp/trials-29) across calls on one warm machine: call it again to
#                     spread the trials over 20 minutes or more -> $WORK/trials-29/ (~8 minutes a call); TRIAL_ENGINES
#                     (correct,verify+5%) picks the engines; GATES (ab,stored)
#                     narrows the gates, WAIT (auto) sets how the process waits for the GPU (cuda_wait.py: auto, spin,
#                     blocking; 2026-12-05: blocking measured, not adopted); also read by `rounds` (with BUDGETS)
#   aa-procs          issue 29: A/A with each build in its own process, as `bench --against` runs it (the trials
#                     above run both builds in one process): $AA_RUNS (3) runs of 40 repeats, fixture pair, CUDA,
#                     B=16, then the runs pooled (between-run sd: the per-process offset no run's interval
#                     covers) -> $WORK/aa-procs/                                     (at most ~9 minutes)
#                     AA_SHAPE=8b times the 8B-shaped random-weight pair instead (built and written once, to
#                     /tmp/aa-pair-8b, then loaded by every engine process); AA_TIMEOUT (170 s) bounds a run;
#                     AA_START=baseline starts the baseline process first (default: the candidate's)
#   catalogues        the correct catalogue (conformance/testing/correct_engines.py; every engine must pass) and,
#                     with CAT_CATALOGUES="correct mutants", the mutants (each must fail), in float16, bfloat16
#                     and float32 (CAT_DTYPES), fixture pair, 4 prompts, 24 tokens, B=16, one engine per process
#                     on the machine's CPU cores (CAT_DEVICE=cuda for the GPU: slow on so tiny a pair)
#                     -> $WORK/catalogues/CATALOGUE-DTYPE-SHARD.{json,log}          (~4 minutes a catalogue)
#   rounding          the correct engines that round differently, traced and as black boxes (ROUND_CATALOGUES),
#                     in ROUND_DTYPES (bfloat16 float16), ROUND_LIMIT (20) prompts, run seeds ROUND_SEED (1; several
#                     run in one process, start-up paid once), the checks the noise model
#                     governs (ROUND_CHECKS), one engine per process on the CPU cores (ROUND_DEVICE=cpu)
#                     -> $WORK/rounding/CATALOGUE-DTYPE-SHARD.{json,log}; every row must pass. ROUND_ONLY (an engine
#                     name substring), ROUND_SHARDS (8) and ROUND_JOBS (nproc) narrow it: on CUDA the eager tiny pair
#                     is launch-bound, and 16 processes at 20 prompts, B=16, every check, did not finish one engine
#                     in 530 s (2026-12-04); time one engine alone (ROUND_SHARDS=1 ROUND_JOBS=1) before sizing a call
#                     (since then, on an H100 with ROUND_SHARDS=1: one engine's four cells at four seeds, each seed
#                     its own WORK, 16 processes, took 475-486 s for the attention engines; split-K needs 12 processes
#                     to finish inside 545 s, 409-515 s; scripts/measurements/2026-12-05g-rounding-cuda/README.md).
#                     ROUND_ONLY matches the engine's label ("split-K reductions"), not its class name.
#   rounding-groups   issue 28's CUDA cells, several engines and seeds at once: ROUND_GROUPS "label|seed;label|seed"
#                     (each group one `rounding` run of ROUND_ONLY=label, ROUND_SEED=seed, ROUND_SHARDS=1, four
#                     processes: traced and black box, bf16 and fp16, on ROUND_DEVICE, default cuda), groups started
#                     5 s apart -> $WORK/gN/rounding/*.json and $WORK/gN.out. Two groups (8 processes) took 298-410 s
#                     a cell on two H100s (2026-12-06); four groups of one attention engine at four seeds (16
#                     processes) 475-486 s (2026-12-05g); FlashAttention's order, the slowest, did not finish in
#                     500 s at 12 processes: give it two groups a call. ROUND_TIMEOUT bounds each cell. A group
#                     may hold several seeds ("label|3 4": one process each cell, start-up paid once); a group
#                     that is not label|seeds stops the job before any starts.
#   rounding-cells    issue 28's CUDA cells, one process per cell-run: ROUND_CELLS "label|catalogue|dtype|seed;..." as
#                     `scripts/rounding_table.py --left` prints it (catalogue rounding = traced, rounding-black-box),
#                     ROUND_JOBS (12) at once, 2 s apart -> $WORK/rounding/cN-*.json. Unlike rounding-groups, no cell
#                     already run is run again beside its siblings. A malformed cell, ROUND_JOBS or ROUND_TIMEOUT stops the
#                     script before its setup (exit 2).
#                     Traced bfloat16 is the slowest cell: it outlasted 480 s among twelve with three of it or five
#                     (2026-12-06i); four among twelve took 490-501 s, four among ten 362-370 s (2026-12-07).
#   aggregates        issue 28: the acceptance check's aggregate path on the rounding catalogue and the lossless-but-slower
#                     mutants, each reporting aggregates only (scripts/aggregate_bands.py), AGG_DTYPES (bfloat16
#                     float16) x run seeds AGG_SEEDS (1 2 3), limits 7 20 40, one process per dtype and seed on the
#                     device AGG_DEVICE (cpu: the 16 cores) -> $WORK/aggregates/DTYPE-sSEED.{json,log}
#   profile-rounding  issue 28: one cell of the rounding catalogue (PROFILE_ONLY, PROFILE_DTYPE, PROFILE_LIMIT 5 prompts)
#                     under cProfile on ROUND_DEVICE (cuda): where a CUDA cell's time goes -> $WORK/profile/
#   profile-round     issue 29 item 4: one plain and one DDTree call of the 8B-shaped pair under torch.profiler
#                     (scripts/profile_round.py, PROFILE_BUDGET 32, PROFILE_PATH fast): kernels per stage, the
#                     device's idle gaps charged to the host stage running -> $WORK/profile-round/   (~2 minutes)
#   round-parts       issue 29 item 4: the fast-device round with capture off, each kernel charged to the part of
#                     the round that launched it (tree, verify inputs, target forward, walk, commit, drafter,
#                     lm_head; scripts/profile_round_parts.py), PARTS_BUDGETS (16 64) -> $WORK/round-parts/ (~1 minute)
#   skinny-gemm       issue 29 item 4: the target's four layer products and lm_head at 1..128 rows, as called, with the rows padded to a
#                     multiple of 16 / 32 / 64, and through cuBLASLt (scripts/bench_skinny_gemm.py): which row counts
#                     cuBLAS serves at the weights' bandwidth -> $WORK/skinny-gemm.md                 (~1 minute)
#   pieces            issue 29 item 4: the tree build, verify inputs and greedy walk as the fast path runs them
#                     (host, with reads back) against device_tree/device_verify/device_walk, B = 16..1024, equal
#                     or not -> $WORK/pieces/table.md                                          (~2 minutes)
#   calibrate-cpu     the noise model (conformance/noise.py) on the machine's CPU cores: the reference and every
#                     correct engine that rounds differently (testing/rounding_engines.py), bf16 and fp16, one
#                     process per engine and dtype, into a copy of the fixture manifest -> $WORK/manifest-cpu.json
#   calibrate-cuda    the same on the GPU (every process shares it) -> $WORK/manifest-cuda.json
#
#   setup-only        the setup only (shim, wheels, the GPU's name), for commands run by hand after it
#   check-only        with other jobs: check their names and settings (rounding-cells') and stop before the setup
#                     (exit 0; a job it does not know or a bad setting: exit 2, before anything is installed)
#
#   PACK=1 bash scripts/gpu_trials.sh equality rounds gpu-tests decisive-smoke     # one development call
#   PACK=1 bash scripts/gpu_trials.sh decisive-8b                                  # one call per new machine
#   PACK=1 bash scripts/gpu_trials.sh trials-29                                    # repeat on one warm machine
#
# The package runs from the source tree through a symlink shim (nothing is installed). pydantic is not
# in the H200 image: put its wheels in .whl/ (pydantic, pydantic-core, annotated-types, typing-inspection,
# typing-extensions, for cp312 manylinux x86_64) and carry .whl; they are installed into /tmp/site.
set -uo pipefail
# rounding-cells' settings, checked before anything is installed or started: one error naming the variable, exit 2
check_rounding_cells() {
  local cell cells
  [[ -n ${ROUND_CELLS:-} ]] || { echo "ROUND_CELLS must hold \"label|catalogue|dtype|seed;...\" (rounding_table.py --left prints it)" >&2; exit 2; }
  IFS=';' read -ra cells <<< "$ROUND_CELLS"
  for cell in "${cells[@]}"; do
    [[ "$cell" =~ ^[^|]+\|rounding(-black-box)?\|(float32|bfloat16|float16)\|[0-9]+$ ]] || {
      echo "ROUND_CELLS: '$cell' is not 'label|rounding or rounding-black-box|float32, bfloat16 or float16|seed'" >&2; exit 2; }
  done
  [[ ${ROUND_JOBS:-12} =~ ^[1-9][0-9]*$ ]] || { echo "ROUND_JOBS: '${ROUND_JOBS}' is not a whole number of processes" >&2; exit 2; }
  [[ ${ROUND_TIMEOUT:-540} =~ ^[1-9][0-9]*$ ]] || { echo "ROUND_TIMEOUT: '${ROUND_TIMEOUT}' is not a whole number of seconds" >&2; exit 2; }
}
JOBS="equality equality-8b rounds switch-rounds profile-round gpu-tests decisive-smoke decisive-8b decisive-eager aa-procs
trials-29 catalogues rounding rounding-groups rounding-cells profile-rounding aggregates round-parts skinny-gemm pieces
calibrate-cpu calibrate-cuda setup-only check-only"
for job in "$@"; do
  [[ " ${JOBS//$'\n'/ } " == *" $job "* ]] || { echo "gpu_trials: unknown job '$job' (one of: ${JOBS//$'\n'/ })" >&2; exit 2; }
  [[ $job == rounding-cells ]] && check_rounding_cells
done
for job in "$@"; do [[ $job == check-only ]] && { echo "gpu_trials: the jobs' settings check out"; exit 0; }; done
OUT=${OUT:-out}
WORK=${WORK:-$OUT}
TRIALS=${TRIALS:-12}
mkdir -p "$WORK"
# Several runs may start at once on one machine (issue 28's cell groups): the wheels go in under a lock, and each
# run builds its own shim, so that no start removes a shim another run is importing from. /tmp/ddtree-shim then
# points at the newest, for commands run by hand after `setup-only`.
if compgen -G ".whl/*.whl" >/dev/null; then
  flock /tmp/ddtree-site.lock python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
fi
shim=$(mktemp -d /tmp/ddtree-shim.XXXXXX)
mkdir -p "$shim/ddtree_conformance"
for f in conformance/*; do ln -s "$PWD/$f" "$shim/ddtree_conformance/"; done
ln -s "$PWD/adapters" "$shim/ddtree_conformance/adapters"
ln -s "$PWD/golden" "$shim/ddtree_conformance/golden"
if [ -d /tmp/ddtree-shim ] && [ ! -L /tmp/ddtree-shim ]; then rm -rf /tmp/ddtree-shim; fi  # an older script's folder
ln -sfn "$shim" "$shim.link" && mv -T "$shim.link" /tmp/ddtree-shim
export PYTHONPATH="$shim:/tmp/site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
python3 -c "import ddtree_conformance.bench, torch, transformers; print('torch', torch.__version__, 'transformers',
transformers.__version__, torch.cuda.get_device_name(0))" || exit 1
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv || true
python3 -c "from ddtree_conformance.machine_state import Sampler; s = Sampler('cuda'); print('machine state via', s.via,
s.identity, s.sample())" || true
pack() { if [ "${PACK:-0}" = 1 ]; then tar czf "$OUT/runs.tgz" -C "$WORK" . ; fi; }
decisive() {  # name, cuda-graphs, trials, trial budget, total budget, timeout
  timeout "$6" python3 scripts/gate_decisiveness.py --pair 8b --device cuda --dtype bfloat16 --cuda-graphs "$2" \
    --engines correct,verify+5% --prompts 1 --prompt-len 128 --new-tokens 64 --budget 32 --trials "$3" \
    --band 0.02 --baseline-repeats "${BASELINE_REPEATS:-30}" --trial-budget-s "$4" --max-repeats 60 --total-budget-s "$5" \
    --out "$WORK/$1" || echo "$1: exit $?"
}
for job in "$@"; do
  started=$SECONDS
  case "$job" in
    equality)
      timeout 150 python3 scripts/fast_path_equality.py --device cuda --runs fixture:float32,fixture:bfloat16 \
        --budgets 16,64,256,1024 --prompts 8 --new-tokens 64 --out "$WORK/equality" || echo "equality: exit $?"
      timeout 120 python3 scripts/fast_path_equality.py --device cuda --runs 8b:bfloat16 --budgets 32,256 \
        --new-tokens 32 --out "$WORK/equality-8b" || echo "equality-8b: exit $?" ;;
    equality-8b)
      timeout 150 python3 scripts/fast_path_equality.py --device cuda --runs tiny:float32,8b:bfloat16 \
        --budgets 32,256 --new-tokens 32 --out "$WORK/equality-8b" || echo "equality-8b: exit $?" ;;
    rounds)
      timeout 200 python3 scripts/bench_reference_stages.py --shape 8b --device cuda --dtype bfloat16 \
        --paths "${PATHS:-eager,graphs,fast,fast-device}" --cuda-wait "${WAIT:-auto}" ${BUDGETS:+--budgets $BUDGETS} --prompt-len 512 --new-tokens "${ROUND_TOKENS:-16}" \
        --repeats "${ROUND_REPEATS:-2}" --total-budget-s 170 $(for s in ${SWITCHES:-}; do printf -- '--switch %s ' "$s"; done) \
        --out "$WORK/rounds" || echo "rounds: exit $?" ;;
    switch-rounds)
      mkdir -p "$WORK/switch-rounds"
      for k in $(seq 1 "${SWITCH_RUNS:-3}"); do
        for v in ${SWITCH_VALUES:-on off}; do
          run="$WORK/switch-rounds/run$k-$v"
          timeout 120 python3 scripts/bench_reference_stages.py --shape 8b --device cuda --dtype bfloat16 \
            --paths "${PATHS:-fast-device}" --cuda-wait "${WAIT:-auto}" --budgets ${BUDGETS:-16 32 64} --prompt-len 512 \
            --new-tokens 16 --repeats 2 --total-budget-s 60 --switch "${SWITCH:?SWITCH must name a --switch}=$v" \
            --out "$run" > "$run.log" 2>&1 || echo "switch-rounds: run $k $v exit $?"
          grep -E "^\| [0-9]+ \|" "$run/rounds.md" 2>/dev/null | sed "s/^/$SWITCH=$v run $k: /"
        done
      done ;;
    profile-round)  # issue 29 item 4: a round's kernels per stage, and the device's idle gaps by host stage
      timeout "${PROFILE_TIMEOUT:-150}" python3 scripts/profile_round.py --shape 8b --budget "${PROFILE_BUDGET:-32}" \
        --path "${PROFILE_PATH:-fast}" --out "$WORK/profile-round" 2>&1 | grep -v "Loading\|USDT" | tail -70 ;;
    gpu-tests)
      timeout 120 python3 -m pytest -q -p no:cacheprovider -p ddtree_conformance.pytest_plugin -m gpu \
        tests/test_gpu.py tests/test_beam_kernel.py tests/test_rounding_engines.py \
        -k "fast_path or compiled_launch or bits_of_the_recurrence" \
        -o addopts="" 2>&1 | tail -15 || { echo "gpu-tests failed: stopping"; pack; exit 3; } ;;
    decisive-smoke) decisive decisive-smoke on 2 30 100 150 ;;
    decisive-8b) decisive decisive-8b on "$TRIALS" "${TRIAL_BUDGET:-60}" "${TOTAL_BUDGET:-420}" \
      "$(( ${TOTAL_BUDGET:-420} + 120 ))" ;;
    decisive-eager) decisive decisive-eager off "$TRIALS" 60 420 540 ;;
    aa-procs)
      mkdir -p "$WORK/aa-procs"
      for k in $(seq 1 "${AA_RUNS:-3}"); do
        timeout "${AA_TIMEOUT:-170}" python3 scripts/ab_bias.py --against reference --device cuda --dtype bfloat16 \
          --repeats 40 ${AA_SHAPE:+--shape "$AA_SHAPE" --shape-dir /tmp/aa-pair-$AA_SHAPE} \
          ${AA_START:+--start-first "$AA_START"} --out "$WORK/aa-procs/run-$k.json" 2>&1 | tail -1 || echo "aa-procs run $k: exit $?"
      done
      python3 scripts/ab_bias.py --pool "$WORK"/aa-procs/run-*.json | tee "$WORK/aa-procs/pooled.json" ;;
    trials-29)
      timeout "$(( ${TOTAL_BUDGET:-420} + 150 ))" python3 scripts/gate_decisiveness.py --pair 8b --device cuda \
        --dtype bfloat16 --cuda-graphs on --engines "${TRIAL_ENGINES:-correct,verify+5%}" --gates "${GATES:-ab,stored}" --cuda-wait "${WAIT:-auto}" --prompts 1 --prompt-len 128 \
        --new-tokens 64 --budget 32 --band 0.02 --baseline-repeats "${BASELINE_REPEATS:-20}" \
        --trial-budget-s "${TRIAL_BUDGET:-54}" --max-repeats 60 --total-budget-s "${TOTAL_BUDGET:-420}" \
        --stress "${STRESS:-16}" --stress-settle-s "${STRESS_SETTLE:-5}" --stress-every "${STRESS_EVERY:-2}" --state "${STATE:-/tmp/trials-29}" \
        --baselines "${BASELINES:-scripts/measurements/2026-12-02-issue29/seed-baselines.json}" \
        --out "$WORK/trials-29" || echo "trials-29: exit $?" ;;
    catalogues)  # one engine per process; on CUDA the tiny pair is launch-bound (~400 s an engine), so CPU by default
      mkdir -p "$WORK/catalogues"; export WORK
      for catalogue in ${CAT_CATALOGUES:-correct}; do for dtype in ${CAT_DTYPES:-float16 bfloat16 float32}; do
        for shard in $(seq 0 16); do echo "$catalogue $dtype $shard"; done; done; done |
        xargs -P "$(nproc)" -n 3 sh -c 'timeout "${CAT_TIMEOUT:-420}" python3 scripts/mutation_table.py --catalogue "$0" \
          --device "${CAT_DEVICE:-cpu}" --dtype "$1" --limit 4 --max-new-tokens 24 --budgets 16 --sampling-requests 60 \
          --threads 1 --shard "$2/17" --json "$WORK/catalogues/$0-$1-$2.json" >"$WORK/catalogues/$0-$1-$2.log" 2>&1'
      grep -h "^| \|NOT CAUGHT" "$WORK"/catalogues/*.log ;;
    rounding)
      mkdir -p "$WORK/rounding"; export WORK
      for catalogue in ${ROUND_CATALOGUES:-rounding rounding-black-box}; do for dtype in ${ROUND_DTYPES:-bfloat16 float16}; do
        for shard in $(seq 0 $(( ${ROUND_SHARDS:-8} - 1 ))); do echo "$catalogue $dtype $shard"; done; done; done |
        xargs -P "${ROUND_JOBS:-$(nproc)}" -n 3 sh -c 'timeout "${ROUND_TIMEOUT:-540}" python3 scripts/mutation_table.py --catalogue "$0" \
          --device "${ROUND_DEVICE:-cpu}" --dtype "$1" --limit "${ROUND_LIMIT:-20}" --max-new-tokens "${ROUND_TOKENS:-64}" \
          --budgets "${ROUND_BUDGETS:-16,64}" --run-seed ${ROUND_SEED:-1} --threads 1 --shard "$2/${ROUND_SHARDS:-8}" ${ROUND_ONLY:+--only "$ROUND_ONLY"} \
          --check ${ROUND_CHECKS:-lossless acceptance context-range near-ties golden tree-structure branch-vs-chain} \
          --json "$WORK/rounding/$0-$1-$2.json" >"$WORK/rounding/$0-$1-$2.log" 2>&1'
      grep -h "^| \|NOT CAUGHT" "$WORK"/rounding/*.log ;;
    rounding-groups)
      IFS=';' read -ra groups <<< "${ROUND_GROUPS:?ROUND_GROUPS must hold \"label|seed;label|seed\"}"
      for group in "${groups[@]}"; do  # every group checked before any starts
        [[ "$group" =~ ^[^|]+\|[0-9]+( [0-9]+)*$ ]] || { echo "ROUND_GROUPS: '$group' is not 'label|seed' (seeds: whole numbers, space-separated)" >&2; exit 2; }
      done
      i=0
      for group in "${groups[@]}"; do
        i=$((i + 1))
        (PACK=0 WORK="$WORK/g$i" ROUND_ONLY="${group%|*}" ROUND_SEED="${group##*|}" ROUND_SHARDS=1 ROUND_JOBS=4 \
          ROUND_DEVICE="${ROUND_DEVICE:-cuda}" bash "$0" rounding > "$WORK/g$i.out" 2>&1) &
        sleep 5
      done
      wait
      grep -h "^| " "$WORK"/g*.out ;;
    rounding-cells)  # issue 28: exactly the cell-runs left (rounding_table.py --left prints ROUND_CELLS), ROUND_JOBS at once
      IFS=';' read -ra cells <<< "$ROUND_CELLS"  # checked before the setup (check_rounding_cells)
      mkdir -p "$WORK/rounding"; i=0
      for cell in "${cells[@]}"; do
        i=$((i + 1))
        IFS='|' read -r label catalogue dtype seed <<< "$cell"
        while [ "$(jobs -rp | wc -l)" -ge "${ROUND_JOBS:-12}" ]; do wait -n; done
        timeout "${ROUND_TIMEOUT:-540}" python3 scripts/mutation_table.py --catalogue "$catalogue" \
          --device "${ROUND_DEVICE:-cuda}" --dtype "$dtype" --limit "${ROUND_LIMIT:-20}" --max-new-tokens "${ROUND_TOKENS:-64}" \
          --budgets "${ROUND_BUDGETS:-16,64}" --run-seed "$seed" --threads 1 --only "$label" \
          --check ${ROUND_CHECKS:-lossless acceptance context-range near-ties golden tree-structure branch-vs-chain} \
          --json "$WORK/rounding/c$i-$catalogue-$dtype-s$seed.json" >"$WORK/rounding/c$i-$catalogue-$dtype-s$seed.log" 2>&1 &
        sleep 2
      done
      wait
      grep -h "^| \|NOT CAUGHT" "$WORK"/rounding/c*.log ;;
    profile-rounding)  # issue 28: where one CUDA cell of the rounding catalogue spends its time (cProfile, one process)
      mkdir -p "$WORK/profile"
      timeout "${PROFILE_TIMEOUT:-240}" python3 -m cProfile -o "$WORK/profile/cell.prof" scripts/mutation_table.py \
        --catalogue "${PROFILE_CATALOGUE:-rounding}" --device "${ROUND_DEVICE:-cuda}" --dtype "${PROFILE_DTYPE:-bfloat16}" \
        --limit "${PROFILE_LIMIT:-5}" --max-new-tokens 64 --budgets 16,64 --run-seed 1 --threads 1 \
        --only "${PROFILE_ONLY:-KV cache in float32}" \
        --check lossless acceptance context-range near-ties golden tree-structure branch-vs-chain >"$WORK/profile/cell.log" 2>&1
      tail -3 "$WORK/profile/cell.log"
      python3 -c "import pstats, sys; p = pstats.Stats(sys.argv[1]); p.sort_stats('tottime').print_stats(25); \
p.sort_stats('cumulative').print_stats(45)" "$WORK/profile/cell.prof" >"$WORK/profile/top.txt" 2>&1
      grep -A28 "ncalls" "$WORK/profile/top.txt" | head -30 ;;
    aggregates)
      mkdir -p "$WORK/aggregates"; export WORK
      for dtype in ${AGG_DTYPES:-bfloat16 float16}; do for seed in ${AGG_SEEDS:-1 2 3}; do echo "$dtype $seed"; done; done |
        xargs -P "$(nproc)" -n 2 sh -c 'timeout "${AGG_TIMEOUT:-540}" python3 scripts/aggregate_bands.py --dtypes "$0" \
          --limits 7 20 40 --run-seed "$1" --device "${AGG_DEVICE:-cpu}" --json "$WORK/aggregates/$0-s$1.json" \
          >"$WORK/aggregates/$0-s$1.log" 2>&1'
      grep -h "limit" "$WORK"/aggregates/*.log | grep -v Warn | tail -40 ;;
    round-parts)
      timeout "${PROFILE_TIMEOUT:-240}" python3 scripts/profile_round_parts.py --shape 8b --budgets ${PARTS_BUDGETS:-16 64} \
        --out "$WORK/round-parts" 2>&1 | grep -v "Loading\|USDT\|Warning\|warn" || echo "round-parts: exit $?" ;;
    skinny-gemm)
      timeout "${GEMM_TIMEOUT:-240}" python3 scripts/bench_skinny_gemm.py | tee "$WORK/skinny-gemm.md" || echo "skinny-gemm: exit $?" ;;
    pieces)  # issue 29 item 4: the round's host pieces against their tensor-only versions, per budget
      mkdir -p "$WORK/pieces"
      timeout "${PIECES_TIMEOUT:-300}" python3 scripts/bench_round_pieces.py --device cuda --repeats "${PIECES_REPEATS:-50}" \
        | tee "$WORK/pieces/table.md" || echo "pieces: exit $?" ;;
    calibrate-cpu|calibrate-cuda)
      device=${job#calibrate-}
      cp golden/fixture/MANIFEST.json "$WORK/manifest-$device.json"
      timeout "${CAL_TIMEOUT:-540}" python3 scripts/calibrate_near_tie.py --drafter golden/fixture/drafter \
        --engines "${CAL_ENGINES:-reference,all}" --dtypes ${CAL_DTYPES:-bfloat16 float16} --device "$device" \
        --jobs "${CAL_JOBS:-16}" --limit "${CAL_LIMIT:-80}" --flip-limit "${CAL_FLIP_LIMIT:-24}" \
        --budgets "${CAL_BUDGETS:-16,64,256}" --manifest "$WORK/manifest-$device.json" 2>&1 |
        grep -v "Loading weights\|FutureWarning\|forward_call" || echo "$job: exit $?" ;;
    setup-only) ;;  # the setup above only (the shim and the wheels), for commands run by hand after it
    *) echo "unknown job $job" >&2; exit 2 ;;  # not reached: every name was checked against JOBS before the setup
  esac
  echo "job $job: $((SECONDS - started)) s"
  pack
done
