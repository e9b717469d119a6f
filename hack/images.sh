#!/usr/bin/env bash
# Build the operator and runner images (Dockerfile.operator, Dockerfile.runner), cached by
# a hash of their inputs, and load them into the test node's containerd.
#
# Usage: hack/images.sh [--debian-base] [--load] [build|push|load|prune|base|wheelhouse|sbom|tags|oci-args DOCKERFILE|run-flags|hash DOCKERFILE]
#        (default: build)
#
#   build       base (if local) + wheelhouse (podman) + both images; a no-op when every
#               image already carries the label io.mlbench.inputs=<hash of its inputs>; then sbom
#   push        push both images (as built: build first) to their registry; refused for the default IMAGE_REPO,
#               which is a name for local images only (the project owns no Docker Hub namespace)
#   load        import both images into every node's containerd, $MLBENCH_CONTAINERD_ADDRESSES (space-separated;
#               else $MLBENCH_CONTAINERD_ADDRESS) in namespace k8s.io, skipped per image and node when it already
#               holds that image id; then prune
#   prune       remove the image-id refs ("sha256:...") no named image points to any more there: what
#               the CRI kept of images a load replaced (each old runner ~6 GB of the node's disk)
#   base        only the local Debian base image (mmdebstrap + import)
#   wheelhouse  only the wheelhouse (pip download of the hashed locks, locks/*.txt)
#   sbom        copy each built image's SBOM (CycloneDX JSON, at the path of its label io.mlbench.sbom) to
#               $MLBENCH_SBOM_DIR/<image name>-<tag>.cdx.json (default dist/sbom)
#   tags        print the image tags, one a line
#   oci-args D  the build arguments of Dockerfile D's OCI labels (VERSION, REVISION, SOURCE), one a line
#   run-flags   the flags `podman run` needs on this host (tests use them)
#   --debian-base  same as MLBENCH_BASE=local;  --load: build, then load (if the address is set)
#
# Environment:
#   MLBENCH_BUILDER   docker | podman (default: docker if its daemon answers, else podman)
#   BASE_IMAGE        the base of both images, pinned by digest: name@sha256:<64 hex> (pulled when missing; a
#                     tag is taken with a warning: not reproducible). Wins over MLBENCH_BASE.
#   MLBENCH_BASE      local | <image ref>. local (the default when mmdebstrap is installed):
#                     a Debian bookworm base built here, never pulled. Otherwise the ref is
#                     passed as BASE_IMAGE (the Dockerfiles' default is python:3.11-slim-bookworm).
#                     The images' labels org.opencontainers.image.base.name/.base.digest record the base:
#                     the ref and its digest (the ref's own, else the builder's manifest digest of it).
#   TORCH_INDEX       pip index for torch (e.g. https://download.pytorch.org/whl/cpu); empty
#                     (the default here) means PyPI, i.e. exactly what constraints.txt pins.
#   MLBENCH_RUNTIME_CC  the runner image's RUNTIME_CC: auto (default: gcc only with a CUDA TORCH_INDEX) | 1 | 0;
#                     1 for a GPU cluster with PyPI's torch, so that torch.compile (Triton) finds a compiler
#   MLBENCH_WHEELHOUSE  auto (default with podman) | off | a directory of wheels
#   MLBENCH_CACHE     where the wheelhouse lives (default ~/.cache/mlbench)
#   MLBENCH_PIP_CA    CA bundle handed to pip as a build secret (default: the host's, if any)
#   MLBENCH_IMAGE_TAG tag of both images (default: the project's version, pyproject.toml, as manifests/ reference them)
#   IMAGE_REPO        registry and repository of both images: <IMAGE_REPO>/mlbench-operator and
#                     <IMAGE_REPO>/mlbench-runner (default localhost/mlbench: what manifests/ and the test cluster use,
#                     for images side-loaded into the nodes; no registry the project does not control serves that
#                     name, and push refuses it). Point the operator at the runner with
#                     MLBENCH_RUNNER_IMAGE=<IMAGE_REPO>/mlbench-runner:<tag> (manifests/operator/deployment.yaml).
#   MLBENCH_SOURCE_URL  the images' org.opencontainers.image.source label (default: git's remote origin, if any)
#
# Each step prints "[images] <step>: <seconds>s" so cold and warm timings can be reported.
set -euo pipefail
cd "$(dirname "$0")/.."

