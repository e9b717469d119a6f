#!/usr/bin/env bash
# Build grafana's dashboard-linter (github.com/grafana/dashboard-linter) from its Go
# module -- no release download -- into
#   ${MLBENCH_CACHE:-~/.cache/mlbench}/dashboard-linter-<version>/bin/dashboard-linter
# and print that path on stdout. A present binary is reused; the binary appears only
# once it is complete (built in a temp dir, then renamed), so an interrupted build is
# simply redone.
#
# `go install github.com/grafana/dashboard-linter@<version>` refuses the module because
# its go.mod has a `replace` directive (Go ignores replaces of non-main modules and so
# rejects them in `go install pkg@version`). We therefore build it as a dependency of a
# throwaway main module that requires the pinned version and copies its replaces:
# minimal version selection then picks exactly the versions of the linter's go.mod.
#
# When the build fails (for instance a Go module proxy that does not serve one of its
# dependencies), the reason is kept in <dir>/unavailable and repeated, without a new
# attempt, for the next ${DASHBOARD_LINTER_RETRY_DAYS:-7} days (or until --retry), so
# that `make lint` does not download ~1 GiB of modules on every call to fail the same way.
# Exit status: 0 built or present, 1 build failed, 2 known to be unavailable.
#
# Usage: hack/build-dashboard-linter.sh            (builds when missing; prints the binary)
#        hack/build-dashboard-linter.sh --retry    (ignores a recorded failure)
#        hack/build-dashboard-linter.sh --print-bin
set -euo pipefail

VERSION="${DASHBOARD_LINTER_VERSION:-v0.2.0}"
MODULE=github.com/grafana/dashboard-linter
CACHE="${MLBENCH_CACHE:-$HOME/.cache/mlbench}"
DIR="${CACHE}/dashboard-linter-${VERSION}"
BIN="${DIR}/bin/dashboard-linter"
UNAVAILABLE="${DIR}/unavailable"

if [[ "${1:-}" == "--print-bin" ]]; then
  echo "${BIN}"
  exit 0
fi
if [[ -x "${BIN}" ]]; then
  echo "${BIN}"
  exit 0
fi
# A registry's recent "no" (kept in UNAVAILABLE) is not asked again for DASHBOARD_LINTER_RETRY_DAYS.
refused_recently() {
  if [[ "${RETRY}" != "--retry" && -f "${UNAVAILABLE}" ]] \
    && [[ -n "$(find "${UNAVAILABLE}" -mtime "-${DASHBOARD_LINTER_RETRY_DAYS:-7}" 2>/dev/null)" ]]; then
    echo "build-dashboard-linter: ${MODULE}@${VERSION} could not be built here (not retried before" \
      "$(date -d "@$(($(stat -c %Y "${UNAVAILABLE}") + ${DASHBOARD_LINTER_RETRY_DAYS:-7} * 86400))" +%F)," \
      "or with --retry):" >&2
    sed 's/^/  /' "${UNAVAILABLE}" >&2
    exit 2
  fi
}
RETRY="${1:-}"
refused_recently

command -v go >/dev/null || export PATH="/usr/local/go/bin:${PATH}"
command -v go >/dev/null || { echo "build-dashboard-linter: needs Go (go.dev or /usr/local/go)" >&2; exit 1; }

log() { echo "[build-dashboard-linter $(date +%H:%M:%S)] $*" >&2; }
start=$(date +%s)

mkdir -p "${DIR}/bin"
# Clones share the cache dir (and its GOPATH, which a build removes when done): one builds while
# the others wait, then use its binary or its recorded refusal.
exec 9>"${DIR}.lock"
flock 9
if [[ -x "${BIN}" ]]; then
  echo "${BIN}"
  exit 0
fi
refused_recently
# GOPATH (module cache) and GOCACHE live in the cache dir and are removed after a
# successful build (the binary is all that is kept).
export GOPATH="${DIR}/gopath" GOCACHE="${DIR}/gocache"
export GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0
WORK="$(mktemp -d "${DIR}/build.XXXXXX")"
LOG="${WORK}/build.log"
cleanup() {
  local rc=$?
  if [[ ${rc} != 0 && -f "${LOG}" ]]; then
    grep -v '^go: downloading' "${LOG}" | tail -n 8 >&2 || true
    if grep -qE '403 Forbidden|404 Not Found|410 Gone|not available' "${LOG}"; then
      # a registry's final "no": keep the reason, free the downloaded modules
      grep -E '403 Forbidden|404 Not Found|410 Gone|not available' "${LOG}" | awk '!seen[$0]++' | tail -n 4 > "${UNAVAILABLE}"
      log "build failed: a module is not served; reason kept in ${UNAVAILABLE}"
      chmod -R u+w "${GOPATH}" 2>/dev/null || true
      rm -rf "${GOPATH}" "${GOCACHE}"
    else
      log "build failed (modules kept for the next attempt)"
    fi
  fi
  rm -rf "${WORK}"
  exit "${rc}"
}
trap cleanup EXIT
cd "${WORK}"

log "${MODULE}@${VERSION}"
log "downloading its modules (about 1 GiB) and building; Go's output goes to ${LOG}"
gomod="$(go mod download -json "${MODULE}@${VERSION}" 2>>"${LOG}" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')"
[[ -f "${gomod}" ]] || { echo "cannot download the go.mod of ${MODULE}@${VERSION}" >> "${LOG}"; exit 1; }
# Cheap check first (only .info/.mod files): is every direct requirement served? A fresh machine
# whose proxy refuses one then fails in seconds instead of after downloading ~1 GiB.
requires="$(awk '/^require[[:space:]]*\(/ {b = 1; next} b && /^\)/ {b = 0; next}
                 b && NF && $1 !~ /^\/\// {print $1 "@" $2} /^require[[:space:]]+[^(]/ {print $2 "@" $3}' "${gomod}")"
# shellcheck disable=SC2086 # one argument per module@version
if [[ -n "${requires}" ]] && ! go list -m -json ${requires} > /dev/null 2>> "${LOG}"; then
  exit 1
fi
{
  echo "module mlbench.local/dashboardlinter"
  echo
  echo "go $(sed -n 's/^go[[:space:]]\{1,\}\([0-9.]*\).*/\1/p' "${gomod}" | head -1)"
  echo
  echo "require ${MODULE} ${VERSION}"
  echo
  # the linter's replaces, single-line or in a block
  awk '/^replace[[:space:]]*\(/ {b = 1; next}
       b && /^\)/ {b = 0; next}
       b && NF {print "replace " $0; next}
       /^replace[[:space:]]/ {print}' "${gomod}"
} > go.mod
# (exit outside the redirection, so that the EXIT trap still writes to stderr)
if ! {
  go get "${MODULE}@${VERSION}" \
    && go build -trimpath -ldflags "-s -w" -o "${WORK}/dashboard-linter" "${MODULE}"
} >> "${LOG}" 2>&1; then
  exit 1
fi
"${WORK}/dashboard-linter" --help >/dev/null
mv -f "${WORK}/dashboard-linter" "${BIN}"
rm -f "${UNAVAILABLE}"

# the module cache is read-only by design
chmod -R u+w "${GOPATH}" 2>/dev/null || true
rm -rf "${GOPATH}" "${GOCACHE}"
log "built ${BIN} in $(($(date +%s) - start))s"
echo "${BIN}"
