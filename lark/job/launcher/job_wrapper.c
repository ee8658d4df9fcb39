/* lark-job-wrapper, compiled: lark/job/wrapper.py's paths without an interpreter start per job (issue 27, "the
 * job-side programs as small compiled programs"). `lark install-hook` builds it into $(LARK_LIBEXEC)/lark-job-wrapper
 * (lark/hook_launcher.py); condor_config.d/50-lark.conf chooses it or the Python wrapper for USER_JOB_WRAPPER;
 * measured by bench/wrapper_compiled.py (docs/performance.md, "A compiled wrapper").
 *
 * What it does itself, with the same bytes on larkd's socket as lark/job/client.py:
 *   connect to $LARK_SOCKET (else /run/lark/lark.sock when no lark.toml could move it), send
 *   {"lark":1,"op":"setup"}\n, read one answer line;
 *   - {"ok":true, "env":{...}}: put env into the environment (and LC_CTYPE where the wrapper's interpreter would
 *     have coerced a C locale); then
 *     - no exit barrier (exit_barrier absent, not a number, or <= 0): restore SIGPIPE/SIGXFSZ to their defaults
 *       and exec the job's program, searching PATH the way Python's os.execvp does (no /bin/sh for a file without
 *       #!, ":/bin:/usr/bin" without PATH);
 *     - an exit barrier of W s (true: 1 s): the program as a child (the same exec), every signal but the
 *       wrapper's own (wrapper.NOT_FORWARDED) passed on to it, then {"lark":1,"op":"push","barrier":true}\n
 *       retried as client.call_patiently retries (larkd away or busy, pauses 0.2 s doubling to 2 s with jitter,
 *       for up to W s, 30 s per answer), the wrapper's lines when it was not pushed, then the program's end:
 *       the same exit code, or the same signal with no core of its own; a program that cannot be executed is
 *       the wrapper's refusal (exit 111, no push);
 *   - {"ok":false, "error":"..."} (not busy): the wrapper's refusal, byte for byte: "Lark: job not started, its
 *     network could not be set up: larkd: <error>" on stderr and in $_CONDOR_WRAPPER_ERROR_FILE, a 60 s wait to
 *     be vacated when "held" is true, exit 111;
 *   - no answer within LARK_WRAPPER_TIMEOUT: the same refusal with the wrapper's timeout text, exit 111.
 * Everything else execs the Python wrapper (LARK_PY_WRAPPER, fixed at build time) with the same arguments, before
 * or after asking larkd: larkd unreachable or busy at the setup (the Python wrapper retries for 20 s), a socket a
 * lark.toml could move, an sshd of condor_ssh_to_job, an argument that looks like a flag, an answer that is not
 * plain ASCII JSON, env entries the Python wrapper could not set, a LARK_WRAPPER_TIMEOUT that is not a plain
 * decimal number. So the job never runs without its network, and every case but the common ones behaves as the
 * Python wrapper does. Where a barrier's push fails, the line names the cause as client.py does, except that an
 * answer that is JSON but not an object reads "unreadable", and an "error" that is not a string "unknown error".
 *
 * Build: gcc -O2 -Wall -Wextra -Werror -DLARK_PY_WRAPPER='"/opt/lark/bin/lark-job-wrapper"' -o OUT job_wrapper.c
 */
#define _GNU_SOURCE
#include "larkd_client.h"  /* larkd's client, shared with starter.c */
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>

#ifndef LARK_PY_WRAPPER
#error "build with -DLARK_PY_WRAPPER='\"/opt/lark/bin/lark-job-wrapper\"' (the Python wrapper every other case runs)"
#endif

#define EXIT_NO_NETWORK 111
#define HELD_WAIT_S 60
/* protocol.request("setup"): protocol.dumps({"lark": 1, "op": "setup"}) + "\n" */
static const char SETUP_REQUEST[] = "{\"lark\":1,\"op\":\"setup\"}\n";

extern char **environ;
static char **job_argv;

/* Every case the fast path does not handle: the Python wrapper, with the job's arguments. */
static int fallback(void) {
    int n = 0;
    while (job_argv[n]) n++;
    char **argv = calloc((size_t)n + 2, sizeof *argv);
    if (argv) {
        argv[0] = (char *)LARK_PY_WRAPPER;
        for (int i = 0; i < n; i++) argv[i + 1] = job_argv[i];
        execv(LARK_PY_WRAPPER, argv);
    }
    int err = errno;
    fprintf(stderr, "Lark: job not started, its network could not be set up: cannot run the Python wrapper "
            LARK_PY_WRAPPER ": %s (reinstall Lark on this execution point)\n", strerror(err));
    return EXIT_NO_NETWORK;
}

