#!/usr/bin/env bash
# MicroVM suspend/resume and snapshot forks (issue 4), in one run:
#   suspend to disk and resume of one busybox microVM (256 MiB), with the
#   bytes on disk, against the peer: QEMU's plain `migrate` of the same VM
#   to a file and its restore in a second QEMU; cold boot for the ratio;
#   fork(snapshot, N) to every child's first exec.
# Usage: bench/microvm_snap.sh [REPS] [FORK_N]   (~1 min under TCG)
source "$(dirname "$0")/lib.sh"
REPS=${1:-5}
FORK_N=${2:-2}
bench_init microvmsnap
bench_build
bench_start_dsec
$PY "$BENCH_DIR/microvm_snap_bench.py" run --reps "$REPS" --fork "$FORK_N" --out "$RESULTS/microvm_snap.json"
grep -o 'microVM acceleration.*' "$WORK/dsec.log" | head -1 >&2 || true
# Where each resume's time went, as the edge logged it (QEMU start to QMP,
# device state load, cont, the agent's greeting; the plan and the total).
grep -o 'restored a VM.*\|resumed from suspend.*' "$WORK/dsec.log" | sed 's/\x1b\[[0-9;]*m//g' >"$RESULTS/microvm_snap_restores.log" || true
bench_stop_dsec >/dev/null
$PY "$BENCH_DIR/microvm_snap_bench.py" report "$RESULTS/microvm_snap.json" "$RESULTS/microvm_snap_restores.log"
