/* Reads and writes its own memory through its memory file, as a careful memcpy or a debugger
 * inside the process does. Fills MIB MiB of heap with a pattern (far more than the limit, so
 * that most of it is out of RAM), then, through /proc/self/mem (and /proc/thread-self/mem):
 * preads every 16th page; preads 8 MiB at once from an odd address; reads 3 MiB and 123 bytes
 * after an lseek (in a loop, as for any descriptor) and 4 MiB in one read whose first page was
 * just touched; pwrites 5 MiB of a second pattern at an odd address and writes 1 MiB after
 * an lseek (in a loop); then checks every byte of the heap against what it should hold. Prints
 * "memfile: R bytes read, W written, B bad bytes" (or the first call that failed: "memfile:
 * CALL at OFFSET: N of LEN bytes, errno E").
 * Usage: memfile MIB */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static unsigned char first(size_t i) { return (unsigned char)((i * 2654435761u) >> 13); }
static unsigned char second(size_t i) { return (unsigned char)((i * 40503u + 7) >> 5); }

static unsigned char *heap;
static long read_bytes, written_bytes;

/* The call's result must be `len`: else says which call, and exits. */
static void expect(const char *call, size_t off, ssize_t n, size_t len) {
    if (n != (ssize_t)len) {
        printf("memfile: %s at %zu: %zd of %zu bytes, errno %d\n", call, off, n, len, n < 0 ? errno : 0);
        exit(1);
    }
}

/* read(2) or write(2) of `len` bytes, looping on short counts as careful programs do (the
 * kernel may stop short on this file too, at a page it cannot reach). */
static ssize_t all(ssize_t (*op)(int, void *, size_t), int fd, unsigned char *p, size_t len) {
    size_t done = 0;
    while (done < len) {
        ssize_t n = op(fd, p + done, len - done);
        if (n <= 0)
            return done ? (ssize_t)done : n;
        done += (size_t)n;
    }
    return (ssize_t)done;
}

static ssize_t write_op(int fd, void *p, size_t len) { return write(fd, p, len); }

/* Checks `len` bytes read from the heap at `off` against the first pattern. */
static long check_read(const unsigned char *got, size_t off, size_t len) {
    long bad = 0;
    for (size_t i = 0; i < len; i++)
        bad += got[i] != first(off + i);
    read_bytes += len;
    return bad;
}

int main(int argc, char **argv) {
    size_t len = (size_t)atol(argv[1]) << 20;
    heap = malloc(len);
    unsigned char *buf = malloc(8 << 20);
    for (size_t i = 0; i < len; i++)
        heap[i] = first(i);
    int mem = open("/proc/self/mem", O_RDWR), task = open("/proc/thread-self/mem", O_RDWR);
    if (mem < 0 || task < 0 || !buf) {
        printf("memfile: cannot open the memory file: errno %d\n", errno);
        return 1;
    }
    long bad = 0;
    for (size_t off = 0; off + 4096 <= len; off += 16 * 4096) {
        expect("pread", off, pread(off % 32 ? mem : task, buf, 4096, (off_t)(uintptr_t)(heap + off)), 4096);
        bad += check_read(buf, off, 4096);
    }
    size_t at = len / 3 + 11, n = 8 << 20;
    expect("pread whole", at, pread(mem, buf, n, (off_t)(uintptr_t)(heap + at)), n);
    bad += check_read(buf, at, n);
    at = len / 2 + 5, n = (3 << 20) + 123;
    lseek(task, (off_t)(uintptr_t)(heap + at), SEEK_SET);
    expect("read", at, all(read, task, buf, n), n);
    bad += check_read(buf, at, n);
    /* One read, no loop, its first page just touched (in RAM), the rest long out. */
    at = len / 4 + 9, n = 4 << 20;
    volatile unsigned char touch = heap[at];
    (void)touch;
    lseek(mem, (off_t)(uintptr_t)(heap + at), SEEK_SET);
    expect("one read", at, read(mem, buf, n), n);
    bad += check_read(buf, at, n);
    /* Writes: 5 MiB at an odd address with pwrite, then 1 MiB after an lseek with write. */
    size_t w_at = 7 * 4096 + 3, w_len = 5 << 20, v_at = len - (2 << 20) + 1, v_len = 1 << 20;
    for (size_t i = 0; i < w_len; i++)
        buf[i] = second(w_at + i);
    expect("pwrite", w_at, pwrite(mem, buf, w_len, (off_t)(uintptr_t)(heap + w_at)), w_len);
    for (size_t i = 0; i < v_len; i++)
        buf[i] = second(v_at + i);
    lseek(mem, (off_t)(uintptr_t)(heap + v_at), SEEK_SET);
    expect("write", v_at, all(write_op, mem, buf, v_len), v_len);
    written_bytes = (long)(w_len + v_len);
    for (size_t i = 0; i < len; i++) {
        int written = (i >= w_at && i < w_at + w_len) || (i >= v_at && i < v_at + v_len);
        bad += heap[i] != (written ? second(i) : first(i));
    }
    printf("memfile: %ld bytes read, %ld written, %ld bad bytes\n", read_bytes, written_bytes, bad);
    return bad != 0;
}
