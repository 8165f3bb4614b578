#!/usr/bin/env bash
# Builds the guest agent as one statically linked binary (glibc static: no
# NSS, no dynamic loader) and copies it to release/dsec-agent under the
# cargo target dir ($CARGO_TARGET_DIR, target/ by default), where the edge
# and the image tooling look for it.
set -euo pipefail
cd "$(dirname "$0")/.."
target=x86_64-unknown-linux-gnu
out=${CARGO_TARGET_DIR:-target}
RUSTFLAGS="-C target-feature=+crt-static" cargo build --release -p dsec-agent --target "$target"
mkdir -p "$out/release"
# Copy, strip, then rename into place: a running agent keeps its old binary
# (overwriting it in place would fail with "text file busy").
# The workspace profile keeps line tables for backtraces; the copy that
# ships into sandboxes does not need them (the unstripped build stays under
# target/$target for debugging).
cp "$out/$target/release/dsec-agent" "$out/release/.dsec-agent.tmp"
strip "$out/release/.dsec-agent.tmp"
mv -f "$out/release/.dsec-agent.tmp" "$out/release/dsec-agent"
echo "built $out/release/dsec-agent"
