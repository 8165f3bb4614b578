#!/usr/bin/env bash
# Full VM benchmarks (issue 4), in one run:
#   1. boot to first exec of a `debian-vm` full VM (q35, SeaBIOS) through
#      dsec vs the peer, a plain `qemu-system-x86_64 -M q35` boot of the
#      same base image (its own overlay, the same devices) until the guest
#      agent greets on its port; alternated, one at a time
#   2. host memory of LAYER_VMS full VMs that all read one read-only layer
#      (the `python` image's, as a toolkit): shared by virtio-pmem with DAX
#      vs attached as virtio-blk disks; both rounds with the same VMs and
#      node settings, only --vm-layers differs (vm_bench.py layers says
#      exactly what is summed)
#   3. one full VM's cold boot vs SUSPEND_REPS rounds of suspend to disk and
#      restore to first exec
#   4. boot to first exec with network rules vs without, alternated,
#      NET_REPS of each, on a node started with a network configuration
# Accelerator: TCG where KVM cannot run the guest (the edge's probe).
# Usage: bench/vm.sh [REPS] [LAYER_VMS] [SUSPEND_REPS] [NET_REPS]   (0
# skips a part; ~1.5 min per rep, ~2 min per layer round, ~1 min + 5 s per
# suspend rep, ~1.5 min per network rep under TCG)
# DSEC_VM_IMAGES_DIR: where debian-vm.qcow2 is (default <images>/vm/images).
source "$(dirname "$0")/lib.sh"
REPS=${1:-3}
LAYER_VMS=${2:-4}
SUSPEND_REPS=${3:-5}
NET_REPS=${4:-3}
bench_init vm
bench_build
VM_IMAGES=${DSEC_VM_IMAGES_DIR:-$IMAGES_DIR/vm/images}
[ -f "$VM_IMAGES/debian-vm.qcow2" ] || { echo "no $VM_IMAGES/debian-vm.qcow2: run dsec image setup" >&2; exit 1; }
GEN="$PY $BENCH_DIR/vm_bench.py"

if [ "$REPS" -gt 0 ]; then
    bench_start_dsec --vm-images-dir "$VM_IMAGES"
    bench_log "1. boot to first exec, $REPS each"
    $GEN boot --reps "$REPS" --image "$VM_IMAGES/debian-vm.qcow2" --out "$RESULTS/vm_boot.json"
    bench_stop_dsec >/dev/null
    $GEN report "$RESULTS/vm_boot.json"
fi
if [ "$LAYER_VMS" -gt 0 ]; then
    for bus in pmem blk; do
        # Booting many VMs at once under TCG takes minutes: a longer timeout.
        bench_start_dsec --vm-images-dir "$VM_IMAGES" --vm-layers "$bus" --full-vm-boot-timeout-s 900
        bench_log "2. $LAYER_VMS VMs reading one layer by $bus"
        $GEN layers --n "$LAYER_VMS" --label "$bus" --out "$RESULTS/vm_layers_$bus.json"
        bench_stop_dsec >/dev/null
    done
    $GEN report "$RESULTS/vm_layers_pmem.json" "$RESULTS/vm_layers_blk.json"
fi
if [ "$SUSPEND_REPS" -gt 0 ]; then
    bench_start_dsec --vm-images-dir "$VM_IMAGES"
    bench_log "3. cold boot vs $SUSPEND_REPS suspend/restore rounds"
    $GEN suspend --reps "$SUSPEND_REPS" --out "$RESULTS/vm_suspend.json"
    bench_stop_dsec >/dev/null
    $GEN report "$RESULTS/vm_suspend.json"
fi
if [ "$NET_REPS" -gt 0 ]; then
    # Rules only: no test traffic leaves the node (nothing is sent).
    cat >"$WORK/network.json" <<JSON
{"subnet": "10.251.0.0/16", "pool_size": 2, "dns_upstream": ["127.0.0.1:53"],
 "services": {"bench": [{"cidr": "198.18.14.1/32", "ports": "80", "protocols": ["tcp"]}]}}
JSON
    bench_start_dsec --vm-images-dir "$VM_IMAGES" --network-config "$WORK/network.json"
    bench_log "4. boot with network rules vs without, $NET_REPS each"
    $GEN netboot --reps "$NET_REPS" --out "$RESULTS/vm_netboot.json"
    bench_stop_dsec >/dev/null
    $GEN report "$RESULTS/vm_netboot.json"
fi
