/* A stand-in for a root condor_starter started with NO_JOB_NETWORKING: it clones the job into an empty
 * network namespace, drops to an unprivileged uid and execs the job (lark-job-wrapper ...). It waits for the
 * job and exits with its status, so larkd sees the "starter" exit when the job ends.
 *
 * usage: lark-test-starter -a SLOT -u UID [-H] [-s SECONDS] -- PROGRAM [ARGS...]
 *   -H  keep the job in the starter's network namespace (a hostile case larkd must refuse)
 *   -s  linger this many seconds after the job exits (to test teardown timing)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <grp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    const char *slot = NULL;
    uid_t uid = 65534;
    int host_ns = 0, linger = 0, i;
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-a") && i + 1 < argc) slot = argv[++i];
        else if (!strcmp(argv[i], "-u") && i + 1 < argc) uid = (uid_t)atoi(argv[++i]);
        else if (!strcmp(argv[i], "-s") && i + 1 < argc) linger = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-H")) host_ns = 1;
        else if (!strcmp(argv[i], "--")) { i++; break; }
    }
    if (!slot || i >= argc) {
        fprintf(stderr, "usage: %s -a SLOT -u UID [-H] [-s N] -- PROGRAM [ARGS...]\n", argv[0]);
        return 2;
    }
    pid_t pid = fork();
    if (pid < 0) { perror("fork"); return 2; }
    if (pid == 0) {
        if (!host_ns && unshare(CLONE_NEWNET) != 0) { perror("unshare(CLONE_NEWNET)"); _exit(2); }
        if (setgroups(0, NULL) != 0 || setgid((gid_t)uid) != 0 || setuid(uid) != 0) { perror("drop privileges"); _exit(2); }
        execvp(argv[i], &argv[i]);
        perror("execvp");
        _exit(127);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    if (linger > 0) sleep((unsigned)linger);
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    return 128 + WTERMSIG(status);
}
