#!/usr/bin/env bash
# Pack what the GPU device machine lacks, for issue 11's measurements (docs/runner.md, "On the GPU machine").
#
# The device image has torch, numpy, prometheus-client and pyyaml but not pydantic or structlog, and
# ../shared does not travel. This writes, into git-ignored folders of the checkout:
#   .whl/      wheels (cp312, manylinux x86-64) of the missing pure-Python packages, at this venv's versions
#   .gpudata/  the JPEG copy of CIFAR-10
# Then call the device tool's run with carry [".whl", ".gpudata"] and the command hack/gpu-run.sh prints
# with --help (it installs the wheels and runs the benchmark on the device).
set -euo pipefail
cd "$(dirname "$0")/.."

py=.venv/bin/python
packages=$("$py" - <<'PYEOF'
import importlib.metadata as md
names = ["pydantic", "pydantic-core", "annotated-types", "typing-inspection", "typing-extensions", "structlog"]
print(" ".join(f"{n}=={md.version(n)}" for n in names))
PYEOF
)
# into new folders first: a failed download (no registry) leaves the previous bundle as it was
rm -rf .whl.new .gpudata.new
mkdir -p .whl.new .gpudata.new
platforms=()
for n in 39 35 34 31 28 27 24 17; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
# shellcheck disable=SC2086  # one word per package
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" --platform manylinux2014_x86_64 --platform any -d .whl.new $packages
cp "${MLBENCH_DATA_DIR:-../shared/datasets}/cifar10-jpeg.tar.gz" .gpudata.new/
rm -rf .whl .gpudata
mv .whl.new .whl
mv .gpudata.new .gpudata
du -sh .whl .gpudata
echo "carry: [\".whl\", \".gpudata\"]   command: bash hack/gpu-run.sh lease   (timeout_s 600; one call, all stages)"