# The project's version: one place, pyproject.toml's [project] version (the images' tag and version label).
project_version() { sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml | head -n 1; }
VERSION="$(project_version)"
TAG="${MLBENCH_IMAGE_TAG:-$VERSION}"
# Fully qualified: podman would prefix a short name with localhost/ and the kubelet with docker.io/. localhost/ is a
# name for side-loaded images that only the node itself could serve (mlbench_operator.policy.DEFAULT_IMAGE_REPO).
DEFAULT_IMAGE_REPO="localhost/mlbench"
IMAGE_REPO="${IMAGE_REPO:-$DEFAULT_IMAGE_REPO}"
IMAGE_REPO="${IMAGE_REPO%/}"
RUNNER_IMAGE="${IMAGE_REPO}/mlbench-runner:${TAG}"
OPERATOR_IMAGE="${IMAGE_REPO}/mlbench-operator:${TAG}"
INPUTS_LABEL="io.mlbench.inputs"
CACHE="${MLBENCH_CACHE:-$HOME/.cache/mlbench}"
TORCH_INDEX="${TORCH_INDEX-}"
PIP_CA="${MLBENCH_PIP_CA-/etc/ssl/certs/ca-certificates.crt}"
# The hashed locks the images install from (locks/, `make lock`); the wheelhouse holds their files.
WHEEL_LOCKS=(locks/runner.txt locks/operator.txt locks/sbom.txt)
SBOM_DIR="${MLBENCH_SBOM_DIR:-dist/sbom}"

log() { echo "[images] $*" >&2; }
die() { echo "[images] error: $*" >&2; exit 1; }

# since START: seconds elapsed since START (a `date +%s.%N` value), one decimal.
since() { awk -v s="$1" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }'; }

# timed STEP CMD...: run CMD, then log how long STEP took (also when it fails).
timed() {
  local step=$1 start rc=0
  shift
  start=$(date +%s.%N)
  "$@" || rc=$?
  log "${step}: $(since "$start")s$([ "$rc" = 0 ] || echo " (failed: exit ${rc})")"
  return "$rc"
}

# ------------------------------------------------------------------ builder
# Why not just `docker`: here /usr/local/bin/docker is a client without a daemon.
pick_builder() {
  if [ -n "${MLBENCH_BUILDER:-}" ]; then echo "$MLBENCH_BUILDER"; return; fi
  if command -v docker >/dev/null && timeout 10 docker info >/dev/null 2>&1; then echo docker; return; fi
  if command -v podman >/dev/null && timeout 30 podman info >/dev/null 2>&1; then echo podman; return; fi
  die "no image builder: neither a docker daemon (docker info) nor podman (podman info) answers"
}
BUILDER=""
builder() { [ -n "$BUILDER" ] || BUILDER=$(pick_builder); echo "$BUILDER"; }

# Flags every podman container (build steps included) needs on this kind of host: podman 4.3
# sets nofile/nproc to the host's limits by default, which a nested/limited host refuses
# ("error setting rlimit type 6: operation not permitted"; here anything above 32768
# processes is refused), and crun does not handle cgroups in hybrid mode, so runc runs the
# steps. Override with MLBENCH_PODMAN_FLAGS.
podman_flags() {
  if [ -n "${MLBENCH_PODMAN_FLAGS:-}" ]; then echo "$MLBENCH_PODMAN_FLAGS"; return; fi
  local nofile nproc
  nofile=$(ulimit -n)
  nproc=$(ulimit -u)
  if [ "$nofile" = unlimited ] || [ "$nofile" -gt 65536 ]; then nofile=65536; fi
  if [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ]; then nproc=32768; fi
  echo "--runtime=runc --ulimit=nofile=${nofile}:${nofile} --ulimit=nproc=${nproc}:${nproc}"
}

# image_label IMAGE LABEL: the label's value, empty when the image or the label is absent.
image_label() {
  "$(builder)" image inspect --format "{{ index .Config.Labels \"$2\" }}" "$1" 2>/dev/null | sed 's/^<no value>$//' || true
}
image_id() { "$(builder)" image inspect --format '{{.Id}}' "$1" 2>/dev/null | sed 's/^sha256://'; }
image_size() { "$(builder)" image inspect --format '{{.Size}}' "$1" 2>/dev/null | awk '{printf "%.0f MB", $1/1e6}'; }

