// The guest program of the QEMU test: /init of a small initramfs. Writes MIB MiB (from the
// kernel command line, `guestmem.mib=N`), reads it all back twice checking every word,
// prints a checksum on the console and powers the guest off.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <unistd.h>

static size_t mib_from_cmdline(void) {
    char buf[4096] = {0};
    FILE *f = fopen("/proc/cmdline", "r");
    if (f) { fread(buf, 1, sizeof buf - 1, f); fclose(f); }
    char *p = strstr(buf, "guestmem.mib=");
    return p ? strtoul(p + 13, 0, 10) : 64;
}

int main(void) {
    mount("proc", "/proc", "proc", 0, 0);
    size_t mib = mib_from_cmdline(), words = (mib << 20) / 8;
    uint64_t *a = malloc(words * 8);
    if (!a) { printf("guestmem: cannot allocate %zu MiB\n", mib); fflush(stdout); reboot(RB_POWER_OFF); }
    for (size_t i = 0; i < words; i++) a[i] = (i + 1) * 0x9e3779b97f4a7c15ull;
    uint64_t sum = 0;
    int ok = 1;
    for (int pass = 0; pass < 2 && ok; pass++)
        for (size_t i = 0; i < words; i++) {
            if (a[i] != (i + 1) * 0x9e3779b97f4a7c15ull) { printf("guestmem: wrong word %zu\n", i); ok = 0; break; }
            sum += a[i] >> pass;
        }
    printf("guestmem: %zu MiB %s, checksum %016llx\n", mib, ok ? "verified" : "WRONG", (unsigned long long)sum);
    fflush(stdout);
    sync();
    reboot(RB_POWER_OFF);
    return 0;
}
