#!/usr/bin/env bash
# Make the project's Python environment and print its path.
#
# The heavy part (torch, kopf, ...: several GiB) lives outside the work tree in
# ${MLBENCH_CACHE:-~/.cache/mlbench}/venv-<python>-<key>, where the key hashes
# constraints.txt and the dependency lists of pyproject.toml; a second clone or a CI run
# reuses it. The project itself is then installed editable (seconds), and .venv in the
# work tree is a symlink to the cached environment.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
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

if [ ! -f "$venv/.complete" ]; then
  echo "creating $venv (first time only: downloads torch and friends)" >&2
  mkdir -p "$CACHE"
  rm -rf "$venv"  # a half-built environment (no .complete) is rebuilt from scratch
  "$PY" -m venv "$venv"
  echo "$deps" > "$venv/requirements.txt"
  "$venv/bin/pip" install -q -c constraints.txt -r "$venv/requirements.txt" setuptools >&2
  touch "$venv/.complete"
fi

"$venv/bin/pip" install -q --no-deps --no-build-isolation -e . >&2
ln -sfn "$venv" .venv
echo "$venv"
