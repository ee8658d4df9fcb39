/* lark-prepare-job, the PREPARE_JOB hook: its common path compiled, and the Python hook for everything else, so
 * that neither is ever traceable (issue 27: no interpreter start per job on the common path).
 *
 * The hook runs as the job's user in the execution point's own network namespace. A process of that user may
 * ptrace it (where yama is absent or ptrace_scope is 0) unless it is not dumpable, and the Python hook can make
 * itself non-dumpable only after its interpreter has started and imported, tens of ms in which a same-uid job
 * that watches for the hook's pid can attach first.
 *
 * Installed setgid to a group with no privileges at all (`lark install-hook`, group lark-hook, mode 2755).
 * From the exec of this file on, the process's effective gid differs from its real gid, so:
 *  - at each exec (this one, and the Python hook's below where it runs), begin_new_exec() (fs/exec.c) sets the
 *    process dumpable only when euid == uid and egid == gid; otherwise it takes fs.suid_dumpable (0 or 2), and
 *    __ptrace_may_access() (kernel/ptrace.c) refuses a tracer without CAP_SYS_PTRACE unless the target is
 *    SUID_DUMP_USER;
 *  - the same function's credential check refuses a tracer whose gid differs from the target's egid/sgid/gid
 *    (this one alone holds where fs.suid_dumpable = 1).
 * Within each exec the credentials and dumpability change under the lock PTRACE_ATTACH takes (cred_guard_mutex).
 * On the common path there is no second exec: this program is the whole hook, and both refusals hold from its
 * first instruction to its exit. Where it execs the Python hook, it runs with both refusals in force between the
 * two execs: no instant is left to attach either way.
 *
 * The common path, lark/job/prepare_hook.py's main() with the same bytes on larkd's socket as lark/job/client.py:
 * read stdin to EOF (the job ad; not a terminal), then call_patiently("check", wait=LARK_PREFLIGHT_WAIT (10; a
 * value float() refuses: 10), timeout=30): connect to $LARK_SOCKET (else /run/lark/lark.sock when no lark.toml
 * could move it), send {"lark":1,"op":"check"}\n, read one answer line, retried while larkd is away or busy
 * (larkd_client.h's call_patiently, shared with job_wrapper.c's exit barrier). Then, as the Python hook:
 *  - ok: nothing on stdout, exit 0;
 *  - larkd away (or busy) past the wait: the hold ad HookStatusCode = 111 with prepare_hook.py's fix, exit 1;
 *  - larkd's refusal (ok false, not busy), no answer within 30 s, permission denied: HookStatusCode = 112, exit 1;
 * the HookStatusMessage byte for byte as prepare_hook.hold_ad() writes it (LarkError.render(), classad_string()).
 * Everything the C cannot reproduce exactly execs the Python hook, with the job ad it read fed to it again on
 * stdin (a memfd): a socket a lark.toml could move or too long for a Unix address, a job ad or a
 * LARK_PREFLIGHT_WAIT that is not ASCII, an answer that is not plain ASCII JSON, an "error" that is not a string,
 * a hold text that is not plain printable ASCII. The Python hook then starts over and decides alone.
 *
 * Nothing comes from the environment or the arguments that chooses what runs: the interpreter and the hook's
 * script are fixed at build time (-DLARK_HOOK_PYTHON, -DLARK_HOOK_SCRIPT), and the interpreter runs isolated (-I:
 * no PYTHON* variables, no user site-packages in the job user's home, no current directory on sys.path, which
 * may be the job's scratch directory, filled by the job). The environment is passed on as it is (the glibc
 * loader already drops its unsafe variables for a setgid exec; the hook needs none of them); LARK_SOCKET,
 * LARK_CONFIG and LARK_PREFLIGHT_WAIT are read here as the Python hook reads them.
 *
 * Build: gcc -O2 -Wall -Wextra -Werror -DLARK_HOOK_PYTHON='"/opt/lark/bin/python"'
 *        -DLARK_HOOK_SCRIPT='"/opt/lark/bin/lark-prepare-job"' -o OUT prepare_job.c   (lark install-hook does)
 */
