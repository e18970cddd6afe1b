/*
 * dlsym and dlvsym interposition. The CUDA runtime dlopens libcuda.so.1 and
 * asks dlsym for cuGetProcAddress (then everything else through it); other
 * callers (Triton, cupy, ...) dlsym driver functions directly, and dlvsym
 * would hand out a driver that versions its symbols just the same. Hooked
 * names get xCUDA's wrapper; all other look-ups go to glibc's function as a
 * tail call, so glibc still sees the program as the caller and RTLD_NEXT
 * keeps its meaning. This file is therefore built with sibling-call
 * optimisation on.
 */
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <stddef.h>
#include <string.h>

#include "xcuda.h"

typedef void *(*xc_dlvsym_fn)(void *, const char *, const char *);

static _Atomic(xc_dlsym_fn) real_dlsym_p;
static _Atomic(xc_dlvsym_fn) real_dlvsym_p;

/* A dynamic-section address: ld.so has relocated it in place on the targets
 * xCUDA supports (x86-64, aarch64); an unrelocated one is below the base. */
static const void *dyn_addr(const struct link_map *lm, ElfW(Addr) v)
{
    return (const void *)(v >= lm->l_addr ? v : v + lm->l_addr);
}

static uint32_t gnu_hash(const char *s)
{
    uint32_t h = 5381;
    for (const unsigned char *c = (const unsigned char *)s; *c != 0; c++)
        h = h * 33 + *c;
    return h;
}

/* `name` defined as a function in the object of `lm`, found in its dynamic
 * symbol table through its GNU hash; the default version where there are
 * several. NULL when the object has no such table or no such function. */
static void *elf_lookup(const struct link_map *lm, const char *name)
{
    const ElfW(Sym) *symtab = NULL;
    const char *strtab = NULL;
    const uint32_t *gh = NULL;
    const ElfW(Half) *versym = NULL;
    for (const ElfW(Dyn) *d = lm->l_ld; d != NULL && d->d_tag != DT_NULL; d++) {
        if (d->d_tag == DT_SYMTAB)
            symtab = dyn_addr(lm, d->d_un.d_ptr);
        else if (d->d_tag == DT_STRTAB)
            strtab = dyn_addr(lm, d->d_un.d_ptr);
        else if (d->d_tag == DT_GNU_HASH)
            gh = dyn_addr(lm, d->d_un.d_ptr);
        else if (d->d_tag == DT_VERSYM)
            versym = dyn_addr(lm, d->d_un.d_ptr);
    }
    if (symtab == NULL || strtab == NULL || gh == NULL || gh[0] == 0)
        return NULL;
    uint32_t nbuckets = gh[0], symoffset = gh[1], bloom_size = gh[2];
    const uint32_t *buckets = (const uint32_t *)((const ElfW(Addr) *)(gh + 4) + bloom_size);
    const uint32_t *chain = buckets + nbuckets;
    uint32_t h = gnu_hash(name), i = buckets[h % nbuckets];
    if (i < symoffset)
        return NULL;
    void *found = NULL;
    for (;; i++) {
        uint32_t c = chain[i - symoffset];
        const ElfW(Sym) *sym = &symtab[i];
        if ((c | 1) == (h | 1) && sym->st_shndx != SHN_UNDEF && sym->st_value != 0 &&
            ELF64_ST_TYPE(sym->st_info) == STT_FUNC && !strcmp(strtab + sym->st_name, name)) {
            found = (void *)(lm->l_addr + sym->st_value);
            if (versym == NULL || !(versym[i] & 0x8000))
                return found;  /* the default version; a hidden (compat) one only if nothing better */
        }
        if (c & 1)
            break;
    }
    return found;
}

/* glibc's own dlsym and dlvsym, found without calling either by name (both
 * names bind to xCUDA's exports): dlopen and dlinfo are not interposed, and
 * give the loaded libc's (or, before glibc 2.34, libdl's) symbol table. */