# -------------------------------------------------------------------- base
# What the base is made of; any change here or in hack/base/ gives a new tag (and rebuilds the images).
BASE_SUITE=bookworm
BASE_MMDEBSTRAP_ARGS=(--variant=minbase --aptopt=hack/base/apt.conf --dpkgopt=hack/base/dpkg.cfg)
BASE_IMPORT_CHANGES=('ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' 'ENV LANG=C.UTF-8' 'CMD ["/bin/bash"]')

base_recipe_hash() {
  { cat hack/base/packages.txt hack/base/apt.conf hack/base/dpkg.cfg
    printf '%s\n' "$BASE_SUITE" "${BASE_MMDEBSTRAP_ARGS[@]}" "${BASE_IMPORT_CHANGES[@]}"; } | sha256sum | cut -c1-12
}
base_tag() { echo "localhost/mlbench-base:${BASE_SUITE}-$(base_recipe_hash)"; }

# Debian bookworm root file system -> image. hack/base/apt.conf and dpkg.cfg stay in the image
# (like the settings of Debian's official images: no .deb caches in layers, no docs); apt's
# lists are dropped (the Dockerfiles run apt-get update anyway).
base_build() {
  local tag=$1 pkgs tmp change rc=0
  pkgs=$(grep -v '^#' hack/base/packages.txt | grep -v '^$' | paste -sd, -)
  local -a changes=()
  for change in "${BASE_IMPORT_CHANGES[@]}" "LABEL io.mlbench.base-recipe=$(base_recipe_hash)"; do
    changes+=(--change "$change")
  done
  tmp=$(mktemp -d)
  mmdebstrap --quiet "${BASE_MMDEBSTRAP_ARGS[@]}" --include="$pkgs" \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
    "$BASE_SUITE" "$tmp/rootfs.tar" >&2 || rc=$?
  if [ "$rc" = 0 ]; then "$(builder)" import "${changes[@]}" "$tmp/rootfs.tar" "$tag" >/dev/null || rc=$?; fi
  rm -rf "$tmp"
  return "$rc"
}

# base_ref REF: REF, refused when its digest is malformed; a warning when it has none (a tag can move).
base_ref() {
  case "$1" in
    *@sha256:*) [[ $1 =~ @sha256:[0-9a-f]{64}$ ]] || die "BASE_IMAGE ${1}: a digest is sha256:<64 lowercase hex digits>" ;;
    *@*) die "BASE_IMAGE ${1}: only sha256 digests (name@sha256:<64 hex>)" ;;
    *) log "warning: base ${1} is a tag, not a digest: the build is not reproducible (BASE_IMAGE=name@sha256:...)" ;;
  esac
  echo "$1"
}

# base_digest REF: what the label org.opencontainers.image.base.digest records: REF's own digest (name@sha256:...),
# else the builder's manifest digest of the image (podman: .Digest; docker: its first RepoDigests entry).
base_digest() {
  case "$1" in *@sha256:*) echo "${1##*@}"; return ;; esac
  local digest
  digest=$("$(builder)" image inspect --format '{{.Digest}}' "$1" 2>/dev/null || true)
  if [[ ! $digest =~ ^sha256: ]]; then
    digest=$("$(builder)" image inspect --format '{{range .RepoDigests}}{{println .}}{{end}}' "$1" 2>/dev/null |
      sed -n '1s/.*@//p' || true)
  fi
  echo "$digest"
}

# ensure_base: the BASE_IMAGE build argument (empty: the Dockerfiles' default).
ensure_base() {
  local mode=${BASE_IMAGE:-${MLBENCH_BASE:-}}
  if [ -z "$mode" ]; then
    if command -v mmdebstrap >/dev/null; then mode=local; else mode=default; fi
  fi
  case "$mode" in
    default) echo "" ;;
    local)
      command -v mmdebstrap >/dev/null || die "MLBENCH_BASE=local needs mmdebstrap (apt-get install mmdebstrap)"
      local tag
      tag=$(base_tag)
      if "$(builder)" image exists "$tag" 2>/dev/null || "$(builder)" image inspect "$tag" >/dev/null 2>&1; then
        log "base: cached ${tag}"
      else
        log "base: building ${tag} (mmdebstrap bookworm, about a minute)"
        timed "base build" base_build "$tag" || die "building the base image ${tag} failed (see above)"
        # bases of older recipes are ours and unused from now on
        "$(builder)" images --format '{{.Repository}}:{{.Tag}}' localhost/mlbench-base | grep -vxF "$tag" |
          xargs -r "$(builder)" rmi >/dev/null 2>&1 || true
      fi
      echo "$tag"
      ;;
    *)
      base_ref "$mode" >/dev/null
      if ! "$(builder)" image inspect "$mode" >/dev/null 2>&1; then
        timed "base pull" "$(builder)" pull "$mode" >&2 || die "pulling the base image ${mode} failed"
      fi
      echo "$mode"
      ;;
  esac
}

