# Sourced by scripts/demo and scripts/test: make .venv exist and match pyproject.toml, with the
# versions requirements/test.lock pins (pip constraints, also for the editable build's own
# environment; scripts/lock moves them). Re-installs only when either file changed (a stamp
# holds their hash), so repeat runs are fast.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv="${EXTENDER_VENV:-$root/.venv}"
python="${PYTHON:-python3}"
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "extender needs Python 3.11 or newer; '$python' is $("$python" --version 2>&1)" >&2
  exit 2
fi
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
stamp="$venv/.extender-stamp"
want=$(cat "$root/pyproject.toml" "$root/requirements/test.lock" | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "installing extender and its dependencies into $venv (log: $venv/install.log)" >&2
  pin=(env PIP_CONSTRAINT="$root/requirements/test.lock" "$venv/bin/python" -m pip install)
  if ! { "${pin[@]}" pip && "${pin[@]}" -e "$root[dev,plots,embedded]"; } > "$venv/install.log" 2>&1; then
    tail -n 40 "$venv/install.log" >&2
    echo "install failed; full log: $venv/install.log" >&2
    exit 1
  fi
  echo "$want" > "$stamp"
fi
export PATH="$venv/bin:$PATH"
cd "$root"
