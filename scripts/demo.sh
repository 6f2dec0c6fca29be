#!/usr/bin/env bash
# `make demo`, phase by phase, each timed; the table at the end. The SWE tasks are built
# (a Debian base, three packages' test suites screened for bugs) while the training extras
# (torch, Transformers, DeepSpeed) install: the two longest phases overlap.
set -euo pipefail
VENV=${VENV:-.venv}
BIN=$VENV/bin
PIP="$BIN/python -m pip --disable-pip-version-check -q"
phases=()

timed() {  # timed NAME CMD...: run CMD, remember how long it took
  local name=$1 start=$EPOCHREALTIME
  shift
  "$@"
  phases+=("$name|$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.0f", b - a}')")
}

swe_tasks() { bash scripts/services.sh --swe && $BIN/rockroll envs build-swe --demo; }
overlapped() {  # the training extras and the SWE tasks at once; either failing fails the demo
  swe_tasks > >(sed 's/^/[swe] /') 2>&1 &
  local swe=$!
  $PIP install -c constraints.txt -e '.[train]'
  wait "$swe"
}

demo_start=$EPOCHREALTIME
timed "install rockroll (no extras)" $PIP install -c constraints.txt -e .
timed "first sandbox answers" $BIN/rockroll sandbox run -- echo "a sandbox answered"
timed "train extras + SWE tasks (overlapped)" overlapped
timed "one rock/SWE-v0 episode" $BIN/python examples/swe_demo.py
timed "sandbox demo" $BIN/python examples/sandbox_demo.py
rm -rf runs/demo
timed "GRPO on FrozenLake, 50 steps" $BIN/rockroll train examples/frozenlake_cpu.yaml --steps 50 \
  --set logging.dir=runs/demo --set checkpoint.dir=runs/demo/ckpt
timed "reward curve" $BIN/python examples/show_curve.py runs/demo
phases+=("make demo, in all|$(awk -v a="$demo_start" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.0f", b - a}')")

echo
printf '%-40s %8s\n' "phase" "seconds"
for p in "${phases[@]}"; do printf '%-40s %8s\n' "${p%%|*}" "${p##*|}"; done