# -------------------------------------------------------------- wheelhouse
# Every wheel both images install, downloaded once per set of locks into $CACHE, hash-checked (pip's own
# cache makes this a copy when the host venv was installed already), so an image build never
# downloads torch again and needs no index at all. The wheels are the images' (CPython 3.11 on
# bookworm's glibc 2.36, x86_64), whatever Python the host runs.
WHEEL_TARGET=(--only-binary=:all: --implementation cp --python-version 3.11 --abi cp311 --abi abi3 --abi none)
for n in $(seq 36 -1 5); do WHEEL_TARGET+=(--platform "manylinux_2_${n}_x86_64"); done
WHEEL_TARGET+=(--platform manylinux2014_x86_64 --platform manylinux2010_x86_64 --platform manylinux1_x86_64)
WHEEL_TARGET+=(--platform linux_x86_64 --platform any)

wheelhouse_dir() {
  local key
  key=$( (cat "${WHEEL_LOCKS[@]}"; printf '%s\n' "${WHEEL_TARGET[@]}") | sha256sum | cut -c1-12)
  echo "${CACHE}/wheelhouse-${key}"
}

host_pip() {
  local py
  py=$(cat .venv/.shared 2>/dev/null)/bin/python
  [ -x "$py" ] || py=$(command -v python3)
  "$py" -m pip "$@"
}

ensure_wheelhouse() {
  local dir
  dir=$(wheelhouse_dir)
  mkdir -p "$dir"
  # clones share it: one fills it while the others wait; the lock goes with this subshell's exit
  exec 8>"${dir}.lock"
  flock 8
  if [ -f "$dir/.complete" ]; then
    log "wheelhouse: cached ${dir}"
  else
    log "wheelhouse: filling ${dir}"
    # called in $(...), where errexit is off: a failed download must not be marked complete
    local lock
    local -a reqs=()
    for lock in "${WHEEL_LOCKS[@]}"; do reqs+=(-r "$lock"); done
    timed "wheelhouse" host_pip download --quiet "${WHEEL_TARGET[@]}" --dest "$dir" --require-hashes --no-deps \
      "${reqs[@]}" >&2 || return 1
    touch "$dir/.complete"
  fi
  echo "$dir"
}

# ------------------------------------------------------------ input hashes
# copy_sources DOCKERFILE: the context paths its COPY instructions (without --from) read.
copy_sources() {
  awk 'toupper($1) == "COPY" {
         from = 0; n = 0
         for (i = 2; i <= NF; i++) { if ($i ~ /^--from=/) from = 1; else if ($i !~ /^--/) args[++n] = $i }
         if (!from) for (i = 1; i < n; i++) print args[i]
       }' "$1" | sort -u
}

# inputs_hash DOCKERFILE BUILD_ARGS...: sha256 over the Dockerfile, every file it copies
# (path + content, without bytecode caches), .dockerignore and the build arguments
# (base image id included), so any change to what goes into the image rebuilds it.
inputs_hash() {
  local dockerfile=$1 src
  shift
  {
    sha256sum "$dockerfile" .dockerignore
    for src in $(copy_sources "$dockerfile"); do
      [ -e "$src" ] || die "$dockerfile copies $src, which does not exist"
      find "$src" -type f ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 | sort -z | xargs -0 sha256sum
    done
    printf '%s\n' "$@"
  } | sha256sum | cut -c1-16
}

