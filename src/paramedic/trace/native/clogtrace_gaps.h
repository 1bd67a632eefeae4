/* What the trace cannot show, said instead of left out: at MPI_Finalize rank 0 lists the MPI functions the
   program's objects (the executable and every library it loaded, the MPI libraries and the tracer aside)
   import but the tracer does not define: calls that, if made, reach the MPI library unlogged (a Fortran
   program's mpi_put_, MPI_Comm_split, a neighbourhood collective, ...). The names go to
   $PARAMEDIC_TRACE_DIR/untraced, one a line (at most MAX_GAPS); paramedic/trace/run.py reads them into the
   run's summary and says which of them communicate. Imports are what the objects link, not what they
   called: a name listed may never have been called. Included at the end of clogtrace.c. */
#include <dlfcn.h>
#include <elf.h>
#include <link.h>

#define MAX_GAPS 400

static int gaps_fd = -1, n_gaps;

static const char *gap_base(const char *path) {
    const char *slash = path ? strrchr(path, '/') : NULL;
    return slash ? slash + 1 : (path ? path : "");
}

/* A dynamic-section address: relocated in place by the loader for most objects, not for the vDSO. */
static uintptr_t gap_addr(uintptr_t base, ElfW(Addr) value) {
    return value < base ? base + value : value;
}

static size_t gap_symbol_count(const ElfW(Dyn) *dyn, uintptr_t base) {
    for (const ElfW(Dyn) *d = dyn; d->d_tag != DT_NULL; d++)
        if (d->d_tag == DT_HASH) return ((const uint32_t *)gap_addr(base, d->d_un.d_ptr))[1];
    for (const ElfW(Dyn) *d = dyn; d->d_tag != DT_NULL; d++)
        if (d->d_tag == DT_GNU_HASH) {
            const uint32_t *h = (const uint32_t *)gap_addr(base, d->d_un.d_ptr);
            uint32_t nbuckets = h[0], symoffset = h[1], bloom = h[2], last = 0;
            const uint32_t *buckets = h + 4 + bloom * (sizeof(ElfW(Addr)) / 4);
            const uint32_t *chain = buckets + nbuckets;
            for (uint32_t i = 0; i < nbuckets; i++)
                if (buckets[i] > last) last = buckets[i];
            if (last < symoffset) return symoffset;
            while ((chain[last - symoffset] & 1u) == 0) last++;
            return last + 1;
        }
    return 0;
}

struct import_query { const char *path, *symbol; int found; };

static int gap_imports_of(struct dl_phdr_info *info, size_t size, void *data);

/* The object loaded from `path` imports `symbol` (an MPICH Fortran function that calls the C MPI_Send
   imports it: a call through it reaches the tracer's MPI_Send). */
static int object_imports(const char *path, const char *symbol) {
    struct import_query q = {path, symbol, 0};
    dl_iterate_phdr(gap_imports_of, &q);
    return q.found;
}

/* The C name of a Fortran 2008 binding with a choice buffer: mpi_send_f08ts_ -> MPI_Send. Only those: MPICH
   builds them on its C MPI_* functions (through MPIR_*_cdesc), while its other Fortran functions may call
   PMPI_* (its mpi_barrier_f08_ does, though libmpichfort imports MPI_Barrier too): a name not known to reach
   the tracer is listed. */
static int c_name_of(const char *name, char *out, size_t cap) {
    size_t len = strlen(name);
    if (strncmp(name, "mpi_", 4) != 0 || len < 12 || len + 1 > cap || strcmp(name + len - 7, "_f08ts_") != 0)
        return 0;
    snprintf(out, cap, "MPI_%s", name + 4);
    len = strlen(out);
    if (out[len - 1] == '_') out[--len] = 0;
    static const char *const suffixes[] = {"_f08ts", "_f08"};
    for (int i = 0; i < 2; i++) {
        size_t n = strlen(suffixes[i]);
        if (len > n && strcmp(out + len - n, suffixes[i]) == 0) { out[len - n] = 0; break; }
    }
    if (out[4] >= 'a' && out[4] <= 'z') out[4] = (char)(out[4] - 'a' + 'A');
    return 1;
}

static int defined_by_tracer(const char *name) {
    void *def = dlsym(RTLD_DEFAULT, name);
    Dl_info info;
    return def != NULL && dladdr(def, &info) && strncmp(gap_base(info.dli_fname), "clogtrace-", 10) == 0;
}

/* `name` is an MPI function the tracer does not define (its definition is in another object), and, for a
   Fortran binding, whose definition does not call a C function the tracer wraps. */