#define _GNU_SOURCE
#include "larkd_client.h"  /* larkd's client, shared with job_wrapper.c and starter.c */
#include <sys/mman.h>
#include <sys/prctl.h>

#ifndef LARK_HOOK_PYTHON
#error "build with -DLARK_HOOK_PYTHON='\"/opt/lark/bin/python\"' (lark install-hook does)"
#endif
#ifndef LARK_HOOK_SCRIPT
#error "build with -DLARK_HOOK_SCRIPT='\"/opt/lark/bin/lark-prepare-job\"' (lark install-hook does)"
#endif

#define STATUS_UNREACHABLE 111  /* prepare_hook.STATUS_UNREACHABLE: larkd not running (transient: released) */
#define STATUS_REFUSED 112      /* prepare_hook.STATUS_REFUSED: larkd refused: stays held */
/* protocol.request("check") */
static const char CHECK_REQUEST[] = "{\"lark\":1,\"op\":\"check\"}\n";
#define CHECK_TIMEOUT_S 30.0
/* The fix prepare_hook.py sets on a DaemonUnreachable. */
#define AWAY_FIX "usually transient: condor_master restarts larkd and the job is released again automatically; " \
                 "if it stays held, check the execution point's LarkdLog and condor_on -daemon LARKD"
#define TRY_PYTHON 3  /* a try's result beyond larkd_client.h's: only the Python hook can tell what follows */

extern char **environ;

static char *job_ad;
static size_t job_ad_len;
static int job_ad_read;  /* stdin was read (to EOF, or up to an error): the Python hook gets job_ad instead */

/* A hold ad on stdout for a launcher that cannot run the hook at all: HTCondor holds the job with this reason
 * (HoldReasonCode 19, subcode 112, like a policy refusal), rather than starting it after a hook that could not
 * check it. */
static int hold(const char *reason, const char *detail) {
    printf("HookStatusCode = 112\nHookStatusMessage = \"Lark: job not started: %s%s; "
           "fix: run lark install-hook as root on this execution point (docs/install.md)\"\n", reason, detail);
    fflush(stdout);
    return 1;
}

/* The Python hook, `python -I script`, on the same stdin: the job ad read so far handed on in a memfd. */
static int python_hook(void) {
    if (job_ad_read) {
        int fd = memfd_create("lark-job-ad", MFD_CLOEXEC);
        size_t off = 0;
        if (fd < 0) return hold("cannot hand the job ad on to " LARK_HOOK_SCRIPT ": ", strerror(errno));
        while (off < job_ad_len) {
            ssize_t w = write(fd, job_ad + off, job_ad_len - off);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) return hold("cannot hand the job ad on to " LARK_HOOK_SCRIPT ": ", strerror(errno));
            off += (size_t)w;
        }
        if (lseek(fd, 0, SEEK_SET) != 0 || dup2(fd, 0) != 0)
            return hold("cannot hand the job ad on to " LARK_HOOK_SCRIPT ": ", strerror(errno));
        close(fd);
    }
    char *const argv[] = {LARK_HOOK_PYTHON, "-I", LARK_HOOK_SCRIPT, NULL};
    execve(LARK_HOOK_PYTHON, argv, environ);
    return hold("cannot run " LARK_HOOK_PYTHON ": ", strerror(errno));
}

