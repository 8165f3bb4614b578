#!/usr/bin/env bash
# MicroVM benchmarks (issue 4), in one run:
#   1. boot to first exec: a busybox microVM vs a busybox container vs the
#      peer, a plain `qemu-system-x86_64 -M microvm` boot of the same kernel
#      and initramfs to the guest's init (same tuned command line)
#   2. host PSS of idle microVMs at 128 MiB guest RAM (and where it goes:
#      guest RAM, TCG cache, QEMU's files, QEMU's anonymous memory) with the
#      defaults (balloon free page reporting at 128 KiB blocks, a 16 MiB
#      TCG translation cache), without free page reporting, and with the
#      old 64 MiB translation cache (--vm-tb-size-mb, TB_BIG)
#   3. node templates vs cold boots: create -> first exec of busybox microVMs
#      of 128 MiB restored from the node's template (the default) and booted
#      cold (--vm-templates false), and N idle ones of each: PSS, RSS, the
#      guest RAM private to each VM, the host's MemAvailable drop per VM
#      (TPL_ONLY=1 runs only this part)
# The accelerator is whatever the edge's probe chose (TCG on hosts whose KVM
# cannot run the guest kernel; the edge logs it).
# Usage: bench/microvm.sh [REPS] [IDLE_VMS]   (~2 min under TCG)
source "$(dirname "$0")/lib.sh"
REPS=${1:-7}
IDLE_VMS=${2:-4}
bench_init microvm
bench_build
GEN="$PY $BENCH_DIR/microvm_bench.py"

# 3. node templates vs cold boots, each under its own `dsec up`.
templates_vs_cold() {
    bench_log "3. templates: $REPS creations and $IDLE_VMS idle VMs restored from the node template"
    bench_start_dsec
    $GEN start --reps "$REPS" --n "$IDLE_VMS" --label "template" --out "$RESULTS/microvm_start_tpl.json"
    bench_stop_dsec >/dev/null
    bench_log "3'. the same, booted cold (--vm-templates false)"
    bench_start_dsec --vm-templates false
    $GEN start --reps "$REPS" --n "$IDLE_VMS" --label "cold boot" --out "$RESULTS/microvm_start_cold.json"
    bench_stop_dsec >/dev/null
}

if [ -n "${TPL_ONLY:-}" ]; then
    templates_vs_cold
    $GEN report "$RESULTS/microvm_start_tpl.json" "$RESULTS/microvm_start_cold.json"
    exit 0
fi

bench_start_dsec
KERNEL=$IMAGES_DIR/vm/kernel/vmlinuz
INITRAMFS=$(ls "$DATA_DIR"/edge/"$NODE"/vm/initramfs-*.cpio)
bench_log "1. boot to first exec, $REPS each"
$GEN boot --reps "$REPS" --kernel "$KERNEL" --initramfs "$INITRAMFS" --out "$RESULTS/microvm_boot.json"
bench_log "2. idle PSS of $IDLE_VMS microVMs, free page reporting on"
$GEN idle --n "$IDLE_VMS" --label "free page reporting" --out "$RESULTS/microvm_idle.json"
grep -o 'microVM acceleration.*' "$WORK/dsec.log" | head -1 >&2 || true
bench_stop_dsec >/dev/null
bench_log "2'. the same without free page reporting"
bench_start_dsec --vm-free-page-reporting false
$GEN idle --n "$IDLE_VMS" --label "no free page reporting" --out "$RESULTS/microvm_idle_no_fpr.json"
bench_stop_dsec >/dev/null
TB_BIG=${TB_BIG:-64}
bench_log "2''. the same with free page reporting and a ${TB_BIG} MiB translation cache"
bench_start_dsec --vm-tb-size-mb "$TB_BIG"
$GEN idle --n "$IDLE_VMS" --label "free page reporting, tb-size $TB_BIG MiB" --out "$RESULTS/microvm_idle_tb.json"
bench_stop_dsec >/dev/null

templates_vs_cold

$GEN report "$RESULTS/microvm_boot.json" "$RESULTS/microvm_idle.json" "$RESULTS/microvm_idle_no_fpr.json" "$RESULTS/microvm_idle_tb.json" \
    "$RESULTS/microvm_start_tpl.json" "$RESULTS/microvm_start_cold.json"