/* wrapper.fail(): the reason on stderr and in $_CONDOR_WRAPPER_ERROR_FILE. */
static int fail(const char *reason) {
    fprintf(stderr, "Lark: job not started, its network could not be set up: %s\n", reason);
    fflush(stderr);
    const char *err_file = getenv("_CONDOR_WRAPPER_ERROR_FILE");
    if (err_file && *err_file) {
        FILE *f = fopen(err_file, "w");
        if (f) {
            fprintf(f, "Lark: job not started, its network could not be set up: %s\n", reason);
            fclose(f);
        }
    }
    return EXIT_NO_NETWORK;
}

/* LARK_WRAPPER_TIMEOUT as the Python wrapper reads it, when it is a plain decimal number; -1 otherwise. */
static double wrapper_timeout(void) {
    const char *s = getenv("LARK_WRAPPER_TIMEOUT");
    if (!s) return 60.0;
    const char *p = s;
    int digits = 0, frac = 0;
    while (*p >= '0' && *p <= '9') { p++; digits++; }
    if (*p == '.') { p++; while (*p >= '0' && *p <= '9') { p++; frac++; } }
    if (*p || digits == 0 || digits > 6 || frac > 6) return -1;
    double t = strtod(s, NULL);
    return t > 0 ? t : -1;
}

/* os.execvp as Python runs it (os._execvpe): no shell for a file without #!, the first error that is not
 * ENOENT/ENOTDIR wins, else the last one. Returns the errno when nothing could be executed. */
static int exec_like_python(char **argv) {
    const char *file = argv[0];
    if (strchr(file, '/')) { execv(file, argv); return errno; }
    const char *path = getenv("PATH");
    if (!path) path = ":/bin:/usr/bin";  /* os.defpath */
    int saved = 0, last = ENOENT;
    size_t flen = strlen(file);
    const char *p = path;
    for (;;) {
        const char *colon = strchr(p, ':');
        size_t dlen = colon ? (size_t)(colon - p) : strlen(p);
        char *full = malloc(dlen + flen + 2);
        if (!full) return ENOMEM;
        if (dlen) { memcpy(full, p, dlen); full[dlen] = '/'; memcpy(full + dlen + 1, file, flen + 1); }
        else memcpy(full, file, flen + 1);  /* os.path.join("", file): the current directory */
        execv(full, argv);
        last = errno;
        if (!saved && last != ENOENT && last != ENOTDIR) saved = last;
        free(full);
        if (!colon) break;
        p = colon + 1;
    }
    return saved ? saved : last;
}

/* -- the exit barrier (wrapper.py: Forwarder, spawn, barrier, end_like) --------------------------------------- */
/* wrapper.NOT_FORWARDED: the kernel's reports about the wrapper itself, or not catchable. */
static int not_forwarded(int sig) {
    switch (sig) {
    case SIGCHLD: case SIGKILL: case SIGSTOP: case SIGSEGV: case SIGBUS: case SIGILL: case SIGFPE: case SIGTRAP:
    case SIGSYS: case SIGPIPE: return 1;
    default: return 0;
    }
}

static volatile sig_atomic_t child_pid;
static unsigned char forwarding[_NSIG];  /* the signals whose handler is forward() */

/* Signals for the wrapper go to the job's program: the starter signals the job's pid, which is this one. */
static void forward(int sig) {
    int saved = errno;
    if (child_pid > 0) kill((pid_t)child_pid, sig);
    errno = saved;
}

static void install_forwarder(void) {
    struct sigaction sa = {.sa_handler = forward};
    sigfillset(&sa.sa_mask);
    for (int sig = 1; sig < _NSIG; sig++)
        if (!not_forwarded(sig) && sigaction(sig, &sa, NULL) == 0) forwarding[sig] = 1;  /* not glibc's own RT */
}

/* Forwarder.stop(): the program has ended, its pid may be reused; a signal now (condor_rm during the barrier) is
 * for the wrapper itself, with its default effect. */
static void stop_forwarding(void) {
    child_pid = 0;
    for (int sig = 1; sig < _NSIG; sig++)
        if (forwarding[sig]) { signal(sig, SIG_DFL); forwarding[sig] = 0; }
}