/* `if not sys.stdin.isatty(): sys.stdin.read()`: 0 when read to EOF (or a terminal, left alone). */
static int read_job_ad(void) {
    if (isatty(0)) return 0;
    size_t cap = 1 << 16;
    job_ad = malloc(cap);
    if (!job_ad) return -1;
    for (;;) {
        if (job_ad_len == cap) {
            char *more = realloc(job_ad, cap * 2);
            if (!more) return -1;
            job_ad = more;
            cap *= 2;
        }
        ssize_t r = read(0, job_ad + job_ad_len, cap - job_ad_len);
        if (r > 0) { job_ad_read = 1; job_ad_len += (size_t)r; continue; }
        if (r == 0) { job_ad_read = 1; return 0; }
        if (errno != EINTR) return -1;  /* the Python hook meets the same error on what is left */
    }
}

static int all_ascii(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] >= 0x80) return 0;
    return 1;
}

static int printable_ascii(const char *s) {
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || (unsigned char)*s > 0x7e) return 0;
    return 1;
}

/* Python's float() of an ASCII text: whitespace around, a sign, digits with single underscores between them, a
 * fraction, an exponent, or inf/infinity/nan in any case. */
static int digits(const char **p) {
    if (**p < '0' || **p > '9') return 0;
    while ((**p >= '0' && **p <= '9') || (**p == '_' && (*p)[1] >= '0' && (*p)[1] <= '9')) (*p)++;
    return 1;
}

static int py_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f); }

/* float(os.environ.get("LARK_PREFLIGHT_WAIT", "10")), 10 where that raises ValueError; -1 for a text that is not
 * ASCII (what float() makes of other Unicode digits and spaces is left to the Python hook). */
static int preflight_wait(double *wait) {
    const char *s = getenv("LARK_PREFLIGHT_WAIT");
    *wait = 10.0;
    if (!s) return 0;
    if (!all_ascii(s, strlen(s))) return -1;
    while (py_space(*s)) s++;
    size_t n = strlen(s);
    while (n && py_space(s[n - 1])) n--;
    char *text = strndup(s, n), *clean = malloc(n + 1);
    if (!text || !clean) { free(text); free(clean); return -1; }
    const char *p = text;
    int ok = 1;
    if (*p == '+' || *p == '-') p++;
    if (!strcasecmp(p, "inf") || !strcasecmp(p, "infinity") || !strcasecmp(p, "nan")) p += strlen(p);
    else {
        int whole = digits(&p), frac = 0;
        if (*p == '.') { p++; frac = digits(&p); }
        if (!whole && !frac) ok = 0;
        if (ok && (*p == 'e' || *p == 'E')) {
            p++;
            if (*p == '+' || *p == '-') p++;
            if (!digits(&p)) ok = 0;
        }
    }
    if (ok && !*p) {
        size_t k = 0;
        for (const char *q = text; *q; q++)
            if (*q != '_') clean[k++] = *q;
        clean[k] = 0;
        *wait = strtod(clean, NULL);
    }
    free(text);
    free(clean);
    return 0;
}

/* The LarkError of a failed try, in LarkError.render()'s parts: "obj: what (fix)". */
struct check_try {
    const char *path;
    char obj[128];
    char *what;
    const char *fix;
};

static int set_what(struct check_try *t, const char *obj, const char *what, const char *fix) {
    free(t->what);
    t->what = strdup(what);
    snprintf(t->obj, sizeof t->obj, "%s", obj);
    t->fix = fix;
    if (!t->what || !printable_ascii(t->what)) return -1;
    return 0;
}

/* One client.call("check", timeout=30): TRY_DONE answered ok, TRY_FAILED a LarkError call_patiently passes on,
 * TRY_AGAIN a DaemonUnreachable or DaemonBusy, TRY_PYTHON what only the Python hook can tell. */
