#!/usr/bin/env bash
# Build Helm (helm.sh/helm/v3/cmd/helm) from its Go module -- no release download -- for the chart tests
# (tests/chart): `helm lint`, `helm template`, and install/upgrade/uninstall on the test cluster.
# Output goes to a cache dir keyed by the version; a stamp file is written only after the build
# succeeded, so an interrupted build is redone.
#
# Usage: tests/cluster/build-helm.sh            (prints the install dir on stdout: bin/helm)
#        tests/cluster/build-helm.sh --print-dir
set -euo pipefail

HELM_VERSION="${HELM_VERSION:-v3.22.0}"
CACHE="${MLBENCH_CACHE:-$HOME/.cache/mlbench}"
KEY="helm-${HELM_VERSION}"
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
echo "[build-helm $(date +%H:%M:%S)] helm ${HELM_VERSION}" >&2
# helm prints its version from these variables (a module build has no VCS stamp)
ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=${HELM_VERSION}"
CGO_ENABLED=0 GOFLAGS="-buildvcs=false" GOBIN="${DIR}/bin" \
  go install -trimpath -ldflags="${ldflags}" "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}" >&2
"${DIR}/bin/helm" version --short >&2
touch "${STAMP}"
echo "[build-helm $(date +%H:%M:%S)] done in $(( $(date +%s) - start )) s" >&2
echo "${DIR}"