#define PUSH_REQUEST "{\"lark\":1,\"op\":\"push\",\"barrier\":true}\n"  /* protocol.request("push", barrier=True) */
#define PUSH_TIMEOUT_S 30.0

/* One client.call("push", barrier=True): 0 answered (a note, if any, in note), 1 failed for good, 2 failed in
 * a way call_patiently retries (DaemonUnreachable, DaemonBusy); msg is str() of the LarkError it raises. */
static int push_once(const char *path, char *msg, size_t cap, char *note, size_t note_cap) {
    char *buf = NULL;
    size_t len = 0;
    int err = 0;
    enum outcome got = ask(path, PUSH_REQUEST, PUSH_TIMEOUT_S, &buf, &len, &err);
    if (got != GOT_ANSWER) return describe_outcome(msg, cap, path, got, err, PUSH_TIMEOUT_S) ? 2 : 1;
    struct answer a;
    int bad = parse_answer(buf, len, &a);
    free(buf);
    if (bad) {  /* not JSON, not an object, or not ASCII (larkd writes ASCII): all of them odd */
        snprintf(msg, cap, "%s: larkd sent an unreadable answer", path);
        return 1;
    }
    if (!truthy(a.ok, a.ok_value, a.ok_text)) {
        const char *text = a.error == K_STRING ? a.error_text : NULL;
        if (truthy(a.busy, a.busy_value, a.busy_text)) {
            snprintf(msg, cap, "larkd: %s (retry in a moment)", text ? text : "busy");
            return 2;
        }
        snprintf(msg, cap, "larkd: %s", text ? text : "unknown error");
        return 1;
    }
    note[0] = 0;
    if (!truthy(a.pushed, a.pushed_value, a.pushed_text) && a.reason == K_STRING && a.reason_text && *a.reason_text)
        snprintf(note, note_cap, "%s", a.reason_text);
    return 0;
}

struct push_try { const char *path; char msg[8192], note[8192]; };

/* One try for call_patiently() (larkd_client.h): push_once's 0/1/2 are TRY_DONE/TRY_FAILED/TRY_AGAIN. */
static int push_attempt(void *ctx) {
    struct push_try *t = ctx;
    return push_once(t->path, t->msg, sizeof t->msg, t->note, sizeof t->note);
}

/* wrapper.barrier(): call_patiently("push", wait=wait, timeout=30, barrier=True); never fails the job. */
static void barrier(const char *path, double wait) {
    static struct push_try t;
    t.path = path;
    if (call_patiently(push_attempt, &t, wait) == TRY_DONE) {
        if (*t.note) fprintf(stderr, "Lark: final network figures not pushed: %s\n", t.note);
        return;
    }
    fprintf(stderr, "Lark: the job's final network figures were not written into its ad (%s); its history keeps the "
            "last periodic figures and larkd's record keeps the exact ones\n", t.msg);
}

/* wrapper.end_like(): end the way the job's program ended, so the starter and the job's history see the same. */
static int end_like(int status) {
    if (WIFSIGNALED(status)) {
        int sig = WTERMSIG(status);
        struct rlimit none = {0, 0};
        setrlimit(RLIMIT_CORE, &none);  /* the program dumped its own core if it could */
        signal(sig, SIG_DFL);
        sigset_t one;
        sigemptyset(&one);
        sigaddset(&one, sig);
        sigprocmask(SIG_UNBLOCK, &one, NULL);
        kill(getpid(), sig);
        return 128 + sig;  /* a signal whose default is not to end the process */
    }
    return WEXITSTATUS(status);
}

