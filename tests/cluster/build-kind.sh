#!/usr/bin/env bash
# Build kind (sigs.k8s.io/kind) from its Go module -- no release download -- for the kind recipe's test
# (tests/kind/: the shipped manifests/kind/cluster.yaml through kind's own loader and validation).
# Output goes to a cache dir keyed by the version; a stamp file is written only after the build
# succeeded, so an interrupted build is redone. `make test` starts it in the background (tests/cluster/cluster.mk).
#
# Usage: tests/cluster/build-kind.sh            (prints the install dir on stdout: bin/kind)
#        tests/cluster/build-kind.sh --print-dir
set -euo pipefail

KIND_VERSION="${KIND_VERSION:-v0.33.0}"
CACHE="${MLBENCH_CACHE:-$HOME/.cache/mlbench}"
KEY="kind-${KIND_VERSION}"
DIR="${CACHE}/${KEY}"
STAMP="${DIR}/.complete"

if [[ "${1:-}" == "--print-dir" || -f "${STAMP}" ]]; then
  echo "${DIR}"
  exit 0
fi
mkdir -p "${DIR}/bin"
exec 9>"${CACHE}/.${KEY}.lock"
flock 9
if [[ -f "${STAMP}" ]]; then
  echo "${DIR}"
  exit 0
fi
command -v go >/dev/null || export PATH="/usr/local/go/bin:${PATH}"
start=$(date +%s)
echo "[build-kind $(date +%H:%M:%S)] kind ${KIND_VERSION}" >&2
# A module build: the version is compiled in (pkg/cmd/kind/version), only the commit is left out.
CGO_ENABLED=0 GOFLAGS="-buildvcs=false" GOBIN="${DIR}/bin" \
  go install -trimpath -ldflags="-s -w" "sigs.k8s.io/kind@${KIND_VERSION}" >&2
"${DIR}/bin/kind" version >&2
touch "${STAMP}"
echo "[build-kind $(date +%H:%M:%S)] done in $(( $(date +%s) - start )) s" >&2
echo "${DIR}"
