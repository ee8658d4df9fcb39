/* lark-job-wrapper-fast: the common path of lark-job-wrapper (lark/job/wrapper.py) without an interpreter start.
 *
 * PROTOTYPE (issue 27, "the job-side programs as small compiled programs"): measured by bench/wrapper_compiled.py,
 * not what HTCondor runs by default (docs/performance.md, "A compiled wrapper").
 *
 * What it does itself, with the same bytes on larkd's socket as lark/job/client.py:
 *   connect to $LARK_SOCKET (else /run/lark/lark.sock when no lark.toml could move it), send
 *   {"lark":1,"op":"setup"}\n, read one answer line;
 *   - {"ok":true, "env":{...}} with no exit barrier (exit_barrier absent, not a number, or <= 0): put env into the
 *     environment (and LC_CTYPE where the wrapper's interpreter would have coerced a C locale), restore
 *     SIGPIPE/SIGXFSZ to their defaults and exec the job's program, searching PATH the way Python's os.execvp
 *     does (no /bin/sh for a file without #!, ":/bin:/usr/bin" without PATH);
 *   - {"ok":false, "error":"..."} (not busy): the wrapper's refusal, byte for byte: "Lark: job not started, its
 *     network could not be set up: larkd: <error>" on stderr and in $_CONDOR_WRAPPER_ERROR_FILE, a 60 s wait to
 *     be vacated when "held" is true, exit 111;
 *   - no answer within LARK_WRAPPER_TIMEOUT: the same refusal with the wrapper's timeout text, exit 111.
 * Everything else execs the Python wrapper (LARK_PY_WRAPPER, fixed at build time) with the same arguments, before
 * or after asking larkd: an exit barrier announced (the Python wrapper asks again and larkd answers `reused`),
 * larkd unreachable or busy (the Python wrapper retries for 20 s), a socket a lark.toml could move, an sshd of
 * condor_ssh_to_job, an argument that looks like a flag, an answer that is not plain ASCII JSON, env entries the
 * Python wrapper could not set, a LARK_WRAPPER_TIMEOUT that is not a plain decimal number. So the job never runs
 * without its network, and every case but the common one behaves as the Python wrapper does.
 *
 * Build: gcc -O2 -Wall -Wextra -Werror -DLARK_PY_WRAPPER='"/opt/lark/bin/lark-job-wrapper"' -o OUT job_wrapper.c
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <locale.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#ifndef LARK_PY_WRAPPER
#error "build with -DLARK_PY_WRAPPER='\"/opt/lark/bin/lark-job-wrapper\"' (the Python wrapper every other case runs)"
#endif

#define EXIT_NO_NETWORK 111
#define HELD_WAIT_S 60
#define DEFAULT_SOCKET "/run/lark/lark.sock"
#define CONFIG_FILE "/etc/lark/lark.toml"
#define MAX_ANSWER (1 << 20)
#define MAX_ENV 64
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

/* -- the answer: one JSON object; only what the wrapper reads is kept, the rest is checked and skipped -------- */
enum kind { K_NONE, K_TRUE, K_FALSE, K_NULL, K_NUMBER, K_STRING, K_OTHER };
struct answer {
    enum kind ok, busy, held, barrier, error;
    double barrier_value;
    char *error_text;
    int env_seen, env_bad, n_env;
    char *env_key[MAX_ENV], *env_value[MAX_ENV];
};

struct parser { const char *p, *end; };

static void ws(struct parser *ps) {
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r')) ps->p++;
}

static int hex4(const char *s, unsigned *out) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else return -1;
    }
    *out = v;
    return 0;
}

/* A JSON string at ps->p (the opening quote); decoded into a new buffer (UTF-8) when out is not NULL. A NUL
 * character or a lone surrogate makes it -1: Python could hold it, but not put it into the environment. */
