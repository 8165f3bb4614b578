#!/usr/bin/env bash
# Debian packages dsec needs at run time, for its images, tests and
# benchmarks. Idempotent: installs only what is missing.
set -euo pipefail

PACKAGES=(
  erofs-utils     # mkfs.erofs: builds the read-only image layers
  debootstrap     # builds the Debian-based default images (python, judge)
  busybox-static  # the busybox default image
  util-linux      # unshare/nsenter, used by tests
  iproute2        # ip, used by tests to inspect sandboxes' network
  iptables        # the node's masquerading rule for sandbox egress ("nat": true)
  crun            # the peer runtime the benchmarks compare against
  buildah         # the peer builder bench/build.sh compares Dockerfile builds against
  runc            # ...whose RUN steps run in runc (this crun refuses hybrid cgroup layouts)
  wrk             # compiled HTTP load generator for server-capacity benchmarks
  hyperfine       # command timing in benchmarks
  file            # checks that the guest agent is statically linked
  pkg-config
  skopeo          # writes docker-archive / pushes to a registry in the image import tests
  docker-registry # a real local OCI registry for the `dsec image pull` tests
  qemu-system-x86 # microVMs: QEMU's microvm machine
  qemu-utils      # qemu-img, for VM disk images
  e2fsprogs       # mkfs.ext4: a microVM's writable disk template
  btrfs-progs     # mkfs.btrfs: the node's disk of containers' writable layers and named volumes
  cpio            # tests check the initramfs the project writes
  clang           # compiles the egress eBPF programs (-target bpf) at build time
  libbpf-dev      # the headers those programs include (bpf_helpers.h)
  bpftool         # egress tests check no eBPF program is left attached
  syslinux        # full VM image (debian-vm): the BIOS boot loader, installed on FAT without a mount
  syslinux-common # its MBR boot code and UEFI modules
  syslinux-efi    # the UEFI boot loader of the same image (booted by OVMF)
  mtools          # writes the image's FAT boot partition in place (no loop device)
  dosfstools      # mkfs.fat for that partition
  ovmf            # UEFI firmware, for full VMs started with --vm-firmware ovmf
  sshfs           # bench/lazy_burst.sh: the node mounts the shared store over a shaped link
  socat           # ...that serves it from a network namespace (hands each connection to sftp-server)
  openssh-sftp-server # ...the SFTP server behind that link
  chromium        # the dashboard's tests drive Debian's headless Chromium with Playwright (no browser download)
  curl            # scripts/cluster-local.sh's health checks and join token; the benchmarks' API calls
  postgresql      # the cluster's shared state (dsec apiserver --database postgres://...); the store's tests run on it
)

missing_packages() {
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || echo "$p"
  done
}

# Two passes: apt may remove an installed package to satisfy another one's
# dependencies (a machine with qemu-utils from bookworm-backports loses it
# when qemu-system-x86 comes from bookworm), and the second pass installs the
# version that fits. Whatever is still missing after that is an error.
updated=
for pass in 1 2; do
  mapfile -t missing < <(missing_packages)
  ((${#missing[@]})) || break
  echo "==> installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  [[ -n $updated ]] || { apt-get update -qq; updated=1; }
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
done
mapfile -t missing < <(missing_packages)
if ((${#missing[@]})); then
  echo "error: Debian packages still missing after installing: ${missing[*]}" >&2
  exit 1
fi
