#!/usr/bin/env bash
# The second command of the README: the whole test suite (as root).
# Installs what it needs first, so it also works on a fresh machine.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/deps.sh
echo "==> building (release)"
cargo build --release --workspace --quiet
python3 -m pip install --quiet --disable-pip-version-check -e 'sdk/python[test]'

# The default images, shared with `dsec up`'s data dir (cached). The full
# VM image (debian-vm) carries the static guest agent: build it first.
scripts/build-agent.sh
IMAGES=${DSEC_TEST_IMAGES_DIR:-${DSEC_DATA_DIR:-/var/lib/dsec}/images}
DSEC_AGENT="$PWD/target/release/dsec-agent" target/release/dsec image setup --images-dir "$IMAGES"

export DSEC_BIN="$PWD/target/release/dsec"
export DSEC_AGENT="$PWD/target/release/dsec-agent"
export DSEC_TEST_IMAGES_DIR="$IMAGES"

echo "==> rustfmt and clippy (warnings are errors)"
cargo fmt --all --check
cargo clippy --workspace --all-targets --quiet -- -D warnings

echo "==> Rust tests (the shared store's on SQLite and on a throwaway PostgreSQL, kept for the cluster's end-to-end test)"
PG_DIR=$(mktemp -d -t dsec-test-pg.XXXXXX)
trap 'scripts/postgres-test.sh destroy "$PG_DIR"' EXIT
DSEC_TEST_POSTGRES=$(scripts/postgres-test.sh start "$PG_DIR")
export DSEC_TEST_POSTGRES
cargo test --release --workspace

# `cargo test` may have relinked target/release/dsec-agent dynamically; the
# end-to-end tests run the statically linked agent that users get.
scripts/build-agent.sh

# The SWE-ReX test's wheels for inside a sandbox (which has no network).
DSEC_TEST_SWEREX_WHEELS=$(scripts/swerex-wheels.sh "${DSEC_DATA_DIR:-/var/lib/dsec}/cache/swerex-wheels")
export DSEC_TEST_SWEREX_WHEELS
# Harbor (Python >= 3.12) in a venv of its own, for the Harbor test.
DSEC_TEST_HARBOR_VENV=$(scripts/harbor-venv.sh "${DSEC_DATA_DIR:-/var/lib/dsec}/cache/harbor-venv")
export DSEC_TEST_HARBOR_VENV

echo "==> Python SDK tests (unit and end-to-end against a real dsec up)"
python3 -m pytest sdk/python/tests -q -p no:cacheprovider

echo "==> E2B compatibility with the older SDK line"
scripts/test-e2b-older.sh

# The PostgreSQL the Rust tests and the cluster's end-to-end test shared.
scripts/postgres-test.sh destroy "$PG_DIR"
trap - EXIT
