#!/usr/bin/env bash
# On the GPU device machine (after hack/gpu-bundle.sh here; carry .whl and .gpudata):
#
#   bash hack/gpu-run.sh smoke          # ~2 min: fast and eager paths, 1 epoch on 4096 images, step profile 50
#   bash hack/gpu-run.sh full           # fast, compiled and plain to 80 % side by side (the issue's ratio), profile 200
#   bash hack/gpu-run.sh open           # the open division: fast with bf16 autocast + channels_last, step profile 200
#   bash hack/gpu-run.sh eager ddp      # chosen paths to 80 % (fast, eager, ddp, plain), no profile
#
# Each to-80 % path takes ~3 min eager (issue 11's figures), so one call holds at most two slow paths
# within the device's 10-minute limit per command.
#
# Writes the log and the benchmark's JSON under $OUT. Options after "--" go to the benchmark
# (e.g. -- --bf16 for the open division).
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--help" ] || [ $# -eq 0 ]; then sed -n '2,13p' "$0"; exit 0; fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONPATH=/tmp/site:crds:operator:runners MLBENCH_DATA_DIR=$PWD/.gpudata PYTHONUNBUFFERED=1
out=${OUT:-/tmp/out}
mkdir -p "$out"
mode=$1
shift
extra=()
paths=()
while [ $# -gt 0 ]; do
  if [ "$1" = "--" ]; then shift; extra=("$@"); break; fi
  paths+=("$1"); shift
done
bench=(python3 benchmarks/runner_gpu_time_to_accuracy.py)
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv | tee "$out/gpu.txt"
python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)' | tee -a "$out/gpu.txt"
case $mode in
  smoke) "${bench[@]}" --max-epochs 1 --subset 4096 --paths fast eager --profile 50 --output "$out/smoke.json" "${extra[@]}" ;;
  full) "${bench[@]}" --paths fast compiled plain --profile 200 --output "$out/tta.json" "${extra[@]}" ;;
  open) "${bench[@]}" --paths fast --bf16 --profile 200 --output "$out/tta-open.json" "${extra[@]}" ;;
  *) "${bench[@]}" --paths "$mode" "${paths[@]}" --output "$out/tta-$mode.json" "${extra[@]}" ;;
esac 2>&1 | tee "$out/log.txt"