# build_image NAME DOCKERFILE IMAGE BASE WHEELS [BUILD_ARG...]
build_image() {
  local name=$1 dockerfile=$2 image=$3 base=$4 wheels=$5 b extra
  shift 5
  b=$(builder)
  local -a args=()
  for extra in "$@"; do args+=(--build-arg "$extra"); done
  if [ -n "$base" ]; then
    args+=(--build-arg "BASE_IMAGE=${base}" --build-arg "BASE_DIGEST=$(base_digest "$base")")
    # the base's id, not its tag: a rebuilt base rebuilds the images
    args+=(--label "io.mlbench.base=${base}@$(image_id "$base")")
  fi
  if [ -n "$wheels" ]; then
    args+=(--build-arg PIP_FIND_LINKS=/wheels --build-arg PIP_NO_INDEX=1)
  fi
  local hash
  hash=$(inputs_hash "$dockerfile" "builder=$b" "${args[@]}")
  if [ "$(image_label "$image" "$INPUTS_LABEL")" = "$hash" ]; then
    log "${name}: cache hit ${image} (${INPUTS_LABEL}=${hash}, $(image_size "$image"))"
    return
  fi
  log "${name}: building ${image} (${INPUTS_LABEL}=${hash})"
  local -a cmd=("$b" build -f "$dockerfile" -t "$image" --label "${INPUTS_LABEL}=${hash}" "${args[@]}")
  if [ -f "$PIP_CA" ]; then cmd+=(--secret "id=pip-ca,src=${PIP_CA}"); fi
  if [ "$b" = podman ]; then
    # shellcheck disable=SC2207
    cmd+=($(podman_flags) --layers)
    if [ -n "$wheels" ]; then cmd+=(--volume "${wheels}:/wheels:ro"); fi
    if [ -n "$base" ]; then cmd+=(--pull=never); fi
  fi
  local previous
  previous=$(image_id "$image" || true)
  timed "${name} build" "${cmd[@]}" .
  log "${name}: ${image} $(image_size "$image")"
  # the image this build replaced is untagged now: drop it (several GB for the runner) unless a
  # container still uses it
  if [ -n "$previous" ] && [ "$previous" != "$(image_id "$image")" ]; then
    "$b" rmi "$previous" >/dev/null 2>&1 || true
  fi
}

# inputs_revision DOCKERFILE: the git commit that last changed the image's inputs (Dockerfile, .dockerignore, what it
# copies), "-dirty" when they differ from it; empty outside a git checkout. A commit elsewhere keeps the cache.
inputs_revision() {
  local -a paths
  read -r -a paths <<<"$1 .dockerignore $(copy_sources "$1" | tr '\n' ' ')"
  git rev-parse --git-dir >/dev/null 2>&1 || return 0
  local rev
  rev=$(git log -1 --format=%H -- "${paths[@]}" 2>/dev/null || true)
  [ -n "$rev" ] || return 0
  if [ -n "$(git status --porcelain -- "${paths[@]}" 2>/dev/null)" ]; then rev="${rev}-dirty"; fi
  echo "$rev"
}

# source_url: the images' org.opencontainers.image.source (MLBENCH_SOURCE_URL, else git's remote origin, if any),
# without its userinfo: a CI clone's remote often carries a token, and the label ships in every pushed image.
source_url() {
  echo "${MLBENCH_SOURCE_URL:-$(git config --get remote.origin.url 2>/dev/null || true)}" \
    | sed -E 's#^([A-Za-z][A-Za-z0-9+.-]*://)[^/@]*@#\1#'
}

# oci_args DOCKERFILE: the build arguments of its OCI labels, one a line.
oci_args() { printf '%s\n' "VERSION=${VERSION}" "REVISION=$(inputs_revision "$1")" "SOURCE=$(source_url)"; }

cmd_build() {
  local start base wheels=""
  start=$(date +%s.%N)
  log "builder: $(builder)"
  base=$(ensure_base)
  log "base image: ${base:-<Dockerfile default>}"
  case "${MLBENCH_WHEELHOUSE:-auto}" in
    off) ;;
    auto)
      # only podman can mount a directory into a build step; a non-PyPI torch index is not in it
      if [ "$(builder)" = podman ] && [ -z "$TORCH_INDEX" ]; then wheels=$(ensure_wheelhouse); fi
      ;;
    *) wheels=${MLBENCH_WHEELHOUSE} ;;
  esac
  local -a operator_oci runner_oci
  mapfile -t operator_oci < <(oci_args Dockerfile.operator)
  mapfile -t runner_oci < <(oci_args Dockerfile.runner)
  build_image operator Dockerfile.operator "$OPERATOR_IMAGE" "$base" "$wheels" "${operator_oci[@]}"
  build_image runner Dockerfile.runner "$RUNNER_IMAGE" "$base" "$wheels" "${runner_oci[@]}" \
    "TORCH_INDEX=${TORCH_INDEX}" "RUNTIME_CC=${MLBENCH_RUNTIME_CC:-auto}"
  log "total: $(since "$start")s"
}

