# Sourced by bin/run and bin/test: a virtualenv in .venv with the pinned requirements installed.
# Usage: . bin/_bootstrap.sh requirements.txt|requirements-dev.txt
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REQUIREMENTS="${1:-requirements.txt}"

python_bin=""
for candidate in "${PYTHON:-}" python3.11 python3; do
  if [ -n "$candidate" ] && command -v "$candidate" >/dev/null 2>&1 \
     && "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    python_bin="$candidate"
    break
  fi
done
if [ -z "$python_bin" ]; then
  echo "Python 3.11 or newer is needed (set PYTHON=/path/to/python3.11)." >&2
  exit 1
fi

if [ ! -x "$ROOT/.venv/bin/python" ]; then
  echo "[setup] creating .venv with $python_bin"
  "$python_bin" -m venv "$ROOT/.venv"
fi

# Reinstall only when the pinned requirements changed.
stamp="$ROOT/.venv/.installed-$(cat "$ROOT/requirements.txt" "$ROOT/$REQUIREMENTS" | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  echo "[setup] installing $REQUIREMENTS"
  "$ROOT/.venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$ROOT/$REQUIREMENTS"
  touch "$stamp"
fi

# Debian packages the product or its tests need, installed when their command is missing.
debian_install() {  # debian_install <command> <package>
  if ! command -v "$1" >/dev/null 2>&1; then
    echo "[setup] installing $2 (Debian package)"
    local sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    $sudo apt-get update -q && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$2"
  fi
}

# Redis 7.0 or later (the scripts are a Redis Functions library): the embedded one, and the tests' own.
debian_install redis-server redis-server
