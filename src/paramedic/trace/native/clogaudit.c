/* paramedic trace: an rtld-audit library (LD_AUDIT) that sends MPI calls bound around the tracer back to it.

   LD_PRELOAD puts the tracer (clogtrace-*.so) first in the global scope, so a program's linked MPI_Send
   reaches the tracer's wrapper. Two ways around it reach the MPI library's own function instead, and the
   call would be missing from the trace without a word: dlsym on the MPI library's handle (Julia's ccall,
   MPI ABI trampolines, a program that loads its MPI at run time), and a library opened with RTLD_DEEPBIND.
   The dynamic linker tells an audit library of every such binding (la_symbind64, for dlsym too: flag
   LA_SYMB_DLSYM) and lets it change the address: a binding of a name the tracer wraps (MPI_Send,
   mpi_send_, ...) to a definition in an MPI library (basename libmpi*: libmpi, libmpich, libmpi_mpifh,
   libmpifort), made by anything but the tracer itself, gets the tracer's wrapper. The wrappers' addresses
   come from the tracer's own dynamic symbol table (read once from memory, no loader call from here).

   Needs no MPI header: built with the system C compiler. Included nowhere; paramedic/trace/native.py
   builds it beside the tracer. */
#define _GNU_SOURCE
#include <elf.h>
#include <link.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#define TAG_TRACER 1u
#define TAG_MPI 2u
#define MAX_WRAPPED 2048 /* the tracer exports about 300 MPI_* and mpi_* functions (MPI-4: 303) */

static struct link_map *tracer;
static int indexed;
static size_t n_wrapped;
static struct { const char *name; uintptr_t addr; } wrapped[MAX_WRAPPED];

unsigned int la_version(unsigned int version) {
    return version < LAV_CURRENT ? version : LAV_CURRENT;
}

static const char *base_name(const char *path) {
    const char *slash = path ? strrchr(path, '/') : NULL;
    return slash ? slash + 1 : (path ? path : "");
}

unsigned int la_objopen(struct link_map *map, Lmid_t lmid, uintptr_t *cookie) {
    if (lmid != LM_ID_BASE) return 0;
    const char *name = base_name(map->l_name);
    if (strncmp(name, "clogtrace-", 10) == 0 && tracer == NULL) {
        tracer = map;
        *cookie = (uintptr_t)map | TAG_TRACER;
        return LA_FLG_BINDTO | LA_FLG_BINDFROM;
    }
    if (strncmp(name, "libmpi", 6) == 0) {
        *cookie = (uintptr_t)map | TAG_MPI;
        return LA_FLG_BINDTO;
    }
    return 0;
}

/* A dynamic-section address: relocated in place by the loader on most targets, a virtual address on others. */
static uintptr_t dyn_addr(ElfW(Addr) value) {
    return value < tracer->l_addr ? tracer->l_addr + value : value;
}

/* The number of dynamic symbols, from the GNU hash table: past the last chain of the highest bucket. */
static size_t gnu_hash_count(const uint32_t *h) {
    uint32_t nbuckets = h[0], symoffset = h[1], bloom = h[2];
    const uint32_t *buckets = h + 4 + bloom * (sizeof(ElfW(Addr)) / 4);
    const uint32_t *chain = buckets + nbuckets;
    uint32_t last = 0;
    for (uint32_t i = 0; i < nbuckets; i++)
        if (buckets[i] > last) last = buckets[i];
    if (last < symoffset) return symoffset;
    while ((chain[last - symoffset] & 1u) == 0) last++;
    return last + 1;
}

/* The tracer's exported MPI_* and mpi_* functions, with their addresses. */
static void index_tracer(void) {
    indexed = 1;
    const ElfW(Sym) *symtab = NULL;
    const char *strtab = NULL;
    size_t count = 0;
    for (const ElfW(Dyn) *d = tracer->l_ld; d->d_tag != DT_NULL; d++) {
        if (d->d_tag == DT_SYMTAB) symtab = (const ElfW(Sym) *)dyn_addr(d->d_un.d_ptr);
        else if (d->d_tag == DT_STRTAB) strtab = (const char *)dyn_addr(d->d_un.d_ptr);
        else if (d->d_tag == DT_GNU_HASH) count = gnu_hash_count((const uint32_t *)dyn_addr(d->d_un.d_ptr));
        else if (d->d_tag == DT_HASH && count == 0) count = ((const uint32_t *)dyn_addr(d->d_un.d_ptr))[1];
    }
    if (symtab == NULL || strtab == NULL) return;
    for (size_t i = 0; i < count && n_wrapped < MAX_WRAPPED; i++) {
        const ElfW(Sym) *s = &symtab[i];
        const char *name = strtab + s->st_name;
        if (s->st_shndx == SHN_UNDEF || ELF64_ST_TYPE(s->st_info) != STT_FUNC) continue;
        if (strncmp(name, "MPI_", 4) != 0 && strncmp(name, "mpi_", 4) != 0) continue;
        wrapped[n_wrapped].name = name;
        wrapped[n_wrapped].addr = tracer->l_addr + s->st_value;
        n_wrapped++;
    }
}

/* An MPI function taken with dlsym that the tracer does not wrap: its calls reach the MPI unlogged, and
   no import says so (clogtrace_gaps.h reads imports). Its name goes to $PARAMEDIC_TRACE_DIR/untraced-<pid>
   (at most MAX_NOTED names a process), which `paramedic trace` reads with rank 0's list. */
#define MAX_NOTED 400
static int noted_fd = -1, n_noted;

static void note_untraced(const char *name) {
    size_t len = strlen(name);
    if (n_noted >= MAX_NOTED || len > 200) return;
    if (noted_fd < 0) {
        const char *dir = getenv("PARAMEDIC_TRACE_DIR");
        char path[4096];
        if (dir == NULL || snprintf(path, sizeof path, "%s/untraced-%d", dir, (int)getpid()) >= (int)sizeof path)
            return;
        noted_fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0600);
        if (noted_fd < 0) return;
    }
    char line[202];
    memcpy(line, name, len);
    line[len] = '\n';
    if (write(noted_fd, line, len + 1) == (ssize_t)(len + 1)) n_noted++;
}

uintptr_t la_symbind64(ElfW(Sym) *sym, unsigned int ndx, uintptr_t *refcook, uintptr_t *defcook,
                       unsigned int *flags, const char *symname) {
    (void)ndx;
    if ((*defcook & 3u) != TAG_MPI || (*refcook & 3u) == TAG_TRACER || tracer == NULL) return sym->st_value;
    if (strncmp(symname, "MPI_", 4) != 0 && strncmp(symname, "mpi_", 4) != 0) return sym->st_value;
    if (!indexed) index_tracer();
    for (size_t i = 0; i < n_wrapped; i++)
        if (strcmp(wrapped[i].name, symname) == 0) return wrapped[i].addr;
    if (*flags & LA_SYMB_DLSYM) note_untraced(symname);
    return sym->st_value;
}
