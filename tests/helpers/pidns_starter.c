/* A stand-in for a root condor_starter with NO_JOB_NETWORKING and USE_PID_NAMESPACES = True: like HTCondor's
 * CreateProcessForkit::fork it clones the job with CLONE_NEWPID|CLONE_NEWNS|CLONE_NEWNET (and hands the child its
 * pids through a pipe, made because CLONE_NEWPID is set), makes the job's mounts slaves and mounts a /proc of the
 * new PID namespace (FilesystemRemap::RemapProc), drops to an unprivileged uid and execs the job, which is pid 1 of
 * its namespace. SIGTERM, SIGQUIT, SIGINT, SIGHUP, SIGUSR1 and SIGUSR2 sent to it go to the job's pid, as the
 * starter's soft kill does. It waits for the job, says on stderr how the job ended, and exits with its status.
 *
 * usage: lark-pidns-starter -a SLOT -u UID -- PROGRAM [ARGS...]
 */
#define _GNU_SOURCE
#include <errno.h>
#include <grp.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static pid_t job = 0;

static void forward(int sig) {
    if (job > 0) kill(job, sig);
}

int main(int argc, char **argv) {
    const char *slot = NULL;
    uid_t uid = 65534;
    int i, rw[2];
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-a") && i + 1 < argc) slot = argv[++i];
        else if (!strcmp(argv[i], "-u") && i + 1 < argc) uid = (uid_t)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--")) { i++; break; }
    }
    if (!slot || i >= argc) {
        fprintf(stderr, "usage: %s -a SLOT -u UID -- PROGRAM [ARGS...]\n", argv[0]);
        return 2;
    }
    if (pipe(rw) != 0) { perror("pipe"); return 2; }
    long pid = syscall(SYS_clone, CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWNET | SIGCHLD, 0, NULL, NULL);
    if (pid < 0) { perror("clone"); return 2; }
    if (pid == 0) {
        pid_t pids[2];
        close(rw[1]);
        if (read(rw[0], pids, sizeof pids) != sizeof pids) { perror("read pids"); _exit(2); }
        close(rw[0]);
        if (mount("", "/", NULL, MS_REC | MS_SLAVE, NULL) != 0) { perror("mount / slave"); _exit(2); }
        if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) != 0) { perror("mount /proc"); _exit(2); }
        if (setgroups(0, NULL) != 0 || setgid((gid_t)uid) != 0 || setuid(uid) != 0) { perror("drop privileges"); _exit(2); }
        execvp(argv[i], &argv[i]);
        perror("execvp");
        _exit(127);
    }
    job = (pid_t)pid;
    pid_t pids[2] = {getpid(), job};
    close(rw[0]);
    if (write(rw[1], pids, sizeof pids) != sizeof pids) { perror("write pids"); return 2; }
    close(rw[1]);
    int sigs[] = {SIGTERM, SIGQUIT, SIGINT, SIGHUP, SIGUSR1, SIGUSR2};
    for (unsigned k = 0; k < sizeof sigs / sizeof sigs[0]; k++) signal(sigs[k], forward);
    int status = 0;
    while (waitpid(job, &status, 0) < 0 && errno == EINTR) {}
    if (WIFEXITED(status)) {
        fprintf(stderr, "pidns-starter: job exited %d\n", WEXITSTATUS(status));
        return WEXITSTATUS(status);
    }
    fprintf(stderr, "pidns-starter: job killed by signal %d\n", WTERMSIG(status));
    return 128 + WTERMSIG(status);
}