/* The job's program as the wrapper's child, signals passed on; after it ended, the barrier; then its status. */
static int run_with_barrier(const char *path, double wait) {
    sigset_t all, old;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, &old);  /* until child_pid is set: a signal meanwhile waits, then is passed on */
    install_forwarder();
    int pipefd[2];
    if (pipe2(pipefd, O_CLOEXEC) != 0) {
        sigprocmask(SIG_SETMASK, &old, NULL);
        char reason[256];
        snprintf(reason, sizeof reason, "cannot execute %.200s: %s", job_argv[0], strerror(errno));
        return fail(reason);
    }
    pid_t pid = fork();
    if (pid == 0) {  /* the job's program: handlers back to the defaults exec would give, then the old mask */
        for (int sig = 1; sig < _NSIG; sig++)
            if (forwarding[sig]) signal(sig, SIG_DFL);
        signal(SIGPIPE, SIG_DFL);  /* wrapper.RESTORED_IN_JOB */
        signal(SIGXFSZ, SIG_DFL);
        sigprocmask(SIG_SETMASK, &old, NULL);
        close(pipefd[0]);
        int e = exec_like_python(job_argv);
        ssize_t w = write(pipefd[1], &e, sizeof e);
        (void)w;
        _exit(127);  /* wrapper.EXIT_NOT_EXECUTED */
    }
    int fork_err = errno;
    close(pipefd[1]);
    if (pid < 0) {
        close(pipefd[0]);
        sigprocmask(SIG_SETMASK, &old, NULL);
        char reason[256];
        snprintf(reason, sizeof reason, "cannot execute %.200s: %s", job_argv[0], strerror(fork_err));
        return fail(reason);
    }
    child_pid = pid;
    sigprocmask(SIG_SETMASK, &old, NULL);
    int exec_err = 0;
    ssize_t r;
    while ((r = read(pipefd[0], &exec_err, sizeof exec_err)) < 0 && errno == EINTR) {}
    close(pipefd[0]);
    int status = 0;
    if (r > 0) {  /* the exec failed: the wrapper's refusal, no barrier (there was no job) */
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
        char reason[4352];
        snprintf(reason, sizeof reason, "cannot execute %.4000s: %s", job_argv[0], strerror(exec_err));
        return fail(reason);
    }
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) { status = EXIT_NO_NETWORK << 8; break; }  /* cannot happen: our only child */
    stop_forwarding();
    barrier(path, wait);
    return end_like(status);
}

int main(int argc, char **argv) {
    job_argv = argv + 1;
    if (argc < 2 || argv[1][0] == '-') return fallback();           /* usage, or a flag: the Python wrapper's */
    const char *base = strrchr(argv[1], '/');
    if (!strcmp(base ? base + 1 : argv[1], "sshd")) return fallback();  /* condor_ssh_to_job's sshd */
    const char *path = socket_path();
    double timeout = wrapper_timeout();
    if (!path || timeout <= 0) return fallback();

    char *buf = NULL;
    size_t len = 0;
    int err = 0;
    enum outcome got = ask(path, SETUP_REQUEST, timeout, &buf, &len, &err);
    if (got != GOT_ANSWER && got != TIMED_OUT) return fallback();  /* the Python wrapper retries for 20 s */
    if (got == TIMED_OUT) {
        char reason[4352];
        snprintf(reason, sizeof reason, "%s: larkd did not answer within %g s (check larkd's log)", path, timeout);
        return fail(reason);
    }
    struct answer a;
    if (parse_answer(buf, len, &a)) return fallback();
    if (a.busy == K_TRUE || (a.busy != K_NONE && a.busy != K_FALSE && a.busy != K_NULL)) return fallback();
    if (a.ok != K_TRUE) {
        if (a.ok != K_NONE && a.ok != K_FALSE && a.ok != K_NULL) return fallback();  /* truthy in Python: odd */
        if (a.error != K_NONE && a.error != K_STRING) return fallback();
        size_t n = strlen(a.error_text ? a.error_text : "unknown error") + 16;
        char *reason = malloc(n);
        if (!reason) return fallback();
        snprintf(reason, n, "larkd: %s", a.error_text ? a.error_text : "unknown error");
        int code = fail(reason);
        if (a.held == K_TRUE) {  /* wrapper.wait_to_be_vacated(): the starter will kill this process */
            struct timespec left = {HELD_WAIT_S, 0};
            while (nanosleep(&left, &left) != 0 && errno == EINTR) {}
        }
        return code;
    }
    if (a.env_bad) return fallback();
    for (int i = 0; i < a.n_env; i++)
        if (setenv(a.env_key[i], a.env_value[i], 1) != 0) return fallback();
    coerce_c_locale_like_python();
    /* exit_barrier: Python takes a number (a bool is one: True waits 1 s) > 0 as a barrier, anything else as none. */
    if (a.barrier == K_TRUE) return run_with_barrier(path, 1.0);
    if (a.barrier == K_NUMBER && a.barrier_value > 0) return run_with_barrier(path, a.barrier_value);
    signal(SIGPIPE, SIG_DFL);  /* wrapper.RESTORED_IN_JOB */
    signal(SIGXFSZ, SIG_DFL);
    err = exec_like_python(job_argv);
    char reason[4352];
    snprintf(reason, sizeof reason, "cannot execute %.4000s: %s", job_argv[0], strerror(err));
    return fail(reason);
}
