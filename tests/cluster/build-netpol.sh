#!/usr/bin/env bash
# Build the test cluster's NetworkPolicy enforcer from its Go module: kube-router, run with only
# its firewall controller (--run-firewall; no BGP router, no IPVS proxy), one per real node inside
# the node's network namespace.  Output goes to a cache dir keyed by the version; a stamp file is
# written only after the build succeeded, so an interrupted build is redone.
#
# Why kube-router and not sigs.k8s.io/kube-network-policies: the latter queues packets to user
# space with nfqueue, and this machine's kernel lacks CONFIG_NETFILTER_NETLINK_QUEUE/NFT_QUEUE;
# kube-router enforces with iptables + ipset, which the kernel has (CONFIG_IP_SET, xt_set), and it
# works with any bridge CNI.  It needs the `ipset` binary (Debian package ipset; `make system-deps`).
#
# Usage: tests/cluster/build-netpol.sh            (prints the bin dir on stdout)
#        tests/cluster/build-netpol.sh --print-bin-dir
set -euo pipefail

KUBE_ROUTER_VERSION="${KUBE_ROUTER_VERSION:-v2.1.0}"
CACHE="${MLBENCH_CACHE:-$HOME/.cache/mlbench}"
KEY="netpol-kube-router-${KUBE_ROUTER_VERSION}"
BIN="${CACHE}/${KEY}/bin"
STAMP="${CACHE}/${KEY}/.complete"

if [[ "${1:-}" == "--print-bin-dir" || -f "${STAMP}" ]]; then
  echo "${BIN}"
  exit 0
fi
mkdir -p "${BIN}"
exec 9>"${CACHE}/.${KEY}.lock"
flock 9
if [[ -f "${STAMP}" ]]; then
  echo "${BIN}"
  exit 0
fi
command -v go >/dev/null || export PATH="/usr/local/go/bin:${PATH}"
start=$(date +%s)
echo "[build-netpol $(date +%H:%M:%S)] kube-router ${KUBE_ROUTER_VERSION}" >&2
CGO_ENABLED=0 GOFLAGS="-buildvcs=false" GOBIN="${BIN}" \
  go install -trimpath -ldflags="-s -w" "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router@${KUBE_ROUTER_VERSION}" >&2
"${BIN}/kube-router" --version >&2 || true
touch "${STAMP}"
echo "[build-netpol $(date +%H:%M:%S)] done in $(( $(date +%s) - start )) s" >&2
echo "${BIN}"
