/* A small rtld-audit library, as sotruss's and latrace's (loaded with LD_AUDIT): it asks to
 * see every object's bindings and every call through a PLT, and changes none. With such an
 * auditor the dynamic loader binds lazily and allocates while it relocates itself, before the
 * C library starts. */
#define _GNU_SOURCE
#include <link.h>
#include <stdint.h>
#include <unistd.h>

unsigned int la_version(unsigned int version) {
    static const char loaded[] = "test auditor loaded\n";
    (void)!write(2, loaded, sizeof loaded - 1);
    return version < LAV_CURRENT ? version : LAV_CURRENT;
}

unsigned int la_objopen(struct link_map *map, Lmid_t lmid, uintptr_t *cookie) {
    (void)map, (void)lmid, (void)cookie;
    return LA_FLG_BINDTO | LA_FLG_BINDFROM;
}

uintptr_t la_symbind64(Elf64_Sym *sym, unsigned int ndx, uintptr_t *refcook, uintptr_t *defcook,
                       unsigned int *flags, const char *symname) {
    (void)ndx, (void)refcook, (void)defcook, (void)flags, (void)symname;
    return sym->st_value;
}

Elf64_Addr la_x86_64_gnu_pltenter(Elf64_Sym *sym, unsigned int ndx, uintptr_t *refcook, uintptr_t *defcook,
                                  La_x86_64_regs *regs, unsigned int *flags, const char *symname,
                                  long int *framesizep) {
    (void)ndx, (void)refcook, (void)defcook, (void)regs, (void)flags, (void)symname, (void)framesizep;
    return sym->st_value;
}
