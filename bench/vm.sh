#!/usr/bin/env bash
# Full VM benchmark (issue 4), in one run: boot to first exec of a
# `debian-vm` full VM (q35, SeaBIOS) through dsec vs the peer, a plain
# `qemu-system-x86_64 -M q35` boot of the same base image (its own overlay,
# the same devices) until the guest agent greets on its port. Alternated,
# one at a time. Accelerator: TCG where KVM cannot run the guest (the
# edge's probe; `--vm-accel` to force).
# Usage: bench/vm.sh [REPS]   (~1.5 min per rep under TCG)
# DSEC_VM_IMAGES_DIR: where debian-vm.qcow2 is (default <images>/vm/images).
source "$(dirname "$0")/lib.sh"
REPS=${1:-3}
bench_init vm
bench_build
VM_IMAGES=${DSEC_VM_IMAGES_DIR:-$IMAGES_DIR/vm/images}
[ -f "$VM_IMAGES/debian-vm.qcow2" ] || { echo "no $VM_IMAGES/debian-vm.qcow2: run dsec image setup" >&2; exit 1; }

bench_start_dsec --vm-images-dir "$VM_IMAGES"
bench_log "boot to first exec, $REPS each"
$PY "$BENCH_DIR/vm_bench.py" boot --reps "$REPS" --image "$VM_IMAGES/debian-vm.qcow2" --out "$RESULTS/vm_boot.json"
bench_stop_dsec >/dev/null
$PY "$BENCH_DIR/vm_bench.py" report "$RESULTS/vm_boot.json"