static int string(struct parser *ps, char **out) {
    if (ps->p >= ps->end || *ps->p != '"') return -1;
    ps->p++;
    size_t cap = (size_t)(ps->end - ps->p) + 1, n = 0;
    char *buf = out ? malloc(cap) : NULL;
    if (out && !buf) return -1;
    while (ps->p < ps->end && *ps->p != '"') {
        unsigned char c = (unsigned char)*ps->p++;
        if (c < 0x20) goto bad;
        if (c != '\\') { if (buf) buf[n++] = (char)c; continue; }
        if (ps->p >= ps->end) goto bad;
        char e = *ps->p++;
        unsigned cp;
        switch (e) {
        case '"': cp = '"'; break;
        case '\\': cp = '\\'; break;
        case '/': cp = '/'; break;
        case 'b': cp = '\b'; break;
        case 'f': cp = '\f'; break;
        case 'n': cp = '\n'; break;
        case 'r': cp = '\r'; break;
        case 't': cp = '\t'; break;
        case 'u':
            if (ps->end - ps->p < 4 || hex4(ps->p, &cp)) goto bad;
            ps->p += 4;
            if (cp >= 0xD800 && cp < 0xDC00) {
                unsigned lo;
                if (ps->end - ps->p < 6 || ps->p[0] != '\\' || ps->p[1] != 'u' || hex4(ps->p + 2, &lo) ||
                    lo < 0xDC00 || lo >= 0xE000) goto bad;
                ps->p += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp < 0xE000) goto bad;
            break;
        default: goto bad;
        }
        if (cp == 0) goto bad;
        if (!buf) continue;
        if (cp < 0x80) buf[n++] = (char)cp;
        else if (cp < 0x800) { buf[n++] = (char)(0xC0 | cp >> 6); buf[n++] = (char)(0x80 | (cp & 0x3F)); }
        else if (cp < 0x10000) {
            buf[n++] = (char)(0xE0 | cp >> 12); buf[n++] = (char)(0x80 | (cp >> 6 & 0x3F));
            buf[n++] = (char)(0x80 | (cp & 0x3F));
        } else {
            buf[n++] = (char)(0xF0 | cp >> 18); buf[n++] = (char)(0x80 | (cp >> 12 & 0x3F));
            buf[n++] = (char)(0x80 | (cp >> 6 & 0x3F)); buf[n++] = (char)(0x80 | (cp & 0x3F));
        }
    }
    if (ps->p >= ps->end) goto bad;
    ps->p++;
    if (buf) { buf[n] = 0; *out = buf; }
    return 0;
bad:
    free(buf);
    return -1;
}

static int literal(struct parser *ps, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n)) return -1;
    ps->p += n;
    return 0;
}

/* JSON's number grammar (Python's NaN and Infinity are left to the Python wrapper: -1). */
static int number(struct parser *ps, double *out) {
    const char *s = ps->p;
    if (ps->p < ps->end && *ps->p == '-') ps->p++;
    if (ps->p >= ps->end) return -1;
    if (*ps->p == '0') ps->p++;
    else if (*ps->p >= '1' && *ps->p <= '9') while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') ps->p++;
    else return -1;
    if (ps->p < ps->end && *ps->p == '.') {
        ps->p++;
        if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9') return -1;
        while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') ps->p++;
    }
    if (ps->p < ps->end && (*ps->p == 'e' || *ps->p == 'E')) {
        ps->p++;
        if (ps->p < ps->end && (*ps->p == '+' || *ps->p == '-')) ps->p++;
        if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9') return -1;
        while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') ps->p++;
    }
    char tmp[64];
    size_t n = (size_t)(ps->p - s);
    if (n >= sizeof tmp) { *out = 1.0; return 0; }  /* a long number: only its sign could matter, kept positive */
    memcpy(tmp, s, n);
    tmp[n] = 0;
    *out = strtod(tmp, NULL);
    return 0;
}

/* Any JSON value, its kind returned (-1 on a syntax error); nesting bounded like a recursion limit. */
static int value(struct parser *ps, int depth, double *num, char **str) {
    if (depth > 64) return -1;
    ws(ps);
    if (ps->p >= ps->end) return -1;
    switch (*ps->p) {
    case '"': return string(ps, str) ? -1 : K_STRING;
    case 't': return literal(ps, "true") ? -1 : K_TRUE;
    case 'f': return literal(ps, "false") ? -1 : K_FALSE;
    case 'n': return literal(ps, "null") ? -1 : K_NULL;
    case '[':
        ps->p++;
        ws(ps);
        if (ps->p < ps->end && *ps->p == ']') { ps->p++; return K_OTHER; }
        for (;;) {
            if (value(ps, depth + 1, NULL, NULL) < 0) return -1;
            ws(ps);
            if (ps->p < ps->end && *ps->p == ',') { ps->p++; continue; }
            if (ps->p < ps->end && *ps->p == ']') { ps->p++; return K_OTHER; }
            return -1;
        }
    case '{':
        ps->p++;
        ws(ps);
        if (ps->p < ps->end && *ps->p == '}') { ps->p++; return K_OTHER; }
        for (;;) {
            ws(ps);
            if (string(ps, NULL)) return -1;
            ws(ps);
            if (ps->p >= ps->end || *ps->p != ':') return -1;
            ps->p++;
            if (value(ps, depth + 1, NULL, NULL) < 0) return -1;
            ws(ps);
            if (ps->p < ps->end && *ps->p == ',') { ps->p++; continue; }
            if (ps->p < ps->end && *ps->p == '}') { ps->p++; return K_OTHER; }
            return -1;
        }
    default: {
        double d;
        if (number(ps, &d)) return -1;
        if (num) *num = d;
        return K_NUMBER;
    }
    }
}

