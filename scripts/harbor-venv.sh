#!/usr/bin/env bash
# A Python 3.12 virtual environment with Harbor (the version the SDK's
# `harbor` extra pins) and this SDK installed editable, kept in a cache
# directory: Harbor needs Python >= 3.12, the system's Python is older, and
# the Harbor test runs Harbor's own `harbor` command from it. Made once,
# here, with the rest of the test dependencies; the test itself reaches
# only loopback.
# Usage: scripts/harbor-venv.sh DIR   (prints DIR)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$1
pin=$(sed -n "s/^harbor = \[\"harbor==\([^;\"]*\).*/\1/p" sdk/python/pyproject.toml)
[ -n "$pin" ] || { echo "no harbor pin in sdk/python/pyproject.toml" >&2; exit 1; }
python=""
for candidate in python3.13 python3.12 "$(pyenv prefix 3.12 2>/dev/null)/bin/python3" "$(pyenv prefix 3.13 2>/dev/null)/bin/python3"; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
        python=$candidate
        break
    fi
done
[ -n "$python" ] || { echo "Harbor needs Python >= 3.12: none found (python3.12 on PATH, or pyenv)" >&2; exit 1; }
if [ "$("$dir/bin/python" -c 'import importlib.metadata as m; print(m.version("harbor"))' 2>/dev/null)" != "$pin" ]; then
    rm -rf "$dir"
    "$python" -m venv "$dir"
    "$dir/bin/python" -m pip install --quiet --disable-pip-version-check "harbor==$pin" >&2
fi
# The SDK from this tree (editable: the test runs what is checked out).
"$dir/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -e sdk/python >&2
"$dir/bin/python" -m pip install --quiet --disable-pip-version-check "aiohttp>=3.9" "multidict>=4.5" >&2
echo "$dir"