# ------------------------------------------------------------------- load
# The node's containerd that load and prune work on now (each of MLBENCH_CONTAINERD_ADDRESSES in turn).
CTR_ADDRESS=""
ctr_() { ctr --address "$CTR_ADDRESS" --namespace k8s.io "$@"; }

# The builder's image id (its config digest), recorded as a containerd label at import: the
# same id means the same image, so a warm load is a no-op.
loaded_id() {
  ctr_ images ls "name==$1" 2>/dev/null | awk -v l="io.mlbench.image-id=" 'NR > 1 {
    n = split($NF, kv, ","); for (i = 1; i <= n; i++) if (index(kv[i], l) == 1) print substr(kv[i], length(l) + 1) }'
}

save_cmd() {
  if [ "$(builder)" = podman ]; then echo podman save --format docker-archive "$1"; else echo "$(builder)" save "$1"; fi
}

# Import one image into every node's containerd that lacks this id: streamed from the builder once, through a
# pipe per node (tee), so that the nodes import it at the same time and no copy of it lands on disk.
load_image() {
  local image=$1 id addr
  shift
  id=$(image_id "$image" || true)
  [ -n "$id" ] || die "${image} is not built (run make images)"
  local -a need=()
  for addr in "$@"; do
    CTR_ADDRESS=$addr
    if [ "$(loaded_id "$image")" = "$id" ]; then
      log "load: cached ${image} (id ${id:0:12}) in ${addr}"
    else
      need+=("$addr")
    fi
  done
  [ "${#need[@]}" -gt 0 ] || return 0
  log "load: importing ${image} (id ${id:0:12}, $(image_size "$image")) into ${need[*]}"
  local -a save
  read -r -a save <<<"$(save_cmd "$image")"
  # shellcheck disable=SC2317
  import_all() {
    local pipes i rc=0
    pipes=$(mktemp -d)
    local -a fifos=() pids=()
    for i in "${!need[@]}"; do
      mkfifo "${pipes}/${i}"
      fifos+=("${pipes}/${i}")
      CTR_ADDRESS=${need[$i]} ctr_ images import --snapshotter overlayfs - <"${pipes}/${i}" >/dev/null &
      pids+=($!)
    done
    "${save[@]}" | tee "${fifos[@]}" >/dev/null || rc=1
    for i in "${!pids[@]}"; do wait "${pids[$i]}" || rc=1; done
    rm -rf "$pipes"
    return "$rc"
  }
  timed "load ${image##*/} (${#need[@]} node(s))" import_all || die "importing ${image} into ${need[*]} failed"
  for CTR_ADDRESS in "${need[@]}"; do ctr_ images label "$image" "io.mlbench.image-id=${id}" >/dev/null; done
}

# The refs the CRI made by image id ("sha256:<config digest>") that no named ref points to any more: the
# images a new load replaced. Each old runner would keep its ~6 GB (layers and unpacked snapshot) for good,
# since only disk pressure makes the kubelet collect images. --sync: their content goes now.
prune_stale() {
  local listing named ref digest
  listing=$(ctr_ images ls 2>/dev/null | awk 'NR > 1 {print $1, $3}')
  named=$(awk '$1 !~ /^sha256:/ {print $2}' <<<"$listing")
  while read -r ref digest; do
    [[ $ref == sha256:* ]] || continue
    grep -qxF "$digest" <<<"$named" && continue
    if ctr_ images rm --sync "$ref" >/dev/null 2>&1; then log "load: removed ${ref:0:19}…, an image no name points to"; fi
  done <<<"$listing"
}

