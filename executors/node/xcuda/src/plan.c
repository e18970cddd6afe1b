/* See plan.h. Runs once, at initialisation. */
#include "plan.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_GENERATIONS 64

static ssize_t read_small(const char *path, char *buf, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return -1;
    size_t got = 0;
    while (got + 1 < cap) {
        ssize_t n = read(fd, buf + got, cap - 1 - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    close(fd);
    buf[got] = '\0';
    return (ssize_t)got;
}

int xc_stepd_title(const char *title, long long *job)
{
    while (*title == ' ')
        title++;
    static const char head[] = "slurmstepd: [";
    if (strncmp(title, head, sizeof head - 1) != 0)
        return -1;
    const char *p = title + sizeof head - 1;
    long long j = 0;
    int digits = 0;
    for (; isdigit((unsigned char)*p); p++, digits++) {
        if (digits >= 18)
            return -1;
        j = j * 10 + (*p - '0');
    }
    if (digits == 0 || *p++ != '.')
        return -1;
    const char *step = p;
    while (isalnum((unsigned char)*p) || *p == '_')
        p++;
    if (p == step || *p++ != ']')
        return -1;
    while (*p == ' ')
        p++;
    if (*p != '\0')
        return -1;
    *job = j;
    return 0;
}

/* comm and parent of a process, from /proc/<pid>/stat ("pid (comm) state ppid ..."; comm may hold ')'). */
static int stat_of(const char *proc_root, pid_t pid, char *comm, size_t comm_len, pid_t *ppid)
{
    char path[96], buf[1024];
    snprintf(path, sizeof path, "%s/%d/stat", proc_root, (int)pid);
    if (read_small(path, buf, sizeof buf) <= 0)
        return -1;
    char *open_p = strchr(buf, '('), *close_p = strrchr(buf, ')');
    if (open_p == NULL || close_p == NULL || close_p < open_p)
        return -1;
    size_t n = (size_t)(close_p - open_p - 1);
    if (n >= comm_len)
        n = comm_len - 1;
    memcpy(comm, open_p + 1, n);
    comm[n] = '\0';
    int pp;
    char state;
    if (sscanf(close_p + 1, " %c %d", &state, &pp) != 2)
        return -1;
    *ppid = (pid_t)pp;
    return 0;
}

/* Whether every uid of the process (real, effective, saved, filesystem) is `uid`. */
static int uids_are(const char *proc_root, pid_t pid, unsigned uid)
{
    char path[96], buf[4096];
    snprintf(path, sizeof path, "%s/%d/status", proc_root, (int)pid);
    if (read_small(path, buf, sizeof buf) <= 0)
        return 0;
    const char *line = strstr(buf, "\nUid:");
    if (line == NULL)
        return 0;
    unsigned u[4];
    if (sscanf(line + 5, "%u %u %u %u", &u[0], &u[1], &u[2], &u[3]) != 4)
        return 0;
    return u[0] == uid && u[1] == uid && u[2] == uid && u[3] == uid;
}

long long xc_stepd_job(const char *proc_root, pid_t start, unsigned owner_uid)
{
    pid_t pid = start;
    for (int gen = 0; gen < MAX_GENERATIONS && pid > 1; gen++) {
        char comm[32];
        pid_t ppid;
        if (stat_of(proc_root, pid, comm, sizeof comm, &ppid) != 0)
            return -1;
        if (!strcmp(comm, "slurmstepd") && uids_are(proc_root, pid, owner_uid)) {
            char path[96], title[256];
            long long job;
            snprintf(path, sizeof path, "%s/%d/cmdline", proc_root, (int)pid);
            /* The title is NUL-padded: its first string is all there is. */
            if (read_small(path, title, sizeof title) > 0 && xc_stepd_title(title, &job) == 0)
                return job;
        }
        /* Not the step daemon (or a user's process named like it): look further up. */
        pid = ppid;
    }
    return -1;
}

ssize_t xc_plan_read(const char *dir, long long job, unsigned owner_uid, char *buf, size_t cap, const char **why)
{
    struct stat st;
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    if (dfd < 0) {
        *why = "no plan directory";
        return -1;
    }
    if (fstat(dfd, &st) != 0 || st.st_uid != owner_uid || (st.st_mode & (S_IWGRP | S_IWOTH))) {
        close(dfd);
        *why = "the plan directory is not root's alone";
        return -1;
    }
    char name[40];
    snprintf(name, sizeof name, "%lld.plan", job);
    /* O_NONBLOCK: a FIFO there cannot block the open (it is refused below). */
    int fd = openat(dfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    close(dfd);
    if (fd < 0) {
        *why = errno == ELOOP ? "the plan file is a symbolic link" : "no plan file for the job";
        return -1;
    }
    ssize_t got = -1;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != owner_uid ||
        (st.st_mode & (S_IWGRP | S_IWOTH)))
        *why = "the plan file is not a regular file only root can write";
    else if (st.st_size > XC_PLAN_MAX || (size_t)st.st_size >= cap)
        *why = "the plan file is larger than a plan";
    else {
        size_t n = 0;
        while (n + 1 < cap) {
            ssize_t r = read(fd, buf + n, cap - 1 - n);
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0)
                break;
            n += (size_t)r;
        }
        buf[n] = '\0';
        got = (ssize_t)n;
    }
    close(fd);
    return got;
}