static void set_env_entry(struct answer *a, char *key, char *val) {
    if (!*key || strchr(key, '=')) { a->env_bad = 1; free(key); free(val); return; }
    for (int i = 0; i < a->n_env; i++)  /* a key twice: the last one, as Python's dict keeps */
        if (!strcmp(a->env_key[i], key)) { free(a->env_value[i]); a->env_value[i] = val; free(key); return; }
    if (a->n_env == MAX_ENV) { a->env_bad = 1; free(key); free(val); return; }
    a->env_key[a->n_env] = key;
    a->env_value[a->n_env++] = val;
}

/* "env": an object of strings, else env_bad (os.environ.update would raise in the Python wrapper). */
static int env_object(struct parser *ps, struct answer *a) {
    for (int i = 0; i < a->n_env; i++) { free(a->env_key[i]); free(a->env_value[i]); }
    a->n_env = 0;
    a->env_seen = 1;
    a->env_bad = 0;
    ws(ps);
    if (ps->p >= ps->end || *ps->p != '{') { a->env_bad = 1; return value(ps, 0, NULL, NULL) < 0 ? -1 : 0; }
    ps->p++;
    ws(ps);
    if (ps->p < ps->end && *ps->p == '}') { ps->p++; return 0; }
    for (;;) {
        char *key = NULL, *val = NULL;
        ws(ps);
        if (string(ps, &key)) return -1;
        ws(ps);
        if (ps->p >= ps->end || *ps->p != ':') { free(key); return -1; }
        ps->p++;
        int k = value(ps, 1, NULL, &val);
        if (k < 0) { free(key); return -1; }
        if (k == K_STRING) set_env_entry(a, key, val);
        else { a->env_bad = 1; free(key); }
        ws(ps);
        if (ps->p < ps->end && *ps->p == ',') { ps->p++; continue; }
        if (ps->p < ps->end && *ps->p == '}') { ps->p++; return 0; }
        return -1;
    }
}

/* 0: the answer is one JSON object (Python's loads after stripping " \t\n\r"), its fields in *a. */
static int parse_answer(const char *buf, size_t len, struct answer *a) {
    struct parser ps = {buf, buf + len};
    memset(a, 0, sizeof *a);
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)buf[i] >= 0x80) return -1;  /* larkd writes ASCII (ensure_ascii): anything else is odd */
    ws(&ps);
    if (ps.p >= ps.end || *ps.p != '{') return -1;
    ps.p++;
    ws(&ps);
    if (ps.p < ps.end && *ps.p == '}') ps.p++;
    else for (;;) {
        char *key = NULL;
        ws(&ps);
        if (string(&ps, &key)) return -1;
        ws(&ps);
        if (ps.p >= ps.end || *ps.p != ':') { free(key); return -1; }
        ps.p++;
        int r = 0;
        if (!strcmp(key, "env")) r = env_object(&ps, a);
        else if (!strcmp(key, "error")) {
            free(a->error_text);
            a->error_text = NULL;
            int k = value(&ps, 1, NULL, &a->error_text);
            r = k < 0 ? -1 : 0;
            a->error = k < 0 ? K_NONE : (enum kind)k;
        } else {
            double d = 0;
            int k = value(&ps, 1, &d, NULL);
            if (k < 0) r = -1;
            else if (!strcmp(key, "ok")) a->ok = (enum kind)k;
            else if (!strcmp(key, "busy")) a->busy = (enum kind)k;
            else if (!strcmp(key, "held")) a->held = (enum kind)k;
            else if (!strcmp(key, "exit_barrier")) { a->barrier = (enum kind)k; a->barrier_value = d; }
        }
        free(key);
        if (r) return -1;
        ws(&ps);
        if (ps.p < ps.end && *ps.p == ',') { ps.p++; continue; }
        if (ps.p < ps.end && *ps.p == '}') { ps.p++; break; }
        return -1;
    }
    ws(&ps);
    return ps.p == ps.end ? 0 : -1;
}

