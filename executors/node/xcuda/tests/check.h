/* The C unit tests' one assertion: count a failure, say where and why, go on. */
#ifndef XCUDA_TEST_CHECK_H
#define XCUDA_TEST_CHECK_H

#include <stdio.h>

static int failures;

#define CHECK(cond, ...)                                            \
    do {                                                            \
        if (!(cond)) {                                              \
            failures++;                                             \
            fprintf(stderr, "%s:%d: FAIL: ", __FILE__, __LINE__);   \
            fprintf(stderr, __VA_ARGS__);                           \
            fputc('\n', stderr);                                    \
        }                                                           \
    } while (0)

#endif
