# shellcheck shell=bash
# Sourced by the example scripts. One job: pick the interpreter, so that the scripts run from a
# fresh shell after `make demo` / `make install` (which put everything into this checkout's .venv)
# without activating anything, and still use the environment's python3 on a cluster node, where
# the package is installed into the image instead (no .venv there).

# default_python: $PYTHON when set, else this checkout's .venv/bin/python when it exists, else python3.
default_python() {
  if [ -n "${PYTHON:-}" ]; then echo "$PYTHON"; return; fi
  local repo
  repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
  if [ -x "$repo/.venv/bin/python" ]; then echo "$repo/.venv/bin/python"; else echo python3; fi
}
