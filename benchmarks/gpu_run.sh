#!/usr/bin/env bash
# The GPU speed benchmarks in one run, each part under its own time cap (about 7 minutes in all):
#   walltime   bench_walltime.py: the paper's wall-time protocol at LLaDA-8B's shape (SDE NFE 8-64 eager batch 1 on
#              3 prompts per dataset, compiled on XSum, batched, threshold-decoded remasking beside it)   <= 220 s
#   threshold  bench_threshold.py: threshold decoding's tokens per forward and samples/s, batch 1 and 16  <= 75 s
#   train      bench_train.py: one DSL training run of a ~1.3B LLaDA-shaped model, bf16, accelerate, 60 steps <= 120 s
# Results (JSON), the log and the machine's description go to $OUT (default /tmp/gpu_run). A part that fails or
# runs out of time is logged and the next part still runs.
#
#   GPU:  bash benchmarks/gpu_run.sh
#   CPU:  bash benchmarks/gpu_run.sh --tiny      (the same code paths at a tiny shape, about 2 minutes on 2 cores)
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_run}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
LOG="$OUT/gpu_run.log"
: > "$LOG"

if [ "${1:-}" = "--tiny" ]; then
  WALL=(--device cpu --layers 1 --datasets xsum cnndm --nfe 8 16 --samples 1 --threshold-samples 1 --batch 2
        --compiled-datasets --budget-s 60)
  THR=(--device cpu --layers 1 --batches 1 2 --prompt 32 --gen-length 64 --fixed-steps 16 --reps 1)
  TRAIN=(--tiny)
  CAPS=(240 120 120)
elif [ -n "${1:-}" ]; then
  echo "usage: bash benchmarks/gpu_run.sh [--tiny]   (got: $1)" >&2
  exit 2
else
  WALL=(--samples 3 --threshold-samples 1 --compiled-datasets xsum --compiled-nfe 16 --batch 8 --batched-nfe 16
        --budget-s 170)
  THR=(--batches 1 16 --prompt 128 --gen-length 128 --fixed-steps 32 --reps 3)
  TRAIN=(--steps 60)
  CAPS=(220 75 120)
fi

{
  date -u
  git log -1 --format='tree of %H' 2>/dev/null || true
  nvidia-smi 2>&1 | head -15 || true
  "$PY" -c 'import torch, accelerate, transformers; print("torch", torch.__version__, "accelerate", accelerate.__version__, "transformers", transformers.__version__)'
} > "$OUT/machine.txt" 2>&1

part() {  # part NAME CAP SCRIPT ARGS...
  local name=$1 cap=$2 script=$3
  shift 3
  echo "== $name (cap ${cap} s): $script $*" | tee -a "$LOG"
  local t0=$SECONDS
  timeout -k 10 "$cap" "$PY" "benchmarks/$script" "$@" --json "$OUT/$name.json" >> "$LOG" 2>&1
  echo "== $name rc=$? after $((SECONDS - t0)) s" | tee -a "$LOG"
}

part walltime "${CAPS[0]}" bench_walltime.py "${WALL[@]}"
part threshold "${CAPS[1]}" bench_threshold.py "${THR[@]}"
part train "${CAPS[2]}" bench_train.py "${TRAIN[@]}"
tail -n 40 "$LOG"
