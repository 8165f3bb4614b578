#!/usr/bin/env bash
# A throwaway PostgreSQL server for tests (Debian's package), as root.
#
#   postgres-test.sh start DIR    initdb in DIR on first use, start on
#                                 127.0.0.1 (the same port each time), print
#                                 the server's URL
#   postgres-test.sh stop DIR     stop it, keeping DIR (start again later)
#   postgres-test.sh destroy DIR  stop it if running and remove DIR
#
# DIR must lie under directories the `postgres` user may enter (not a
# mode-0700 temp dir). The server runs as that user (initdb refuses root), trusts
# local connections and skips fsync: test data only.
set -euo pipefail

cmd=${1:-} dir=${2:-}
[[ -n $cmd && -n $dir ]] || { echo "usage: $0 start|stop|destroy DIR" >&2; exit 2; }

bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
[[ -x $bindir/pg_ctl ]] || { echo "error: PostgreSQL is not installed (scripts/deps.sh installs it)" >&2; exit 1; }
as_postgres() { runuser -u postgres -- "$@"; }
running() { [[ -f $dir/data/postmaster.pid ]] && as_postgres "$bindir/pg_ctl" -D "$dir/data" status >/dev/null 2>&1; }

case $cmd in
  start)
    mkdir -p "$dir"
    chown postgres: "$dir"
    if [[ ! -f $dir/data/PG_VERSION ]]; then
      as_postgres "$bindir/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 --no-sync >"$dir/initdb.log" 2>&1 \
        || { cat "$dir/initdb.log" >&2; exit 1; }
    fi
    if [[ ! -f $dir/port ]]; then
      python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' >"$dir/port"
    fi
    port=$(cat "$dir/port")
    if ! running; then
      as_postgres "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
        -o "-h 127.0.0.1 -p $port -k $dir -c fsync=off -c max_connections=200" start >/dev/null \
        || { tail -n 20 "$dir/server.log" >&2; exit 1; }
    fi
    echo "postgres://postgres@127.0.0.1:$port/postgres"
    ;;
  stop)
    if running; then as_postgres "$bindir/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null; fi
    ;;
  destroy)
    if running; then as_postgres "$bindir/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null; fi
    rm -rf "$dir"
    ;;
  *) echo "usage: $0 start|stop|destroy DIR" >&2; exit 2 ;;
esac
