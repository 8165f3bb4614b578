#!/usr/bin/env bash
# Builds every Rust binary in release mode, then the statically linked guest
# agent (scripts/build-agent.sh), which lands in target/release/dsec-agent
# next to target/release/dsec, where the edge looks for it.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "==> building dsec (release)"
cargo build --release --workspace --quiet
scripts/build-agent.sh
