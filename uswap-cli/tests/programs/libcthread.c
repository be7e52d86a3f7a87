/* Threads made by the C library's own pthread_create, found with dlsym as jemalloc finds it
 * (so no interposer of pthread_create sees them), that sleep in a system call while the
 * main thread fills MIB MiB, touched twice, and then make system calls again. Each thread
 * prints where its DTV (the table __tls_get_addr reads, %fs:8) lies: "heap" when in the
 * C library's brk heap, "elsewhere" otherwise. Prints "ok" when every thread came back.
 * Usage: libcthread MIB */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NR_THREADS 4

typedef int (*create_fn)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);
static int go[2], done[2];
static unsigned long heap_start, heap_end;

static void find_heap(void) {
    char line[512];
    FILE *f = fopen("/proc/self/maps", "r");
    while (f && fgets(line, sizeof line, f))
        if (strstr(line, "[heap]")) sscanf(line, "%lx-%lx", &heap_start, &heap_end);
    if (f) fclose(f);
}

static void *thread(void *arg) {
    unsigned long dtv;
    __asm__ volatile("mov %%fs:8, %0" : "=r"(dtv));
    char c;
    /* Sleeps in read(2) while the main thread pushes everything cold out. */
    if (read(go[0], &c, 1) != 1) return (void *)1;
    printf("thread %ld: dtv %s\n", (long)arg, dtv >= heap_start && dtv < heap_end ? "heap" : "elsewhere");
    fflush(stdout);
    for (int i = 0; i < 100; i++) getppid(), write(done[1], "", 0);
    return write(done[1], "x", 1) == 1 ? NULL : (void *)1;
}

int main(int argc, char **argv) {
    size_t bytes = (size_t)atol(argv[1]) << 20;
    void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    create_fn create = libc ? (create_fn)dlsym(libc, "pthread_create") : NULL;
    if (!create || pipe(go) || pipe(done)) { fprintf(stderr, "set-up failed\n"); return 1; }
    pthread_t t[NR_THREADS];
    for (long i = 0; i < NR_THREADS; i++)
        if (create(&t[i], NULL, thread, (void *)i)) { fprintf(stderr, "pthread_create failed\n"); return 1; }
    find_heap();
    unsigned char *b = malloc(bytes);
    if (!b) { perror("malloc"); return 1; }
    for (int round = 0; round < 2; round++)
        for (size_t i = 0; i < bytes; i += 4096) b[i] = (unsigned char)(round + 1);
    for (int i = 0; i < NR_THREADS; i++) {
        char c;
        if (write(go[1], "g", 1) != 1 || read(done[0], &c, 1) != 1) return 1;
    }
    for (int i = 0; i < NR_THREADS; i++)
        if (pthread_join(t[i], NULL)) return 1;
    printf("ok\n");
    return 0;
}
