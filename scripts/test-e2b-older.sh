#!/usr/bin/env bash
# The E2B compatibility tests again with the older SDK line that code still
# pins (the newest 2.4x release), in a virtual environment of its own: the
# SDK's test extras pin the newest 2.x. Needs what scripts/test.sh exports
# (DSEC_BIN, DSEC_AGENT, DSEC_TEST_IMAGES_DIR).
set -euo pipefail
cd "$(dirname "$0")/.."

E2B_OLDER=${E2B_OLDER:-2.49.1}
venv=$(mktemp -d)
trap 'rm -rf "$venv"' EXIT
python3 -m venv "$venv"
# Built from a copy: setuptools leaves build files beside the sources.
cp -r sdk/python "$venv/dsec-sdk"
rm -rf "$venv/dsec-sdk/build" "$venv/dsec-sdk"/*.egg-info
"$venv/bin/pip" install --quiet --disable-pip-version-check \
    "e2b==$E2B_OLDER" httpx pytest pytest-asyncio "$venv/dsec-sdk"
echo "==> E2B compatibility with e2b==$E2B_OLDER"
"$venv/bin/python" -m pytest sdk/python/tests/e2e/e2b -q -p no:cacheprovider
