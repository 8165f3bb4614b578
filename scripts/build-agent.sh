#!/usr/bin/env bash
# Builds the guest agent as one statically linked binary (glibc static: no
# NSS, no dynamic loader) and copies it to target/release/dsec-agent, where
# the edge and the image tooling look for it.
set -euo pipefail
cd "$(dirname "$0")/.."
target=x86_64-unknown-linux-gnu
RUSTFLAGS="-C target-feature=+crt-static" cargo build --release -p dsec-agent --target "$target"
mkdir -p target/release
# Copy, strip, then rename into place: a running agent keeps its old binary
# (overwriting it in place would fail with "text file busy").
# The workspace profile keeps line tables for backtraces; the copy that
# ships into sandboxes does not need them (the unstripped build stays under
# target/$target for debugging).
cp "target/$target/release/dsec-agent" target/release/.dsec-agent.tmp
strip target/release/.dsec-agent.tmp
mv -f target/release/.dsec-agent.tmp target/release/dsec-agent
echo "built target/release/dsec-agent"