static int untraced(const char *name) {
    if (strncmp(name, "MPI_", 4) != 0 && strncmp(name, "mpi_", 4) != 0) return 0;
    void *def = dlsym(RTLD_DEFAULT, name);
    Dl_info info;
    const ElfW(Sym) *sym = NULL;
    if (def == NULL || !dladdr1(def, &info, (void **)&sym, RTLD_DL_SYMENT)) return 0;
    if (sym != NULL && ELF64_ST_TYPE(sym->st_info) != STT_FUNC) return 0; /* data: mpi_fortran_bottom_ ... */
    if (strncmp(gap_base(info.dli_fname), "clogtrace-", 10) == 0) return 0;
    char c_name[256];
    if (c_name_of(name, c_name, sizeof c_name) && defined_by_tracer(c_name) && object_imports(info.dli_fname, c_name))
        return 0;
    return 1;
}

static void gap_note(const char *name) {
    if (n_gaps >= MAX_GAPS) return;
    size_t len = strlen(name);
    if (len > 200) return;
    char line[202];
    memcpy(line, name, len);
    line[len] = '\n';
    if (write(gaps_fd, line, len + 1) == (ssize_t)(len + 1)) n_gaps++;
}

static int gap_object(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    (void)data;
    const char *base = gap_base(info->dlpi_name);
    if (strncmp(base, "libmpi", 6) == 0 || strncmp(base, "libpmpi", 7) == 0 || strncmp(base, "clogtrace-", 10) == 0 ||
        strncmp(base, "clogaudit-", 10) == 0 || strncmp(base, "linux-vdso", 10) == 0 || strncmp(base, "libopen-", 8) == 0 ||
        strncmp(base, "mca_", 4) == 0) /* Open MPI's components (ROMIO's calls are the MPI's own) */
        return 0;
    const ElfW(Dyn) *dyn = NULL;
    for (int i = 0; i < info->dlpi_phnum; i++)
        if (info->dlpi_phdr[i].p_type == PT_DYNAMIC) dyn = (const ElfW(Dyn) *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
    if (dyn == NULL) return 0;
    const ElfW(Sym) *symtab = NULL;
    const char *strtab = NULL;
    for (const ElfW(Dyn) *d = dyn; d->d_tag != DT_NULL; d++) {
        if (d->d_tag == DT_SYMTAB) symtab = (const ElfW(Sym) *)gap_addr(info->dlpi_addr, d->d_un.d_ptr);
        else if (d->d_tag == DT_STRTAB) strtab = (const char *)gap_addr(info->dlpi_addr, d->d_un.d_ptr);
    }
    if (symtab == NULL || strtab == NULL) return 0;
    size_t count = gap_symbol_count(dyn, info->dlpi_addr);
    for (size_t i = 1; i < count; i++) {
        const ElfW(Sym) *s = &symtab[i];
        if (s->st_shndx != SHN_UNDEF || ELF64_ST_TYPE(s->st_info) == STT_OBJECT) continue;
        const char *name = strtab + s->st_name;
        if (untraced(name)) gap_note(name);
    }
    return 0;
}

static int gap_imports_of(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    struct import_query *q = data;
    if (q->found || info->dlpi_name == NULL || strcmp(info->dlpi_name, q->path) != 0) return 0;
    const ElfW(Dyn) *dyn = NULL;
    for (int i = 0; i < info->dlpi_phnum; i++)
        if (info->dlpi_phdr[i].p_type == PT_DYNAMIC) dyn = (const ElfW(Dyn) *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
    if (dyn == NULL) return 0;
    const ElfW(Sym) *symtab = NULL;
    const char *strtab = NULL;
    for (const ElfW(Dyn) *d = dyn; d->d_tag != DT_NULL; d++) {
        if (d->d_tag == DT_SYMTAB) symtab = (const ElfW(Sym) *)gap_addr(info->dlpi_addr, d->d_un.d_ptr);
        else if (d->d_tag == DT_STRTAB) strtab = (const char *)gap_addr(info->dlpi_addr, d->d_un.d_ptr);
    }
    if (symtab == NULL || strtab == NULL) return 0;
    size_t count = gap_symbol_count(dyn, info->dlpi_addr);
    for (size_t i = 1; i < count && !q->found; i++)
        if (symtab[i].st_shndx == SHN_UNDEF && strcmp(strtab + symtab[i].st_name, q->symbol) == 0) q->found = 1;
    return q->found;
}

/* Rank 0, at MPI_Finalize: write the list (nothing when every imported MPI function is wrapped). */
static void list_gaps(const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/untraced", dir);
    gaps_fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (gaps_fd < 0) return;
    dl_iterate_phdr(gap_object, NULL);
    close(gaps_fd);
    gaps_fd = -1;
}
