/*
 * uswap from C: a pager with a 16 MiB resident limit, a region four times that size filled
 * with a pattern and read back byte by byte (so most of it goes to swap and comes back), a
 * datagram received into a page that is out (in signal mode through the system-call guard,
 * which the pager is made with while this process has one thread), the counters, a lower
 * limit, and a few refused calls with their messages.
 *
 * Build and run (README, "C API"):
 *   cargo build -p uswap-capi
 *   cc -std=c11 -Wall -Wextra -I uswap-capi/include uswap-capi/examples/example.c \
 *      -L target/debug -luswap -Wl,-rpath,"$PWD/target/debug" -o example
 *   ./example [thread|signal] [DEVICE-LIST]
 *
 * Exit status: 0 when every byte read back right and the counters are as expected, 1 when a
 * check failed, 2 when a uswap call failed that should not have.
 */
#define _DEFAULT_SOURCE /* socketpair */
#include <inttypes.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "uswap.h"

#define MIB (UINT64_C(1) << 20)
#define LIMIT_BYTES (16 * MIB)
#define REGION_BYTES (4 * LIMIT_BYTES)
/* The engine's bound on the resident size: the limit plus one reclaim batch of 32 pages. */
#define RECLAIM_BATCH_PAGES 32

/* Reports a failed call that should have succeeded, and exits. */
static void must(int status, const char *what)
{
    if (status != USWAP_OK) {
        fprintf(stderr, "%s failed: %d (%s): %s\n", what, status, uswap_strerror(status), uswap_last_error());
        exit(2);
    }
}

/* A call that must be refused with `expected`: prints the message a user would see. */
static int refused(int status, int expected, const char *what)
{
    if (status != expected) {
        fprintf(stderr, "%s returned %d, expected %d (%s)\n", what, status, expected, uswap_strerror(expected));
        return 0;
    }
    printf("refused as expected: %s = %d (%s): %s\n", what, status, uswap_strerror(status), uswap_last_error());
    return 1;
}

/* Byte `i` of the pattern: every byte depends on its offset, no page repeats another. */
static uint8_t pattern_byte(uint64_t i)
{
    uint64_t z = (i >> 3) * UINT64_C(0x9E3779B97F4A7C15);
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z ^= z >> 27;
    return (uint8_t)(z >> ((i & 7) * 8));
}

/* Receives one datagram of a page into `page` (which may be out): 1 if every byte came. In
 * signal mode without the guard the kernel fails the recv with EFAULT and the datagram is
 * lost; with it, the page is brought in first. */
static int datagram_into(uint8_t *page, size_t len)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_DGRAM, 0, sv) != 0) {
        perror("socketpair");
        return 0;
    }
    uint8_t *data = malloc(len);
    if (data == NULL) {
        return 0;
    }
    for (size_t k = 0; k < len; k++) {
        data[k] = pattern_byte(k * 7919 + 13);
    }
    int ok = send(sv[0], data, len, 0) == (ssize_t)len;
    ssize_t got = recv(sv[1], page, len, MSG_DONTWAIT);
    if (got != (ssize_t)len) {
        perror("recv into a page that was out");
        ok = 0;
    } else if (memcmp(page, data, len) != 0) {
        fprintf(stderr, "recv: the page does not hold the datagram\n");
        ok = 0;
    }
    free(data);
    close(sv[0]);
    close(sv[1]);
    return ok;
}

static void print_stats(const uswap_stats *s)
{
    printf("stats: pswpout=%" PRIu64 " pswpin=%" PRIu64 " pgfault=%" PRIu64 " pgfault_zero=%" PRIu64
           " pgfault_swapcache=%" PRIu64 " pgmajfault=%" PRIu64 " swap_ra=%" PRIu64 " resident_bytes=%" PRIu64
           " limit_bytes=%" PRIu64 "\n",
           s->pswpout, s->pswpin, s->pgfault, s->pgfault_zero, s->pgfault_swapcache, s->pgmajfault, s->swap_ra,
           s->resident_bytes, s->limit_bytes);
}

