#!/usr/bin/env bash
# Make the project's Python environment and print its path.
#
# The heavy part (torch, kopf, ...: several GiB) lives outside the work tree in
# ${MLBENCH_CACHE:-~/.cache/mlbench}/venv-<python>-<key>, where the key hashes
# constraints.txt and the dependency lists of pyproject.toml, so every clone and CI run
# shares it. It never holds the project itself: each checkout gets a small .venv of its
# own that sees the shared packages through a .pth file and has mlbench installed
# editable, so two checkouts never import each other's code.
set -euo pipefail
cd "$(dirname "$0")/.."

# MLBENCH_PYTHON, not PYTHON: make exports its own PYTHON (.venv/bin/python) when the caller has one set.
PY=${MLBENCH_PYTHON:-python3}
CACHE=${MLBENCH_CACHE:-$HOME/.cache/mlbench}
pyver=$("$PY" -c 'import sys; print(f"py{sys.version_info[0]}{sys.version_info[1]}")')
deps=$("$PY" - <<'PYEOF'
import tomllib
p = tomllib.load(open("pyproject.toml", "rb"))["project"]
deps = list(p["dependencies"])
for extra in ("operator", "runner", "dev"):
    deps += p["optional-dependencies"][extra]
print("\n".join(sorted(set(deps))))
PYEOF
)
key=$( (echo "$deps"; cat constraints.txt) | sha256sum | cut -c1-12)
venv="$CACHE/venv-$pyver-$key"

# Clones share the environment: one builds it while the others wait (flock), then they see .complete.
mkdir -p "$CACHE"
exec 9>"$CACHE/.venv-$pyver-$key.lock"
flock 9
if [ ! -f "$venv/.complete" ]; then
  echo "creating $venv (first time only: downloads torch and friends)" >&2
  rm -rf "$venv"  # a half-built environment (no .complete) is rebuilt from scratch
  "$PY" -m venv "$venv"
  echo "$deps" > "$venv/requirements.txt"
  "$venv/bin/pip" install -q -c constraints.txt -r "$venv/requirements.txt" setuptools >&2
  touch "$venv/.complete"
fi

# The shared environment must stay project-free (older versions installed mlbench there).
if [ -n "$(ls "$venv"/lib/python*/site-packages/ | grep -i '^__editable__.*mlbench' || true)" ]; then
  "$venv/bin/pip" uninstall -q -y mlbench mlbench-k8s >&2
fi
exec 9>&-  # the shared environment is complete and project-free: release it

if [ "$(cat .venv/.shared 2>/dev/null)" != "$venv" ]; then
  rm -rf .venv
  "$venv/bin/python" -m venv --without-pip .venv
  shared_site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  own_site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  # addsitedir (not a bare path line) so the shared site's own .pth files are processed too.
  echo "import site; site.addsitedir('$shared_site')" > "$own_site/_mlbench_shared.pth"
  ln -s "$venv/bin/ruff" .venv/bin/ruff
  echo "$venv" > .venv/.shared
fi
# The distribution was called "mlbench" before it became "mlbench-k8s": drop the old one (same console scripts).
if .venv/bin/python -m pip show -q mlbench >/dev/null 2>&1; then .venv/bin/python -m pip uninstall -q -y mlbench >&2; fi
.venv/bin/python -m pip install -q --no-deps --no-build-isolation -e . >&2

# Optional packages of this checkout's .venv only, outside the shared environment and its key: the
# "plots" extra (matplotlib; without it `mlbench results` draws its own SVG) and the test-only
# mlperf-logging, pinned in constraints-plots.txt; numpy, pillow etc. come from the shared
# environment (-c constraints.txt keeps pip from installing other versions of them here). Done once
# per pin set (.venv/.optional); MLBENCH_OPTIONAL=0 skips it; a failure (no registry) only warns, unless
# MLBENCH_REQUIRE_OPTIONAL=1 (CI: the tests of plots and of the MLPerf log would otherwise skip).
mapfile -t plots < <("$PY" -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["plots"]))')
optional_key=$( (printf '%s\n' "${plots[@]}"; cat constraints-plots.txt) | sha256sum | cut -c1-12)
if [ "${MLBENCH_OPTIONAL:-1}" != 0 ] && [ "$(cat .venv/.optional 2>/dev/null)" != "$optional_key" ]; then
  if .venv/bin/python -m pip install -q --no-warn-conflicts -c constraints.txt -c constraints-plots.txt "${plots[@]}" >&2 \
    && .venv/bin/python -m pip install -q --no-deps -c constraints-plots.txt mlperf-logging >&2; then
    echo "$optional_key" > .venv/.optional
  elif [ "${MLBENCH_REQUIRE_OPTIONAL:-0}" = 1 ]; then
    echo "error: the optional packages of constraints-plots.txt could not be installed (MLBENCH_REQUIRE_OPTIONAL=1)" >&2
    exit 1
  else
    echo "warning: the optional packages of constraints-plots.txt are not installed; plots use the built-in SVG" >&2
  fi
fi
echo "$venv"
