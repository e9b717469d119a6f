#!/usr/bin/env bash
# On the GPU device machine, after the lease (hack/gpu-run.sh), in a short second call (carry .whl and .gpudata):
#
#   bash hack/gpu-check.sh
#
# The GPU-only checks that are tests or checks rather than figures (79 s of command on an H100, 2026-11-27):
#   - gloo on device tensors, two real ranks on the one GPU: all-reduce, broadcast, all-gather into one
#     buffer, and the gossip exchange staged through host memory (tests/runner/test_comm_devices.py,
#     whose cuda case is skipped on machines without a GPU);
#   - the parity of the fast and eager steps in each division with the parameters' movement beside it
#     (a difference of 0 is only meaningful next to how far the steps moved the parameters).
# Writes check.txt and the two benchmark JSONs under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONPATH=/tmp/site:crds:operator:runners:. MLBENCH_DATA_DIR=$PWD/.gpudata PYTHONUNBUFFERED=1
out=${OUT:-/tmp/out}
mkdir -p "$out"
code=0
# the repository's conftest registers the cluster plugin (kubernetes, kopf: not on the device)
timeout 100 python3 -m pytest -q -p no:cacheprovider --noconftest -rs tests/runner/test_comm_devices.py 2>&1 |
  tee "$out/check.txt" || code=1
for division in open closed; do
  flags=(--paths fast --max-epochs 1 --subset 4096 --profile 20)
  [ "$division" = open ] && flags+=(--bf16)
  echo "## $division parity" | tee -a "$out/check.txt"
  timeout 90 python3 benchmarks/runner_gpu_time_to_accuracy.py "${flags[@]}" --output "$out/$division-parity.json" 2>&1 |
    grep -v Warning | tee -a "$out/check.txt" || code=1
done
exit $code
