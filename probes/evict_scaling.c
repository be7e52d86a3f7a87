// Evictions per second out of ONE anonymous mapping by 1..N threads at once, three ways of
// taking a page out while keeping its contents:
//
//   move: UFFDIO_MOVE of the page to a staging page (what uswap does), copy it to a store,
//         drop the staging pages of a batch with one process_madvise(MADV_DONTNEED);
//   wp:   UFFDIO_WRITEPROTECT of the page, copy it to the store, then drop the batch's pages
//         from the mapping itself with one process_madvise(MADV_DONTNEED);
//   span: as wp, but one UFFDIO_WRITEPROTECT over the span that holds the whole batch (its
//         other pages, here other threads', stay in, and writers to them would wait until
//         the span is unprotected after the drop), so a batch flushes about three times in
//         all (write-protect, drop, unprotect): the user-space counterpart of the kernel's
//         batched flush. Here the spans of different threads overlap (one thread's
//         unprotect lifts another's protection), harmless since nothing writes; a real
//         design needs disjoint spans.
//
// Each page is then put back with UFFDIO_COPY from the store (as a swap-in would) and its
// contents checked. move and wp flush once per page (the move or the write-protect) plus once
// per batch (the drop); they differ in locks: UFFDIO_MOVE takes the source folio's anon_vma
// lock for writing and holds it across its flush, and every page of one mapping shares one
// anon_vma, so movers in different threads wait for one another's IPI round trips;
// UFFDIO_WRITEPROTECT and MADV_DONTNEED take the mmap lock for reading and page-table locks.
// Each thread owns every (2T)-th page from its own start, so no two pages of one batch are
// neighbours (a run is one page, as under random access) and threads share page tables.
//
// wp and span drop pages from the mapping itself, which uswap cannot do as it stands: its
// regions' descriptor asks for REMOVE events (to learn of the program's own discards), and
// each MADV_DONTNEED there would send one and wait for it to be read, while UFFDIO_COPYs into
// the mm fail with EAGAIN. The probe's descriptor asks for no events.
//
// Build: gcc -O2 -pthread evict_scaling.c -o evict_scaling
// Run (root, or vm.unprivileged_userfaultfd=1): ./evict_scaling move|wp|span THREADS SECONDS
// Prints evictions/s over all threads and TLB shootdowns (/proc/interrupts) per eviction.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#ifndef UFFDIO_MOVE
struct uffdio_move { __u64 dst, src, len, mode; __s64 move; };
#define UFFDIO_MOVE _IOWR(UFFDIO, 0x05, struct uffdio_move)
#define UFFD_FEATURE_MOVE (1 << 16)
#endif

enum { PAGE = 4096, PAGES_PER_THREAD = 4096, BATCH = 32, MAX_THREADS = 256 };

static int uffd, pidfd, use_wp, use_span, nr_threads;
static char *region;
static atomic_int stop;

struct worker {
    pthread_t tid;
    int index;
    char *staging; // BATCH pages, registered (UFFDIO_MOVE's destination)
    char *store;   // BATCH pages, plain memory: the "device"
    uint64_t evictions, bad_pages;
} workers[MAX_THREADS];

static void die(const char *what) { perror(what); exit(1); }

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

/* The sum of the TLB shootdown line of /proc/interrupts over every CPU. */
static uint64_t tlb_shootdowns(void) {
    FILE *f = fopen("/proc/interrupts", "r");
    char line[8192];
    uint64_t sum = 0;
    while (f && fgets(line, sizeof line, f)) {
        char *p = line;
        while (*p == ' ') p++;
        if (strncmp(p, "TLB:", 4)) continue;
        for (p += 4;;) {
            char *end;
            unsigned long long v = strtoull(p, &end, 10);
            if (end == p) break;
            sum += v;
            p = end;
        }
    }
    if (f) fclose(f);
    return sum;
}

static void writeprotect(char *start, size_t len, int on) {
    struct uffdio_writeprotect wp = {
        .range = {(unsigned long)start, len}, .mode = on ? UFFDIO_WRITEPROTECT_MODE_WP : 0};
    if (ioctl(uffd, UFFDIO_WRITEPROTECT, &wp)) die("UFFDIO_WRITEPROTECT");
}

static void take_out(struct worker *w, char *page, int slot) {
    if (use_span) {
        memcpy(w->store + slot * PAGE, page, PAGE);
        return;
    }
    if (use_wp) {
        writeprotect(page, PAGE, 1);
        memcpy(w->store + slot * PAGE, page, PAGE);
        return;
    }
    struct uffdio_move mv = {
        .dst = (unsigned long)(w->staging + slot * PAGE), .src = (unsigned long)page, .len = PAGE};
    if (ioctl(uffd, UFFDIO_MOVE, &mv)) die("UFFDIO_MOVE");
    memcpy(w->store + slot * PAGE, w->staging + slot * PAGE, PAGE);
}

