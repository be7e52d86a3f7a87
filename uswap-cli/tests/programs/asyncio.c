/* Sets up what makes the kernel touch memory on its own later, outside any system call:
 * an io_uring, a Linux AIO context and, where /dev/kvm opens, a KVM memory region over a
 * malloc'd buffer (prints "kvm" then, "no-kvm" otherwise). Nothing is submitted. */
#include <fcntl.h>
#include <linux/io_uring.h>
#include <linux/kvm.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

int main(void) {
    struct io_uring_params p;
    memset(&p, 0, sizeof p);
    long ring = syscall(SYS_io_uring_setup, 4, &p);
    unsigned long aio = 0;
    long r = syscall(SYS_io_setup, 4, &aio);
    printf("io_uring %s, aio %s\n", ring >= 0 ? "up" : "refused", r == 0 ? "up" : "refused");
    int kvm = open("/dev/kvm", O_RDWR | O_CLOEXEC);
    int vm = kvm >= 0 ? ioctl(kvm, KVM_CREATE_VM, 0) : -1;
    if (vm < 0) { printf("no-kvm\n"); return 0; }
    size_t len = 1 << 20;
    void *ram = aligned_alloc(4096, len);
    memset(ram, 1, len);
    struct kvm_userspace_memory_region m = { .slot = 0, .guest_phys_addr = 0, .memory_size = len,
                                             .userspace_addr = (unsigned long)ram };
    if (ioctl(vm, KVM_SET_USER_MEMORY_REGION, &m) != 0) { perror("KVM_SET_USER_MEMORY_REGION"); return 1; }
    printf("kvm\n");
    return 0;
}
