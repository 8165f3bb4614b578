#!/usr/bin/env bash
# The first command of the README. On a fresh Debian 12 machine (as root):
# installs the Debian packages dsec needs, builds it, installs the `dsec`
# command and the Python SDK, prepares the default images (busybox, python),
# writes the node's default network configuration (the host's package
# indexes as the services `pypi`, `npm`, `debian`), starts the platform
# (`dsec up`) in the background and runs the paper's listing, with its
# network rules, against it.
set -euo pipefail
cd "$(dirname "$0")/.."

DATA_DIR=${DSEC_DATA_DIR:-/var/lib/dsec}
LISTEN=${DSEC_LISTEN:-127.0.0.1:8080}
PREFIX=${DSEC_PREFIX:-/usr/local}

scripts/deps.sh
scripts/build.sh

echo "==> installing dsec and dsec-agent into $PREFIX/bin"
for bin in dsec dsec-agent; do
  # Install beside, then rename: a running dsec keeps its old binary.
  install -m 0755 "target/release/$bin" "$PREFIX/bin/.$bin.new"
  mv -f "$PREFIX/bin/.$bin.new" "$PREFIX/bin/$bin"
done

echo "==> installing the Python SDK"
python3 -m pip install --quiet --disable-pip-version-check -e sdk/python

echo "==> preparing the default images in $DATA_DIR/images (cached after the first run)"
mkdir -p "$DATA_DIR"
"$PREFIX/bin/dsec" image setup --images-dir "$DATA_DIR/images"

echo "==> the node's network configuration: the host's own package indexes as services (kept if present)"
"$PREFIX/bin/dsec" network-config init --data-dir "$DATA_DIR"

if curl -fsS "http://$LISTEN/healthz" >/dev/null 2>&1; then
  echo "==> dsec is already running at http://$LISTEN"
else
  echo "==> starting dsec up (log: $DATA_DIR/dsec.log)"
  nohup "$PREFIX/bin/dsec" up --data-dir "$DATA_DIR" --listen "$LISTEN" >>"$DATA_DIR/dsec.log" 2>&1 &
  echo $! >"$DATA_DIR/dsec.pid"
  for _ in $(seq 1 100); do
    curl -fsS "http://$LISTEN/healthz" >/dev/null 2>&1 && break
    sleep 0.1
  done
  curl -fsS "http://$LISTEN/healthz" >/dev/null || { tail -20 "$DATA_DIR/dsec.log"; exit 1; }
fi

echo "==> running the paper's listing (examples/paper_listing.py)"
DSEC_ENDPOINT="http://$LISTEN" DSEC_TOKEN="$(cat "$DATA_DIR/admin-token")" python3 examples/paper_listing.py

cat <<MSG

dsec is up at http://$LISTEN (pid $(cat "$DATA_DIR/dsec.pid" 2>/dev/null || echo '?'), log $DATA_DIR/dsec.log).
  export DSEC_ENDPOINT=http://$LISTEN
  export DSEC_TOKEN=\$(cat $DATA_DIR/admin-token)
  dsec run python -- python3 -c 'print(1+1)'
  dsec ps
Stop it with: kill \$(cat $DATA_DIR/dsec.pid)
MSG
