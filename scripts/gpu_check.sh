#!/usr/bin/env bash
# The GPU checks in one run, for a machine with a CUDA GPU (docs/testing.md, "On a GPU"):
#   1. the gpu-marked tests, and the trainer tests whose engines then run on the device
#      (DeepSpeed ZeRO over NCCL, generation, offload, the update, SFT);
#   2. bench/gpu.py: a model of Qwen2.5-0.5B's shapes, generation / update / weight sync;
#   3. the demo's SFT then 10 GRPO steps (FrozenLake, held-out maps) through the CLI, on CUDA.
# Logs and the benchmark's JSON (8 files) go to OUT (default /tmp/gpu-check). Each
# part has its own time limit, so one that hangs leaves the others their time. Needs rockroll
# with its train extra importable by PYTHON (default python3).
set -u
OUT=${OUT:-/tmp/gpu-check}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
# PYTHONSAFEPATH: `python -m` must not put the checkout's root first on sys.path, where its
# rockroll/ folder would shadow a non-editable install of the package
export PYTHONUNBUFFERED=1 PYTHONSAFEPATH=1 ROCKROLL_BENCH_RESULTS="$OUT"

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/device.txt"
$PY -c "import torch, transformers, deepspeed; print('torch', torch.__version__, 'cuda', torch.version.cuda,
'transformers', transformers.__version__, 'deepspeed', deepspeed.__version__, 'gpu', torch.cuda.is_available())" \
    2>&1 | tee -a "$OUT/device.txt"

timeout "${TESTS_S:-300}" $PY -m pytest -p no:cacheprovider -v -rs --timeout 200 \
    tests/trainer/test_gpu.py tests/trainer/test_offload.py tests/trainer/test_deepspeed.py \
    tests/trainer/test_continuous.py tests/trainer/test_sampling.py tests/trainer/test_train.py \
    tests/trainer/test_sft.py 2>&1 | tee "$OUT/pytest.log" | tail -40

timeout "${BENCH_S:-150}" $PY bench/gpu.py 2>&1 | tee "$OUT/bench.log" | grep -v "^\[20"

run=$(mktemp -d) cfg=examples/frozenlake_demo_cpu.yaml
timeout "${SFT_S:-120}" $PY -m rockroll.cli sft "$cfg" --set logging.dir="$run" --set checkpoint.dir="$run/ckpt" \
    > "$OUT/train.log" 2>&1
echo "rockroll sft: exit $?"
timeout "${TRAIN_S:-120}" $PY -m rockroll.cli train "$cfg" --steps 10 --set model.init_from="$run/sft/model" \
    --set logging.dir="$run" --set checkpoint.dir="$run/ckpt" --set eval.every=5 >> "$OUT/train.log" 2>&1
echo "rockroll train: exit $?"; tail -3 "$OUT/train.log"
cp "$run/sft/eval.jsonl" "$OUT/sft_eval.jsonl"; cp "$run/eval.jsonl" "$OUT/train_eval.jsonl"
cp "$run/metrics.jsonl" "$OUT/train_metrics.jsonl"
exit 0
