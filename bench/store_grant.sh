#!/usr/bin/env bash
# The token check every API request makes (`Store::grant`), on each engine
# of the shared store: SQLite (`dsec up`: an in-memory index) and a local
# PostgreSQL over TCP loopback (apiserver replicas: one indexed query).
# Usage: bench/store_grant.sh [ITERATIONS]   (default 20000, ~30 s)
source "$(dirname "$0")/lib.sh"
ITER=${1:-20000}
bench_init store_grant
bench_build
# Not under $WORK (mode 0700): the server runs as the postgres user.
PG_DIR=$(mktemp -d /tmp/dsec-bench-pg.XXXXXX)
trap '"$REPO/scripts/postgres-test.sh" destroy "$PG_DIR"; bench_cleanup' EXIT
URL=$("$REPO/scripts/postgres-test.sh" start "$PG_DIR")
"$BENCH" store-grant --database "sqlite:$WORK/apiserver.db" --iterations "$ITER" --out "$RESULTS/store_grant_sqlite.json"
"$BENCH" store-grant --database "$URL" --iterations "$ITER" --out "$RESULTS/store_grant_postgres.json"