static void resolve_real(void)
{
    static const char *const libs[] = {"libc.so.6", "libdl.so.2"};
    for (size_t k = 0; k < sizeof libs / sizeof libs[0]; k++) {
        void *h = dlopen(libs[k], RTLD_NOLOAD | RTLD_LAZY);
        if (h == NULL)
            continue;
        struct link_map *lm = NULL;
        if (dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm != NULL) {
            xc_dlsym_fn s = (xc_dlsym_fn)elf_lookup(lm, "dlsym");
            xc_dlvsym_fn v = (xc_dlvsym_fn)elf_lookup(lm, "dlvsym");
            if (s != NULL && v != NULL) {
                atomic_store_explicit(&real_dlvsym_p, v, memory_order_release);
                atomic_store_explicit(&real_dlsym_p, s, memory_order_release);
                dlclose(h);
                return;
            }
        }
        dlclose(h);
    }
}

xc_dlsym_fn xc_real_dlsym(void)
{
    xc_dlsym_fn p = atomic_load_explicit(&real_dlsym_p, memory_order_acquire);
    if (XC_LIKELY(p != NULL))
        return p;
    resolve_real();
    return atomic_load_explicit(&real_dlsym_p, memory_order_acquire);
}

static xc_dlvsym_fn real_dlvsym(void)
{
    xc_dlvsym_fn p = atomic_load_explicit(&real_dlvsym_p, memory_order_acquire);
    if (XC_LIKELY(p != NULL))
        return p;
    resolve_real();
    return atomic_load_explicit(&real_dlvsym_p, memory_order_acquire);
}

__attribute__((noinline))
static void *hooked(void *handle, const char *symbol, int id)
{
    /* The global scope holds xCUDA's export itself: that is the answer. */
    if (handle == RTLD_DEFAULT || handle == RTLD_NEXT)
        return xc_hooks[id].wrapper;
    xc_dlsym_fn real = xc_real_dlsym();
    void *p = real != NULL ? real(handle, symbol) : NULL;
    return p != NULL ? xc_hooks[id].wrapper : NULL;  /* keep "not in that library" */
}

void *xc_w_dlsym(void *handle, const char *symbol);
void *xc_w_dlsym(void *handle, const char *symbol)
{
    if (symbol != NULL && symbol[0] == 'c' && symbol[1] == 'u') {
        int id = xc_hook_by_export(symbol);
        if (id >= 0)
            return hooked(handle, symbol, id);
    }
    xc_dlsym_fn real = xc_real_dlsym();
    if (XC_UNLIKELY(real == NULL))
        return NULL;
    return real(handle, symbol);  /* tail call: see the comment at the top */
}

extern __typeof__(xc_w_dlsym) dlsym __attribute__((alias("xc_w_dlsym"), visibility("default")));

__attribute__((noinline))
static void *hooked_v(void *handle, const char *symbol, const char *version, int id)
{
    if (handle == RTLD_DEFAULT || handle == RTLD_NEXT)
        return xc_hooks[id].wrapper;
    xc_dlvsym_fn real = real_dlvsym();
    void *p = real != NULL ? real(handle, symbol, version) : NULL;
    return p != NULL ? xc_hooks[id].wrapper : NULL;  /* keep "no such version in that library" */
}

void *xc_w_dlvsym(void *handle, const char *symbol, const char *version);
void *xc_w_dlvsym(void *handle, const char *symbol, const char *version)
{
    if (symbol != NULL && symbol[0] == 'c' && symbol[1] == 'u') {
        int id = xc_hook_by_export(symbol);
        if (id >= 0)
            return hooked_v(handle, symbol, version, id);
    }
    xc_dlvsym_fn real = real_dlvsym();
    if (XC_UNLIKELY(real == NULL))
        return NULL;
    return real(handle, symbol, version);  /* tail call: see the comment at the top */
}

extern __typeof__(xc_w_dlvsym) dlvsym __attribute__((alias("xc_w_dlvsym"), visibility("default")));