static int check_once(void *ctx) {
    struct check_try *t = ctx;
    char *buf = NULL;
    size_t len = 0;
    int err = 0;
    enum outcome got = ask(t->path, CHECK_REQUEST, CHECK_TIMEOUT_S, &buf, &len, &err);
    if (got != GOT_ANSWER) {
        char what[512];
        const char *fix;
        int again = outcome_parts(got, err, CHECK_TIMEOUT_S, what, sizeof what, &fix);
        if (set_what(t, t->path, what, fix)) return TRY_PYTHON;
        return again ? TRY_AGAIN : TRY_FAILED;
    }
    struct answer a;
    int bad = parse_answer(buf, len, &a);
    free(buf);
    if (bad) return TRY_PYTHON;  /* not JSON, not an object, not ASCII: client.py's own words for each */
    if (truthy(a.ok, a.ok_value, a.ok_text)) return TRY_DONE;
    if (a.error != K_NONE && a.error != K_STRING) return TRY_PYTHON;  /* str() of a non-string: Python's */
    if (truthy(a.busy, a.busy_value, a.busy_text)) {  /* DaemonBusy(answer.get("error", "busy"), obj="larkd") */
        if (set_what(t, "larkd", a.error_text ? a.error_text : "busy", "retry in a moment")) return TRY_PYTHON;
        return TRY_AGAIN;
    }
    /* LarkError(answer.get("error", "unknown error"), obj="larkd") */
    if (set_what(t, "larkd", a.error_text ? a.error_text : "unknown error", NULL)) return TRY_PYTHON;
    return TRY_FAILED;
}

/* prepare_hook.classad_string() of a printable ASCII text: backslashes as '/', runs of spaces as one, none at
 * either end, quotes as \". */
static char *classad_string(const char *text) {
    size_t n = strlen(text), o = 0;
    char *out = malloc(2 * n + 3);
    if (!out) return NULL;
    int pending = 0, any = 0;
    out[o++] = '"';
    for (const char *p = text; *p; p++) {
        char c = *p == '\\' ? '/' : *p;
        if (c == ' ') { pending = any; continue; }
        if (pending) { out[o++] = ' '; pending = 0; }
        if (c == '"') out[o++] = '\\';
        out[o++] = c;
        any = 1;
    }
    out[o++] = '"';
    out[o] = 0;
    return out;
}

/* prepare_hook.hold_ad(code, head + str(e)) on stdout; exit 1. */
static int hold_ad(int code, const char *head, const struct check_try *t, const char *fix) {
    char *reason = NULL;
    int n = fix ? asprintf(&reason, "Lark: %s%s: %s (%s)", head, t->obj, t->what, fix)
                : asprintf(&reason, "Lark: %s%s: %s", head, t->obj, t->what);
    char *literal = n < 0 ? NULL : classad_string(reason);
    free(reason);
    if (!literal) return python_hook();
    printf("HookStatusCode = %d\nHookStatusMessage = %s\n", code, literal);
    free(literal);
    fflush(stdout);
    return 1;
}

int main(void) {
    /* Without the setgid bit (copied without -p, a nosuid mount, a foreign owner), the hook would start dumpable
     * again: refuse rather than run with the window open. */
    if (getegid() == getgid())
        return hold("the PREPARE_JOB launcher of " LARK_HOOK_SCRIPT " runs without its setgid group", "");
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);  /* as the Python hook's nondumpable(); the setgid exec already made it so */
    if (read_job_ad() != 0 || !all_ascii(job_ad, job_ad_len)) return python_hook();
    double wait;
    const char *path = socket_path();
    if (preflight_wait(&wait) || !path || strlen(path) >= sizeof ((struct sockaddr_un *)0)->sun_path ||
        !printable_ascii(path))
        return python_hook();
    struct check_try t = {.path = path};
    switch (call_patiently(check_once, &t, wait)) {
    case TRY_DONE:
        return 0;
    case TRY_FAILED:
        return hold_ad(STATUS_REFUSED, "job not started, its network was refused: ", &t, t.fix);
    case TRY_AGAIN:  /* prepare_hook.py replaces the DaemonUnreachable's fix */
        return hold_ad(STATUS_UNREACHABLE, "job not started: ", &t, AWAY_FIX);
    default:
        return python_hook();
    }
}
