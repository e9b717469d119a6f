#!/usr/bin/env bash
# Build the local cluster's binaries from Go modules only -- no release downloads:
# the control plane (kube-apiserver, kube-controller-manager, kube-scheduler, kubectl,
# etcd), kwok for simulated nodes, and the real node's agents (kubelet, kube-proxy, built
# from the same Kubernetes module as the control plane, and CoreDNS for cluster DNS).  Output goes to a cache dir keyed by all versions; a stamp file is
# written only after every binary succeeded, so an interrupted build is redone.
#
# Usage: tests/cluster/build-k8s.sh            (prints the bin dir on stdout)
#        tests/cluster/build-k8s.sh --print-bin-dir
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.34.4}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
COREDNS_VERSION="${COREDNS_VERSION:-v1.12.4}"

CACHE="${MLBENCH_CACHE:-$HOME/.cache/mlbench}"
KEY="k8s-${K8S_VERSION}-etcd-${ETCD_VERSION}-kwok-${KWOK_VERSION}-coredns-${COREDNS_VERSION}"
BIN="${CACHE}/${KEY}/bin"
STAMP="${CACHE}/${KEY}/.complete"

if [[ "${1:-}" == "--print-bin-dir" ]]; then
  echo "${BIN}"
  exit 0
fi

if [[ -f "${STAMP}" ]]; then
  echo "${BIN}"
  exit 0
fi

mkdir -p "${BIN}"
log() { echo "[build-k8s $(date +%H:%M:%S)] $*" >&2; }
# Clones share the cache: one builds while the others wait, then find the stamp.
exec 9>"${CACHE}/.${KEY}.lock"
flock 9
if [[ -f "${STAMP}" ]]; then
  echo "${BIN}"
  exit 0
fi
command -v go >/dev/null || export PATH="/usr/local/go/bin:${PATH}"
# etcd v3.6 and kwok v0.8 declare `go 1.26.0`; with GOTOOLCHAIN=local an older Go stops at `go get`.
GO_MIN=1.26
have_go="$(go env GOVERSION 2>/dev/null | sed 's/^go//')" || have_go=""
if [[ -z "${have_go}" ]] || [[ "$(printf '%s\n%s\n' "${GO_MIN}" "${have_go}" | sort -V | head -1)" != "${GO_MIN}" ]]; then
  log "needs Go ${GO_MIN} or newer (found: ${have_go:-none}); see README.md"
  exit 1
fi
start=$(date +%s)

export CGO_ENABLED=0
export GOFLAGS="-buildvcs=false"
# staging modules are versioned v0.<minor>.<patch>
STAGING_VERSION="v0${K8S_VERSION#v1}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/mlbench-k8s-build.XXXXXX")"
trap 'rm -rf "${WORK}"' EXIT

# ---------------------------------------------------------------- kubernetes
need_k8s=0
for b in kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy; do
  [[ -x "${BIN}/${b}" ]] || need_k8s=1
done
if [[ "${need_k8s}" == 1 ]]; then
  log "kubernetes ${K8S_VERSION} (staging ${STAGING_VERSION})"
  mkdir -p "${WORK}/k8s"
  cd "${WORK}/k8s"
  gomod="$(go mod download -json "k8s.io/kubernetes@${K8S_VERSION}" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')"
  [[ -f "${gomod}" ]] || { log "cannot find go.mod of k8s.io/kubernetes"; exit 1; }
  goversion="$(go env GOVERSION | sed 's/^go//')"
  {
    echo "module mlbench.local/k8sbuild"
    echo
    echo "go ${goversion}"
    echo
    echo "require k8s.io/kubernetes ${K8S_VERSION}"
    echo
    # every `k8s.io/X => ./staging/src/k8s.io/X` replace becomes a real version
    grep -E '^[[:space:]]*k8s.io/[^ ]+ => \./staging/' "${gomod}" \
      | awk -v v="${STAGING_VERSION}" '{print "replace " $1 " => " $1 " " v}'
  } > go.mod
  log "go get k8s.io/kubernetes@${K8S_VERSION}"
  # packages are pinned one by one: a bare package path means @upgrade
  go get "k8s.io/kubernetes/cmd/kube-apiserver@${K8S_VERSION}" \
    "k8s.io/kubernetes/cmd/kube-controller-manager@${K8S_VERSION}" \
    "k8s.io/kubernetes/cmd/kube-scheduler@${K8S_VERSION}" \
    "k8s.io/kubernetes/cmd/kubectl@${K8S_VERSION}" \
    "k8s.io/kubernetes/cmd/kubelet@${K8S_VERSION}" \
    "k8s.io/kubernetes/cmd/kube-proxy@${K8S_VERSION}"
  major="${K8S_VERSION#v}"; major="${major%%.*}"
  minor="${K8S_VERSION#v*.}"; minor="${minor%%.*}"
  build_date="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  ldflags="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X ${pkg}.gitVersion=${K8S_VERSION}"
    ldflags+=" -X ${pkg}.gitMajor=${major}"
    ldflags+=" -X ${pkg}.gitMinor=${minor}"
    ldflags+=" -X ${pkg}.gitTreeState=clean"
    ldflags+=" -X ${pkg}.buildDate=${build_date}"
  done
  for b in kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy; do
    if [[ -x "${BIN}/${b}" ]]; then continue; fi
    log "go build ${b}"
    go build -trimpath -ldflags "${ldflags}" -o "${BIN}/${b}.tmp" "k8s.io/kubernetes/cmd/${b}"
    mv "${BIN}/${b}.tmp" "${BIN}/${b}"
  done
  cd /
fi

# ---------------------------------------------------------------------- etcd
if [[ ! -x "${BIN}/etcd" ]]; then
  log "etcd ${ETCD_VERSION}"
  mkdir -p "${WORK}/etcd"
  cd "${WORK}/etcd"
  go mod init mlbench.local/etcdbuild >/dev/null 2>&1
  go get "go.etcd.io/etcd/server/v3@${ETCD_VERSION}"
  go build -trimpath -ldflags "-s -w" -o "${BIN}/etcd.tmp" go.etcd.io/etcd/server/v3
  mv "${BIN}/etcd.tmp" "${BIN}/etcd"
  cd /
fi

# ---------------------------------------------------------------------- kwok
if [[ ! -x "${BIN}/kwok" ]]; then
  log "kwok ${KWOK_VERSION}"
  GOBIN="${BIN}" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@${KWOK_VERSION}"
fi

# ------------------------------------------------------------------- coredns
if [[ ! -x "${BIN}/coredns" ]]; then
  log "coredns ${COREDNS_VERSION}"
  GOBIN="${BIN}" go install -trimpath -ldflags "-s -w" "github.com/coredns/coredns@${COREDNS_VERSION}"
fi

for b in kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy etcd kwok coredns; do
  [[ -x "${BIN}/${b}" ]] || { log "missing ${b}"; exit 1; }
done
end=$(date +%s)
echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) in $((end - start))s" > "${STAMP}"
log "done in $((end - start))s: ${BIN}"
echo "${BIN}"