/* One batch: take BATCH pages out, drop what must go with one call, put them back. */
static void batch(struct worker *w, size_t first) {
    struct iovec drop[BATCH];
    char *pages[BATCH];
    char *span = region + first * PAGE;
    size_t span_len = ((size_t)(BATCH - 1) * 2 * nr_threads + 1) * PAGE;
    if (use_span) writeprotect(span, span_len, 1);
    for (int i = 0; i < BATCH; i++) {
        pages[i] = region + (first + (size_t)i * 2 * nr_threads) * PAGE;
        take_out(w, pages[i], i);
        drop[i].iov_base = use_wp ? pages[i] : w->staging + i * PAGE;
        drop[i].iov_len = PAGE;
    }
    if (syscall(SYS_process_madvise, pidfd, drop, BATCH, MADV_DONTNEED, 0) != BATCH * PAGE)
        die("process_madvise");
    if (use_span) writeprotect(span, span_len, 0);
    for (int i = 0; i < BATCH; i++) {
        struct uffdio_copy cp = {.dst = (unsigned long)pages[i], .src = (unsigned long)(w->store + i * PAGE), .len = PAGE};
        if (ioctl(uffd, UFFDIO_COPY, &cp)) die("UFFDIO_COPY");
        if (*(uint64_t *)pages[i] != (uint64_t)(pages[i] - region)) w->bad_pages++;
    }
    w->evictions += BATCH;
}

static void *work(void *arg) {
    struct worker *w = arg;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(w->index % sysconf(_SC_NPROCESSORS_ONLN), &set);
    sched_setaffinity(0, sizeof set, &set);
    /* This thread's pages: w->index + 2T*k; a batch takes BATCH of them. */
    size_t per_batch_span = (size_t)BATCH * 2 * nr_threads;
    size_t nr_spans = (size_t)PAGES_PER_THREAD * nr_threads / per_batch_span;
    for (size_t k = 0; !atomic_load(&stop); k = (k + 1) % nr_spans) batch(w, k * per_batch_span + w->index);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s move|wp|span THREADS SECONDS\n", argv[0]);
        return 2;
    }
    use_span = !strcmp(argv[1], "span");
    use_wp = use_span || !strcmp(argv[1], "wp");
    nr_threads = atoi(argv[2]);
    int seconds = atoi(argv[3]);
    if (nr_threads < 1 || nr_threads > MAX_THREADS) return 2;
    size_t len = (size_t)PAGES_PER_THREAD * nr_threads * PAGE;

    uffd = syscall(SYS_userfaultfd, O_CLOEXEC);
    if (uffd < 0) die("userfaultfd");
    struct uffdio_api api = {.api = UFFD_API, .features = UFFD_FEATURE_MOVE};
    if (ioctl(uffd, UFFDIO_API, &api)) die("UFFDIO_API");
    pidfd = syscall(SYS_pidfd_open, getpid(), 0);
    if (pidfd < 0) die("pidfd_open");

    region = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (region == MAP_FAILED) die("mmap");
    madvise(region, len, MADV_NOHUGEPAGE);
    for (size_t off = 0; off < len; off += PAGE) *(uint64_t *)(region + off) = off;
    struct uffdio_register reg = {
        .range = {(unsigned long)region, len},
        .mode = UFFDIO_REGISTER_MODE_MISSING | (use_wp ? UFFDIO_REGISTER_MODE_WP : 0)};
    if (ioctl(uffd, UFFDIO_REGISTER, &reg)) die("UFFDIO_REGISTER region");

    for (int i = 0; i < nr_threads; i++) {
        struct worker *w = &workers[i];
        w->index = i;
        w->staging = mmap(NULL, BATCH * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        w->store = mmap(NULL, BATCH * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (w->staging == MAP_FAILED || w->store == MAP_FAILED) die("mmap");
        memset(w->store, 0, BATCH * PAGE);
        struct uffdio_register sreg = {.range = {(unsigned long)w->staging, BATCH * PAGE}, .mode = UFFDIO_REGISTER_MODE_MISSING};
        if (ioctl(uffd, UFFDIO_REGISTER, &sreg)) die("UFFDIO_REGISTER staging");
    }

    uint64_t tlb_before = tlb_shootdowns();
    double start = now_s();
    for (int i = 0; i < nr_threads; i++)
        if (pthread_create(&workers[i].tid, NULL, work, &workers[i])) die("pthread_create");
    sleep(seconds);
    atomic_store(&stop, 1);
    uint64_t evictions = 0, bad = 0;
    for (int i = 0; i < nr_threads; i++) {
        pthread_join(workers[i].tid, NULL);
        evictions += workers[i].evictions;
        bad += workers[i].bad_pages;
    }
    double took = now_s() - start;
    uint64_t tlb = tlb_shootdowns() - tlb_before;
    printf("%s threads=%d: %.0f evictions/s (%.2f us each per thread), %.2f TLB shootdowns per eviction, %llu bad pages\n",
           argv[1], nr_threads, evictions / took, took * nr_threads / evictions * 1e6, (double)tlb / evictions,
           (unsigned long long)bad);
    return bad != 0;
}
