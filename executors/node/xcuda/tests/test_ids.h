/* Ids and attributes of every hooks.def entry, for the test driver and harness. */
#ifndef XCUDA_TEST_IDS_H
#define XCUDA_TEST_IDS_H

enum xc_test_kind { TK_HOOK, TK_LAUNCH, TK_REAL };

enum xc_test_id {
#define XCUDA_HOOK(name, proc, ver, ptds, params, args) TID_##name,
#define XCUDA_LAUNCH(name, proc, ver, ptds, cost, params, args) TID_##name,
#define XCUDA_REAL(name, proc, ver, ptds, params, args) TID_##name,
#include "../src/hooks.def"
#undef XCUDA_HOOK
#undef XCUDA_LAUNCH
#undef XCUDA_REAL
    TID_COUNT
};

struct xc_test_entry {
    const char *name, *proc;
    int version, ptds;
    enum xc_test_kind kind;
};

static const struct xc_test_entry xc_test_entries[TID_COUNT] = {
#define XCUDA_HOOK(name, proc, ver, ptds, params, args) [TID_##name] = {#name, proc, ver, ptds, TK_HOOK},
#define XCUDA_LAUNCH(name, proc, ver, ptds, cost, params, args) [TID_##name] = {#name, proc, ver, ptds, TK_LAUNCH},
#define XCUDA_REAL(name, proc, ver, ptds, params, args) [TID_##name] = {#name, proc, ver, ptds, TK_REAL},
#include "../src/hooks.def"
#undef XCUDA_HOOK
#undef XCUDA_LAUNCH
#undef XCUDA_REAL
};

#endif
