# Sourced by bin/run and bin/test: a virtualenv in .venv with the locked requirements installed.
# Usage: . bin/_bootstrap.sh requirements.txt|requirements-dev.txt
# What is installed is the lock compiled from the named file (requirements.lock, requirements-dev.lock):
# every package, indirect ones included, at its locked version and checked against its locked hashes.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REQUIREMENTS="${1:-requirements.txt}"
LOCK="${REQUIREMENTS%.txt}.lock"

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

# Reinstall only when the lock changed. --require-hashes: a download that is not the one locked is refused.
# --no-deps: the lock names every package, so pip installs exactly those (pip 23's resolver, asked for a
# locked package's dependency with an extra, such as pytest-cov's coverage[toml], looked past the lock and
# refused it as unpinned); `pip check` then fails the setup if a package needs one the lock does not name.
stamp="$ROOT/.venv/.installed-$(sha256sum <"$ROOT/$LOCK" | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  echo "[setup] installing $LOCK"
  # (Compiled here, not at first import: without it, --no-compile, the install took 12 s less, but the test
  # run's first minute, three workers starting their stacks at once, each compiling the same modules, more.)
  "$ROOT/.venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --require-hashes \
    -r "$ROOT/$LOCK"
  "$ROOT/.venv/bin/python" -m pip check --disable-pip-version-check
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
