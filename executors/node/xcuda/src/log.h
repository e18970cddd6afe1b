/* stderr logging for the slow paths only: never from a launch or a signal handler. */
#ifndef XCUDA_LOG_H
#define XCUDA_LOG_H

#include <stdatomic.h>

#include "config.h"

extern _Atomic int xc_log_level;

__attribute__((format(printf, 2, 3)))
void xc_log(enum xc_log_level level, const char *fmt, ...);

/* Logs the first time `flag` (an _Atomic int, 0 initially) is seen. */
#define XC_LOG_ONCE(flag, level, ...)                        \
    do {                                                     \
        if (!atomic_exchange_explicit(&(flag), 1, memory_order_relaxed)) \
            xc_log(level, __VA_ARGS__);                      \
    } while (0)

#endif
