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
# The ldflags of helm's Makefile for a release: its version (a module build has no VCS stamp) and the default
# Kubernetes version of `helm template`/`helm lint` (client-go's v0.X -> 1.X; without them helm assumes 1.20).
gomod="$(go mod download -json "helm.sh/helm/v3@${HELM_VERSION}" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')"
client_go="$(awk '$1 == "k8s.io/client-go" {print $2}' "${gomod}")"
[[ "${client_go}" =~ ^v0\.([0-9]+)\. ]] || { echo "build-helm: no k8s.io/client-go v0.X in ${gomod}" >&2; exit 1; }
minor="${BASH_REMATCH[1]}"
ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=${HELM_VERSION} -X helm.sh/helm/v3/internal/version.metadata="
for pkg in pkg/lint/rules pkg/chartutil; do
  ldflags+=" -X helm.sh/helm/v3/${pkg}.k8sVersionMajor=1 -X helm.sh/helm/v3/${pkg}.k8sVersionMinor=${minor}"
done
CGO_ENABLED=0 GOFLAGS="-buildvcs=false" GOBIN="${DIR}/bin" \
  go install -trimpath -ldflags="${ldflags}" "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}" >&2
"${DIR}/bin/helm" version --short >&2
touch "${STAMP}"
echo "[build-helm $(date +%H:%M:%S)] done in $(( $(date +%s) - start )) s" >&2
echo "${DIR}"
