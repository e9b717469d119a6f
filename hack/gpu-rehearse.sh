#!/usr/bin/env bash
# Rehearse the GPU machine's software here, on CPU, before device time is spent on it:
# the device's Python (3.12) and torch (2.11, its image's), the wheels hack/gpu-bundle.sh packs,
# and hack/gpu-run.sh itself, with the benchmark on --device cpu. An API or packaging difference
# shows up here in minutes instead of in a 15-minute lease.
#
#   bash hack/gpu-rehearse.sh                 # torch 2.11.0 under Python 3.12
#   TORCH=2.12.0 bash hack/gpu-rehearse.sh    # when the device's image moves on (device/KINDS.md)
#
# The environment is cached under ~/.cache/mlbench/, keyed by both versions (torch from PyPI with
# its CUDA libraries, ~3 GB once). The figures it prints are CPU smoke figures, not results.
set -euo pipefail
cd "$(dirname "$0")/.."
torch_version=${TORCH:-2.11.0}
py=${PY:-3.12}
env_dir=${XDG_CACHE_HOME:-$HOME/.cache}/mlbench/gpu-rehearsal-py$py-torch$torch_version
python=$(command -v "python$py" || true)
if [ -z "$python" ] || ! "$python" -c '' 2>/dev/null; then
  python=$({ find "$HOME/.pyenv/versions" -maxdepth 3 -path "*/$py*/bin/python$py" 2>/dev/null || true; } | sort -V | tail -1)
fi
[ -n "$python" ] || { echo "gpu-rehearse: no python$py here" >&2; exit 2; }
if [ ! -e "$env_dir/.complete" ]; then
  rm -rf "$env_dir"
  "$python" -m venv "$env_dir"
  "$env_dir/bin/python" -m pip install -q "torch==$torch_version" numpy pillow pyyaml prometheus-client
  touch "$env_dir/.complete"
fi
[ -d .whl ] && [ -d .gpudata ] || bash hack/gpu-bundle.sh
out=${OUT:-$(mktemp -d)}
# The device's whole plan, each stage shrunk to a CPU smoke run (no deadline here: CPU is slow).
PATH=$env_dir/bin:$PATH OUT=$out MLBENCH_GPU_SECONDS=3600 bash hack/gpu-run.sh lease -- \
  --device cpu --max-epochs 1 --subset 512 --workers 0 --profile 3
echo "gpu-rehearse: torch $torch_version, Python $py: the log and JSON are in $out"
