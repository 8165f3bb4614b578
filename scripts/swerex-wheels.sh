#!/usr/bin/env bash
# swe-rex and its dependencies as wheels for a sandbox's Python (3.11 on
# x86-64 Debian), kept in a cache directory: the SWE-ReX test installs them
# inside a sandbox, which has no network. Fetched once, here, with the
# rest of the test dependencies; the tests themselves reach only loopback.
# Usage: scripts/swerex-wheels.sh DIR   (prints DIR)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$1
version=$(sed -n 's/^swerex = \["swe-rex==\([^"]*\)"\]/\1/p' sdk/python/pyproject.toml)
[ -n "$version" ] || { echo "no swe-rex pin in sdk/python/pyproject.toml" >&2; exit 1; }
if ! ls "$dir"/swe_rex-"$version"-*.whl >/dev/null 2>&1; then
    mkdir -p "$dir"
    python3 -m pip download --quiet --disable-pip-version-check --only-binary=:all: \
        --python-version 3.11 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux_2_28_x86_64 --platform any -d "$dir" "swe-rex==$version" >&2
fi
echo "$dir"