# Every node's containerd: MLBENCH_CONTAINERD_ADDRESSES (space-separated), else MLBENCH_CONTAINERD_ADDRESS.
addresses() {
  local list=${MLBENCH_CONTAINERD_ADDRESSES:-${MLBENCH_CONTAINERD_ADDRESS:-}} addr
  [ -n "$list" ] ||
    die "MLBENCH_CONTAINERD_ADDRESSES is not set (eval \"\$(python -m tests.cluster env)\" with the real nodes up)"
  for addr in $list; do
    [ -S "$addr" ] || die "containerd address ${addr}: no socket there"
    echo "$addr"
  done
}

cmd_load() {
  local -a list
  read -r -a list <<<"$(addresses | tr '\n' ' ')"
  load_image "$OPERATOR_IMAGE" "${list[@]}"
  load_image "$RUNNER_IMAGE" "${list[@]}"
  for CTR_ADDRESS in "${list[@]}"; do prune_stale; done
}

# ------------------------------------------------------------------- sbom
# Each image's SBOM, read from the image itself (the path its label io.mlbench.sbom names), into $SBOM_DIR.
sbom_out() { local name=${1##*/}; echo "${SBOM_DIR}/${name/:/-}.cdx.json"; }

copy_sbom() {
  local image=$1 path out cid rc=0
  path=$(image_label "$image" io.mlbench.sbom)
  [ -n "$path" ] || die "sbom: ${image} has no label io.mlbench.sbom (build it: make images IMAGE_REPO=${IMAGE_REPO})"
  out=$(sbom_out "$image")
  mkdir -p "$SBOM_DIR"
  cid=$("$(builder)" create "$image")
  "$(builder)" cp "${cid}:${path}" "$out" >/dev/null || rc=$?
  "$(builder)" rm "$cid" >/dev/null
  [ "$rc" = 0 ] && [ -s "$out" ] || die "sbom: copying ${path} out of ${image} failed"
  log "sbom: ${out} (${image}:${path})"
}

cmd_sbom() {
  copy_sbom "$OPERATOR_IMAGE"
  copy_sbom "$RUNNER_IMAGE"
}

cmd_prune() {
  local list
  list=$(addresses)
  for CTR_ADDRESS in $list; do prune_stale; done
}

# Flags (what tests/e2e passes) and commands.
cmd=""
load_after=0
while [ $# -gt 0 ]; do
  case "$1" in
    --debian-base) export MLBENCH_BASE=local ;;
    --load) load_after=1 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown flag $1 (--debian-base | --load)" ;;
    *) [ -z "$cmd" ] || break; cmd=$1 ;;
  esac
  shift
done

case "${cmd:-build}" in
  build)
    cmd_build
    if [ "$load_after" = 1 ]; then
      if [ -n "${MLBENCH_CONTAINERD_ADDRESSES:-${MLBENCH_CONTAINERD_ADDRESS:-}}" ]; then cmd_load
      else log "load: skipped (MLBENCH_CONTAINERD_ADDRESSES not set)"; fi
    fi
    ;;
  push)
    [ "$IMAGE_REPO" != "$DEFAULT_IMAGE_REPO" ] ||
      die "push: set IMAGE_REPO to your registry (make push IMAGE_REPO=registry.example.com/team); $DEFAULT_IMAGE_REPO is not the project's to push to"
    for image in "$OPERATOR_IMAGE" "$RUNNER_IMAGE"; do
      "$(builder)" image inspect "$image" >/dev/null 2>&1 || die "push: $image is not built (make images IMAGE_REPO=$IMAGE_REPO)"
      timed "push $image" "$(builder)" push "$image"
    done
    ;;
  load) cmd_load ;;
  prune) cmd_prune ;;
  base) ensure_base >/dev/null ;;
  wheelhouse) ensure_wheelhouse ;;
  sbom) cmd_sbom ;;
  tags) printf '%s\n' "$OPERATOR_IMAGE" "$RUNNER_IMAGE" ;;
  oci-args)
    [ $# = 1 ] || die "usage: hack/images.sh oci-args Dockerfile.runner|Dockerfile.operator"
    oci_args "$1"
    ;;
  run-flags) [ "$(builder)" = podman ] && podman_flags || true ;;
  hash)
    [ $# = 1 ] || die "usage: hack/images.sh hash Dockerfile.runner|Dockerfile.operator"
    inputs_hash "$1"
    ;;
  *) die "unknown command ${cmd} (build | push | load | base | wheelhouse | sbom | tags | oci-args DOCKERFILE | run-flags | hash DOCKERFILE)" ;;
esac
