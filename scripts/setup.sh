#!/usr/bin/env bash
# Set up everything meganeura needs on this machine, idempotently:
#   - a Python >= 3.12 virtual environment in .venv with the package and its dev/example extras;
#   - Vulkan on the CPU (lavapipe, Debian's mesa-vulkan-drivers) when it is missing, so that
#     machines without a GPU run the kernels too.
# Called by `make train` and `make test`; safe to run again (it skips what is already done).
set -euo pipefail
cd "$(dirname "$0")/.."

find_python() {
  local candidate
  for candidate in python3.13 python3.12 /root/.pyenv/versions/3.12*/bin/python3.12 \
                   /root/.pyenv/versions/3.13*/bin/python3.13 /usr/local/bin/python3.12 python3; do
    if command -v "$candidate" >/dev/null 2>&1 &&
       "$candidate" -c 'import sys, venv; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1; then
      command -v "$candidate"
      return 0
    fi
  done
  return 1
}

if [ ! -x .venv/bin/python ]; then
  if ! python=$(find_python); then
    echo "setup: meganeura needs Python >= 3.12 (egglog 14 requires it); none was found on PATH." >&2
    echo "setup: install python3.12 (with its venv module) and run this again." >&2
    exit 1
  fi
  echo "setup: creating .venv with $python"
  "$python" -m venv .venv
fi

stamp=.venv/.meganeura-installed
wanted=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$wanted" ]; then
  echo "setup: installing meganeura and its dependencies into .venv"
  .venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v '^WARNING: Location' || true
  .venv/bin/python -m pip install -q -e '.[dev]' 2>&1 | grep -v '^WARNING: Location' || true
  .venv/bin/python -c 'import meganeura, egglog, wgpu, sklearn' || { echo "setup: installation failed" >&2; exit 1; }
  echo "$wanted" > "$stamp"
fi

# lavapipe: without it wgpu falls back to an OpenGL adapter that lacks compute features.
if ! ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    echo "setup: installing mesa-vulkan-drivers (lavapipe, Vulkan on the CPU)"
    $sudo apt-get update -qq && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mesa-vulkan-drivers >/dev/null
  else
    echo "setup: warning: lavapipe (mesa-vulkan-drivers) is not installed and apt-get is not available;" >&2
    echo "setup: meganeura will only run if this machine has a Vulkan, Metal or DX12 GPU driver." >&2
  fi
fi
