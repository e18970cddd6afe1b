/*
 * Where xCUDA's limits come from: the root-owned plan file the Prolog wrote for this process's job
 * (docs/SLURM.md "Node scripts"). The job is the one of the nearest ancestor that is Slurm's own step daemon,
 * root's `slurmstepd: [<job>.<step>]` (the rule of executors/node/attribution.py), never SLURM_JOB_ID, which
 * the job sets as it likes.
 */
#ifndef XCUDA_PLAN_H
#define XCUDA_PLAN_H

#include <stddef.h>
#include <sys/types.h>

#define XC_PLAN_MAX 4096  /* a plan is a few hundred bytes; a larger file is not one the Prolog wrote */

/* The job id of the nearest ancestor of this process whose comm is "slurmstepd", whose real, effective, saved
 * and filesystem uids are all `owner_uid` and whose title (/proc/<pid>/cmdline) is `slurmstepd: [<job>.<step>]`;
 * -1 if there is none within 64 generations. `proc_root` is "/proc" but for the unit tests. */
long long xc_stepd_job(const char *proc_root, pid_t start, unsigned owner_uid);

/* Whether the title is a step daemon's, `slurmstepd: [<digits>.<[0-9A-Za-z_]+>]` (blanks around it allowed);
 * its job id in *job. Pure, for the unit tests. */
int xc_stepd_title(const char *title, long long *job);

/* Reads `<dir>/<job>.plan` into buf (NUL-ended) if only `owner_uid` can have written it: `dir` a directory (not a
 * link) owned by `owner_uid` and writable by neither group nor others, the file a regular file (opened with
 * O_NOFOLLOW, relative to that directory) owned by `owner_uid`, writable by neither group nor others and at most
 * XC_PLAN_MAX bytes. Returns its length, or -1 with *why saying what was wrong. */
ssize_t xc_plan_read(const char *dir, long long job, unsigned owner_uid, char *buf, size_t cap, const char **why);

/* The root configuration file beside the library, `xcuda.conf` in the directory of the path the library was loaded
 * from: a site, or the dev cluster, with its plan directory elsewhere than the compiled-in one needs no build of its
 * own, and the job cannot point xCUDA at another (a user's copy or link of the library in a directory of his has no
 * root's file beside it). */
#define XC_CONF_NAME "xcuda.conf"

/* Parses the text of an xcuda.conf: blank lines, `#` comments and exactly one `plan_dir=<absolute path>` (blanks
 * around the value allowed) shorter than `cap`; anything else makes the whole file count for nothing. Returns 0
 * with the path in `dir`, or -1 with *why. Pure, for the unit tests. */
int xc_conf_parse(const char *text, char *dir, size_t cap, const char **why);

/* The plan directory of the xcuda.conf beside `lib_path` (the library's path as the loader was given it), if only
 * `owner_uid` can have written it: the directory of `lib_path` (not a link) owned by `owner_uid` and writable by
 * neither group nor others, the file a regular file (O_NOFOLLOW, relative to that directory) owned by `owner_uid`,
 * writable by neither group nor others, at most XC_PLAN_MAX bytes, and one that parses. Returns 1 with the path in
 * `dir`; 0 if there is no such file (the compiled-in directory is meant); -1 if there is one that does not count,
 * with *why. */
int xc_conf_plan_dir(const char *lib_path, unsigned owner_uid, char *dir, size_t cap, const char **why);

#endif
