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

int xc_conf_parse(const char *text, char *dir, size_t cap, const char **why)
{
    static const char key[] = "plan_dir";
    int found = 0;
    for (const char *line = text; *line;) {
        const char *end = strchr(line, '\n');
        if (end == NULL)
            end = line + strlen(line);
        const char *p = line, *q = end;
        line = *end ? end + 1 : end;
        while (p < q && isspace((unsigned char)*p))
            p++;
        while (q > p && isspace((unsigned char)q[-1]))
            q--;
        if (p == q || *p == '#')
            continue;
        /* One key only: a line this version does not know may be a limit it would get wrong, so none counts. */
        if ((size_t)(q - p) < sizeof key || strncmp(p, key, sizeof key - 1) != 0 || p[sizeof key - 1] != '=') {
            *why = "a line that is not plan_dir=<path>";
            return -1;
        }
        if (found) {
            *why = "plan_dir given twice";
            return -1;
        }
        p += sizeof key;
        while (p < q && isspace((unsigned char)*p))
            p++;
        if (p == q || *p != '/') {
            *why = "plan_dir is not an absolute path";
            return -1;
        }
        if ((size_t)(q - p) >= cap) {
            *why = "plan_dir is too long";
            return -1;
        }
        memcpy(dir, p, (size_t)(q - p));
        dir[q - p] = '\0';
        found = 1;
    }
    if (!found) {
        *why = "no plan_dir line";
        return -1;
    }
    return 0;
}

int xc_conf_plan_dir(const char *lib_path, unsigned owner_uid, char *dir, size_t cap, const char **why)
{
    const char *slash = strrchr(lib_path, '/');
    if (slash == NULL) {
        *why = "the library's path names no directory";
        return 0;
    }
    char libdir[4096];
    size_t n = slash == lib_path ? 1 : (size_t)(slash - lib_path);
    if (n >= sizeof libdir) {
        *why = "the library's path is too long";
        return -1;
    }
    memcpy(libdir, lib_path, n);
    libdir[n] = '\0';
    int dfd = open(libdir, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    if (dfd < 0) {
        *why = errno == ELOOP || errno == ENOTDIR ? "the library's directory is a symbolic link"
                                                  : "the library's directory cannot be opened";
        return -1;
    }
    /* O_NONBLOCK: a FIFO there cannot block the open (it is refused below). */
    int fd = openat(dfd, XC_CONF_NAME, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) {
        int err = errno;
        close(dfd);
        *why = err == ENOENT ? "no " XC_CONF_NAME " beside the library"
             : err == ELOOP  ? XC_CONF_NAME " is a symbolic link"
                             : XC_CONF_NAME " cannot be opened";
        return err == ENOENT ? 0 : -1;
    }
    struct stat st;
    int dir_ok = fstat(dfd, &st) == 0 && st.st_uid == owner_uid && !(st.st_mode & (S_IWGRP | S_IWOTH));
    close(dfd);
    int rc = -1;
    char text[XC_PLAN_MAX + 1];
    if (!dir_ok)
        /* A user's directory: his link to the real library beside a file of his, or root's file hard-linked in. */
        *why = "the library's directory is not root's alone";
    else if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != owner_uid ||
             (st.st_mode & (S_IWGRP | S_IWOTH)))
        *why = XC_CONF_NAME " is not a regular file only root can write";
    else if (st.st_size > XC_PLAN_MAX)
        *why = XC_CONF_NAME " is larger than 4 KiB";
    else {
        size_t got = 0;
        while (got + 1 < sizeof text) {
            ssize_t r = read(fd, text + got, sizeof text - 1 - got);
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0)
                break;
            got += (size_t)r;
        }
        text[got] = '\0';
        if (memchr(text, '\0', got) != NULL)
            *why = XC_CONF_NAME " holds a NUL byte";
        else if (xc_conf_parse(text, dir, cap, why) == 0)
            rc = 1;
    }
    close(fd);
    return rc;
}
