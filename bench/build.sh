#!/usr/bin/env bash
# Dockerfile builds: dsec's builder against buildah (Debian's package),
# side by side in one run, on the same base image (dsec's `python`, pushed
# to a local registry and pulled into buildah's own storage before timing)
# and the same Dockerfile of a software-engineering task's shape: useradd,
# WORKDIR, COPY of a repository of FILES small files, compileall over it,
# COPY of a tests directory, chown, USER. Per round, alternating: a build
# without cache, then an unchanged rebuild, on each side (CLI to CLI:
# `dsec image build -f` and `buildah bud --layers`).
# Usage: bench/build.sh [ROUNDS] [FILES]   (default 5 2000)
source "$(dirname "$0")/lib.sh"
ROUNDS=${1:-5}
FILES=${2:-2000}
bench_init build
bench_build
command -v buildah >/dev/null || { echo "buildah is missing: apt-get install buildah" >&2; exit 1; }
command -v docker-registry >/dev/null || { echo "docker-registry is missing: scripts/deps.sh" >&2; exit 1; }
# buildah's RUN steps in runc: Debian 12's crun refuses a hybrid cgroup
# layout (cgroup v1 controllers beside a v2 mount), which these hosts have.
command -v runc >/dev/null || { echo "runc is missing: scripts/deps.sh" >&2; exit 1; }
BUILDAH=(buildah --root "$WORK/buildah/root" --runroot "$WORK/buildah/run")

bench_start_dsec
REGISTRY_PID=""
BUILDAH_ROOT=$WORK/buildah
buildah_cleanup() {
    [ -n "$REGISTRY_PID" ] && kill "$REGISTRY_PID" 2>/dev/null && wait "$REGISTRY_PID" 2>/dev/null
    # buildah's overlay mounts live under its own root: drop its images, then
    # anything still mounted there.
    "${BUILDAH[@]}" rmi -a -f >/dev/null 2>&1
    grep -o " $BUILDAH_ROOT[^ ]*" /proc/mounts | sort -r | while read -r m; do umount "$m" 2>/dev/null; done
    "$DSEC" image gc --build-cache --images-dir "$IMAGES_DIR" >/dev/null 2>&1
    true
}
BENCH_CLEANUP_HOOK=buildah_cleanup

PORT=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
mkdir -p "$WORK/registry"
printf 'version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: %s\nhttp:\n  addr: 127.0.0.1:%s\n' \
    "$WORK/registry/data" "$PORT" >"$WORK/registry/config.yml"
docker-registry serve "$WORK/registry/config.yml" >"$WORK/registry/log" 2>&1 &
REGISTRY_PID=$!
for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$PORT/v2/" >/dev/null && break; sleep 0.1; done
BASE_REF=127.0.0.1:$PORT/bench/python:1
bench_log "base image: dsec's python, pushed to $BASE_REF for buildah"
"$DSEC" image push python "$BASE_REF" --images-dir "$IMAGES_DIR" >/dev/null
"${BUILDAH[@]}" pull --tls-verify=false "$BASE_REF" >/dev/null

CTX=$WORK/context
"$PY" - "$CTX" "$FILES" <<'PY'
import pathlib, sys
root, n = pathlib.Path(sys.argv[1]), int(sys.argv[2])
for i in range(n):
    p = root / "repo" / f"pkg{i % 40}" / f"mod{i}.py"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(f"def f{i}(x):\n    return x + {i}\n" * 20)
for i in range(20):
    t = root / "tests" / f"test_{i}.py"
    t.parent.mkdir(parents=True, exist_ok=True)
    t.write_text(f"def test_{i}():\n    assert True\n")
(root / "Dockerfile").write_text("""\
ARG BASE=python
FROM $BASE
RUN useradd -m agent
WORKDIR /app
COPY repo/ /app/
RUN python3 -m compileall -q /app
COPY tests/ /tests/
RUN chown -R agent /app
USER agent
""")
PY

OUT=$WORK/times.jsonl
: >"$OUT"
timed() { # timed SIDE KIND CMD...: one JSON line with the wall time
    local side=$1 kind=$2; shift 2
    local t0 t1
    t0=$(date +%s%N)
    "$@" >"$WORK/last.log" 2>&1 || { cat "$WORK/last.log" >&2; exit 1; }
    t1=$(date +%s%N)
    echo "{\"side\": \"$side\", \"kind\": \"$kind\", \"ns\": $((t1 - t0))}" >>"$OUT"
}
for r in $(seq 1 "$ROUNDS"); do
    bench_log "round $r of $ROUNDS"
    timed dsec cold "$DSEC" image build "bench-build:$r" -f "$CTX/Dockerfile" "$CTX" --no-cache
    timed buildah cold "${BUILDAH[@]}" bud --runtime runc --layers --no-cache \
        --pull=false --build-arg "BASE=$BASE_REF" -t "bench-build:$r" "$CTX"
    timed dsec rebuild "$DSEC" image build "bench-build:$r" -f "$CTX/Dockerfile" "$CTX"
    timed buildah rebuild "${BUILDAH[@]}" bud --runtime runc --layers \
        --pull=false --build-arg "BASE=$BASE_REF" -t "bench-build:$r" "$CTX"
done
layers=$("$DSEC" image inspect "bench-build:$ROUNDS" --images-dir "$IMAGES_DIR" | "$PY" -c 'import json,sys; print(len(json.load(sys.stdin)["manifest"]["layers"]))')
for r in $(seq 1 "$ROUNDS"); do "$DSEC" image rm "bench-build:$r" --images-dir "$IMAGES_DIR" >/dev/null; done

"$PY" - "$OUT" "$FILES" "$ROUNDS" "$layers" <<'PY' | tee "$RESULTS/build.md"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
files, rounds, layers = sys.argv[2], sys.argv[3], sys.argv[4]
def med(side, kind):
    return statistics.median(r["ns"] / 1e9 for r in rows if r["side"] == side and r["kind"] == kind)
print(f"| figure ({files} files, {rounds} rounds, median) | dsec | buildah | ratio |")
print("|---|---|---|---|")
for kind, label in (("cold", "build without cache"), ("rebuild", "unchanged rebuild")):
    d, b = med("dsec", kind), med("buildah", kind)
    print(f"| {label} | {d:.2f} s | {b:.2f} s | {d / b:.2f}x |")
print(f"\ndsec image: {layers} layers (the base's and one per filesystem step)")
PY
