#!/usr/bin/env bash
# How much a first write to fresh anonymous memory costs on this host, per
# 4 KiB page, chunk after chunk (kept mapped, so each chunk takes memory the
# earlier ones did not). On a VM whose hypervisor takes free guest pages back
# (free page reporting, ballooning), a chunk that lands on such pages costs
# several times more than one on pages the host still backs; a slope or a
# step from chunk to chunk shows where that starts. Also prints the VM's
# page-reporting counter before and after, where the kernel has one.
# Usage: bench/probes/first_touch.sh [CHUNKS] [MIB per chunk]   (default 12 512)
set -euo pipefail
CHUNKS=${1:-12}
MIB=${2:-512}
WORK=$(mktemp -d /tmp/dsec-first-touch.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
cat >"$WORK/touch.c" <<'CEOF'
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
int main(int argc, char **argv) {
    int chunks = atoi(argv[1]);
    size_t size = (size_t)atol(argv[2]) << 20;
    for (int k = 0; k < chunks; k++) {
        char *p = mmap(0, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) { perror("mmap"); return 1; }
        madvise(p, size, MADV_NOHUGEPAGE); /* one fault per 4 KiB page */
        double t = now();
        for (size_t i = 0; i < size; i += 4096) p[i] = 1;
        t = now() - t;
        printf("chunk %2d: %.2f us per page\n", k, t * 1e6 / (size / 4096));
        fflush(stdout);
    }
    return 0;
}
CEOF
cc -O2 -o "$WORK/touch" "$WORK/touch.c"
REPORTED=/sys/module/page_reporting/parameters/reported_kib
[ -r "$REPORTED" ] && echo "page reporting: $(cat "$REPORTED") KiB reported so far"
echo "$CHUNKS chunks of $MIB MiB, $(awk '/MemFree/ {print int($2 / 1024)}' /proc/meminfo) MiB free"
"$WORK/touch" "$CHUNKS" "$MIB"
[ -r "$REPORTED" ] && echo "page reporting: $(cat "$REPORTED") KiB reported so far"
exit 0
