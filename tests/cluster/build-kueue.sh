#!/usr/bin/env bash
# Build Kueue's manager (sigs.k8s.io/kueue/cmd/kueue) from its Go module and keep the module's
# CRDs (config/components/crd/bases) beside it, for the Kueue tests (tests/operator/test_kueue_cluster.py):
# the manager runs as a host process against the test cluster's kubeconfig, without its webhooks.
# Output goes to a cache dir keyed by the version; a stamp file is written only after the build
# succeeded, so an interrupted build is redone.
#
# Usage: tests/cluster/build-kueue.sh            (prints the install dir on stdout: bin/kueue, crds/)
#        tests/cluster/build-kueue.sh --print-dir
set -euo pipefail

KUEUE_VERSION="${KUEUE_VERSION:-v0.17.0}"
CACHE="${MLBENCH_CACHE:-$HOME/.cache/mlbench}"
KEY="kueue-${KUEUE_VERSION}"
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
echo "[build-kueue $(date +%H:%M:%S)] kueue ${KUEUE_VERSION}" >&2
CGO_ENABLED=0 GOFLAGS="-buildvcs=false" GOBIN="${DIR}/bin" \
  go install -trimpath -ldflags="-s -w" "sigs.k8s.io/kueue/cmd/kueue@${KUEUE_VERSION}" >&2
# The CRDs come from the same module source the manager was built from.
src="$(go env GOMODCACHE)/sigs.k8s.io/kueue@${KUEUE_VERSION}"
rm -rf "${DIR}/crds"
cp -r "${src}/config/components/crd/bases" "${DIR}/crds"
chmod -R u+w "${DIR}/crds"
touch "${STAMP}"
echo "[build-kueue $(date +%H:%M:%S)] done in $(( $(date +%s) - start )) s" >&2
echo "${DIR}"