int main(int argc, char **argv)
{
    const char *mode_name = argc > 1 ? argv[1] : "thread";
    const char *devices = argc > 2 ? argv[2] : "ram:128MiB";
    int mode;
    if (strcmp(mode_name, "thread") == 0) {
        mode = USWAP_FAULT_MODE_THREAD;
    } else if (strcmp(mode_name, "signal") == 0) {
        mode = USWAP_FAULT_MODE_SIGNAL;
    } else {
        fprintf(stderr, "usage: %s [thread|signal] [DEVICE-LIST]\n", argv[0]);
        return 2;
    }
    int ok = 1;

    uswap_config *config;
    must(uswap_config_new(&config), "uswap_config_new");
    /* Refused: an unknown device kind. The message names it and lists the known ones. */
    ok &= refused(uswap_config_set_devices(config, "floppy:1GiB", 0), USWAP_EINVAL,
                  "uswap_config_set_devices(\"floppy:1GiB\")");
    must(uswap_config_set_devices(config, devices, 128 * MIB), "uswap_config_set_devices");
    must(uswap_config_set_resident_limit(config, LIMIT_BYTES), "uswap_config_set_resident_limit");
    must(uswap_config_set_fault_mode(config, mode), "uswap_config_set_fault_mode");
    must(uswap_config_set_readahead(config, 1), "uswap_config_set_readahead");
    /* Signal mode's system calls into managed memory; ignored in thread mode. */
    must(uswap_config_set_syscall_guard(config, 1), "uswap_config_set_syscall_guard");

    uswap_pager *pager;
    must(uswap_pager_new(config, &pager), "uswap_pager_new");
    must(uswap_config_free(config), "uswap_config_free"); /* the pager does not need it */

    uswap_region *region;
    /* Refused: a region of zero bytes. */
    ok &= refused(uswap_map(pager, 0, &region), USWAP_EINVAL, "uswap_map(0 bytes)");
    must(uswap_map(pager, REGION_BYTES, &region), "uswap_map");
    void *addr;
    size_t len_bytes;
    must(uswap_region_addr(region, &addr), "uswap_region_addr");
    must(uswap_region_len(region, &len_bytes), "uswap_region_len");
    printf("mode %s, devices %s: region of %zu bytes at %p, resident limit %" PRIu64 " bytes\n", mode_name, devices,
           len_bytes, addr, LIMIT_BYTES);
    if (len_bytes != REGION_BYTES) {
        fprintf(stderr, "region is %zu bytes, asked for %" PRIu64 "\n", len_bytes, REGION_BYTES);
        ok = 0;
    }

    /* Write the pattern over the whole region, then read back every byte. */
    uint8_t *bytes = addr;
    for (uint64_t i = 0; i < len_bytes; i++) {
        bytes[i] = pattern_byte(i);
    }
    /* The first page was written first: it is out by now. A datagram into it, then its
     * pattern back. */
    if (datagram_into(bytes, 4096)) {
        printf("recv into a page that was out: 4096 bytes, right\n");
    } else {
        ok = 0;
    }
    for (uint64_t i = 0; i < 4096; i++) {
        bytes[i] = pattern_byte(i);
    }
    uint64_t wrong = 0;
    for (uint64_t i = 0; i < len_bytes; i++) {
        if (bytes[i] != pattern_byte(i)) {
            if (wrong == 0) {
                fprintf(stderr, "first wrong byte at offset %" PRIu64 ": %u, expected %u\n", i, bytes[i],
                        pattern_byte(i));
            }
            wrong++;
        }
    }
    printf("verified %zu bytes, %" PRIu64 " wrong\n", len_bytes, wrong);
    ok &= wrong == 0;

    uswap_stats stats;
    memset(&stats, 0, sizeof stats);
    stats.size = sizeof stats;
    must(uswap_get_stats(pager, &stats), "uswap_get_stats");
    print_stats(&stats);
    if (stats.size != sizeof stats) {
        fprintf(stderr, "uswap_get_stats filled %" PRIu64 " bytes of %zu: library and header differ\n", stats.size,
                sizeof stats);
        ok = 0;
    }
    if (stats.pswpout == 0) {
        fprintf(stderr, "pswpout is 0: a region 4x the limit was written, so pages must have gone to swap\n");
        ok = 0;
    }
    if (stats.resident_bytes > stats.limit_bytes + RECLAIM_BATCH_PAGES * stats.page_size_bytes) {
        fprintf(stderr, "resident %" PRIu64 " bytes is above the limit %" PRIu64 " plus one batch\n",
                stats.resident_bytes, stats.limit_bytes);
        ok = 0;
    }

    /* A lower limit: the call reclaims down to it before returning. */
    must(uswap_set_resident_limit(pager, LIMIT_BYTES / 2), "uswap_set_resident_limit");
    stats.size = sizeof stats;
    must(uswap_get_stats(pager, &stats), "uswap_get_stats");
    printf("after lowering the limit: resident_bytes=%" PRIu64 " limit_bytes=%" PRIu64 "\n", stats.resident_bytes,
           stats.limit_bytes);
    if (stats.limit_bytes != LIMIT_BYTES / 2 || stats.resident_bytes > stats.limit_bytes) {
        fprintf(stderr, "the lower limit was not reached\n");
        ok = 0;
    }
    /* Refused: a limit below the minimum. */
    ok &= refused(uswap_set_resident_limit(pager, 4096), USWAP_EINVAL, "uswap_set_resident_limit(4096)");

    /* Refused: the pager still has a region mapped. */
    ok &= refused(uswap_pager_destroy(pager), USWAP_EBUSY, "uswap_pager_destroy(with a region mapped)");
    must(uswap_unmap(region), "uswap_unmap");
    /* Refused: the region handle is stale now; uswap never dereferences it. */
    ok &= refused(uswap_unmap(region), USWAP_EINVAL, "uswap_unmap(already unmapped)");
    must(uswap_pager_destroy(pager), "uswap_pager_destroy");

    printf("%s\n", ok ? "OK" : "FAILED");
    return ok ? 0 : 1;
}