/* -- the socket ------------------------------------------------------------------------------------------------ */
/* client.socket_path(): NULL when a lark.toml could name another socket (the Python wrapper reads it). */
static const char *socket_path(void) {
    const char *s = getenv("LARK_SOCKET");
    if (s && *s) return s;
    const char *cfg = getenv("LARK_CONFIG");
    if (!cfg || !*cfg) cfg = CONFIG_FILE;
    struct stat st;
    return stat(cfg, &st) == 0 ? NULL : DEFAULT_SOCKET;
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

enum outcome { GOT_ANSWER, NOT_REACHED, TIMED_OUT };

/* client.call("setup") up to reading the answer. NOT_REACHED: what the Python wrapper retries (it asks again). */
static enum outcome ask_setup(const char *path, double timeout, char **buf, size_t *len) {
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof sa.sun_path) return NOT_REACHED;
    strcpy(sa.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return NOT_REACHED;
    struct timeval tv = {.tv_sec = (time_t)timeout, .tv_usec = (suseconds_t)((timeout - (double)(time_t)timeout) * 1e6)};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) { close(fd); return NOT_REACHED; }
    size_t off = 0;
    while (off < sizeof SETUP_REQUEST - 1) {
        ssize_t w = send(fd, SETUP_REQUEST + off, sizeof SETUP_REQUEST - 1 - off, MSG_NOSIGNAL);
        if (w > 0) { off += (size_t)w; continue; }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EPIPE || errno == ECONNRESET)) break;  /* larkd may have answered (busy) and closed */
        close(fd);
        return w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) ? TIMED_OUT : NOT_REACHED;
    }
    size_t cap = 4096, n = 0;
    char *b = malloc(cap);
    if (!b) { close(fd); return NOT_REACHED; }
    while (n == 0 || b[n - 1] != '\n') {
        if (n == cap) {
            if (cap >= MAX_ANSWER) { free(b); close(fd); return NOT_REACHED; }
            char *nb = realloc(b, cap * 2);
            if (!nb) { free(b); close(fd); return NOT_REACHED; }
            b = nb;
            cap *= 2;
        }
        ssize_t r = recv(fd, b + n, cap - n, 0);
        if (r > 0) { n += (size_t)r; continue; }
        if (r == 0) break;
        if (errno == EINTR) continue;
        free(b);
        close(fd);
        return errno == EAGAIN || errno == EWOULDBLOCK ? TIMED_OUT : NOT_REACHED;
    }
    close(fd);
    if (n == 0) { free(b); return NOT_REACHED; }  /* closed without answering: the Python wrapper asks again */
    *buf = b;
    *len = n;
    return GOT_ANSWER;
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

/* What the Python wrapper's interpreter leaves in the job's environment (PEP 538, Python/pylifecycle.c): with no
 * LC_ALL and an LC_CTYPE that resolves to the C locale, it sets LC_CTYPE to the first of C.UTF-8, C.utf8, UTF-8
 * the system has, unless PYTHONCOERCECLOCALE=0 (read: pip's console script runs Python without -I or -E). The job
 * sees the same environment from either path. */
static void coerce_c_locale_like_python(void) {
    const char *knob = getenv("PYTHONCOERCECLOCALE");
    if (knob && !strcmp(knob, "0")) return;
    const char *lc_all = getenv("LC_ALL");
    if (lc_all && *lc_all) return;
    const char *loc = setlocale(LC_CTYPE, "");
    if (!loc || strcmp(loc, "C")) return;
    static const char *const targets[] = {"C.UTF-8", "C.utf8", "UTF-8"};
    for (size_t i = 0; i < sizeof targets / sizeof *targets; i++)
        if (setlocale(LC_CTYPE, targets[i])) { setenv("LC_CTYPE", targets[i], 1); return; }
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
    enum outcome got = ask_setup(path, timeout, &buf, &len);
    if (got == NOT_REACHED) return fallback();
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
    /* exit_barrier: Python takes a number (a bool is one) > 0 as a barrier, anything else as none. */
    if (a.barrier == K_TRUE || (a.barrier == K_NUMBER && a.barrier_value > 0)) return fallback();
    if (a.env_bad) return fallback();
    for (int i = 0; i < a.n_env; i++)
        if (setenv(a.env_key[i], a.env_value[i], 1) != 0) return fallback();
    coerce_c_locale_like_python();
    signal(SIGPIPE, SIG_DFL);  /* wrapper.RESTORED_IN_JOB */
    signal(SIGXFSZ, SIG_DFL);
    int err = exec_like_python(job_argv);
    char reason[4352];
    snprintf(reason, sizeof reason, "cannot execute %.4000s: %s", job_argv[0], strerror(err));
    return fail(reason);
}
