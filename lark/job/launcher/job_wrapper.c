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
#include <errno.h>
#include <fcntl.h>
#include <locale.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
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
enum kind { K_NONE, K_TRUE, K_FALSE, K_NULL, K_NUMBER, K_STRING, K_EMPTY, K_OTHER };  /* K_EMPTY: [] {} */
struct answer {
    enum kind ok, busy, held, barrier, error, pushed, reason;
    double barrier_value, ok_value, busy_value, pushed_value;
    char *error_text, *reason_text, *ok_text, *busy_text, *pushed_text;
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
    size_t n = (size_t)(ps->p - s);
    char *tmp = malloc(n + 1);
    if (!tmp) return -1;
    memcpy(tmp, s, n);
    tmp[n] = 0;
    *out = strtod(tmp, NULL);  /* float(): a number past the double range is inf, as the exit barrier's wait */
    free(tmp);
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
        if (ps->p < ps->end && *ps->p == ']') { ps->p++; return K_EMPTY; }
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
        if (ps->p < ps->end && *ps->p == '}') { ps->p++; return K_EMPTY; }
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

#define SWAP_TEXT(field, text) do { free(field); (field) = (text); (text) = NULL; } while (0)

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
        } else if (!strcmp(key, "reason")) {
            free(a->reason_text);
            a->reason_text = NULL;
            int k = value(&ps, 1, NULL, &a->reason_text);
            r = k < 0 ? -1 : 0;
            a->reason = k < 0 ? K_NONE : (enum kind)k;
        } else {
            double d = 0;
            char *text = NULL;
            int k = value(&ps, 1, &d, &text);
            if (k < 0) r = -1;
            else if (!strcmp(key, "ok")) { a->ok = (enum kind)k; a->ok_value = d; SWAP_TEXT(a->ok_text, text); }
            else if (!strcmp(key, "busy")) { a->busy = (enum kind)k; a->busy_value = d; SWAP_TEXT(a->busy_text, text); }
            else if (!strcmp(key, "held")) a->held = (enum kind)k;
            else if (!strcmp(key, "exit_barrier")) { a->barrier = (enum kind)k; a->barrier_value = d; }
            else if (!strcmp(key, "pushed")) {
                a->pushed = (enum kind)k;
                a->pushed_value = d;
                SWAP_TEXT(a->pushed_text, text);
            }
            free(text);
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

/* How one request to larkd went, as lark/job/client.call() tells its cases apart. */
enum outcome {
    GOT_ANSWER,
    NO_SOCKET,    /* connect: ENOENT (DaemonUnreachable) */
    REFUSED,      /* connect: ECONNREFUSED (DaemonUnreachable) */
    DENIED,       /* connect: EACCES/EPERM (LarkError) */
    QUEUE_FULL,   /* connect: EAGAIN, the listen backlog full past the timeout (DaemonBusy) */
    LOST,         /* any other error of connect, send or recv (DaemonUnreachable, with its errno) */
    TIMED_OUT,    /* send or recv past the timeout (LarkError) */
    CLOSED,       /* closed without a byte of answer (DaemonUnreachable) */
};

/* client.call(op) up to reading the answer line: request is protocol.request()'s bytes. */
static enum outcome ask(const char *path, const char *request, double timeout, char **buf, size_t *len, int *err) {
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    *err = 0;
    if (strlen(path) >= sizeof sa.sun_path) { *err = ENAMETOOLONG; return LOST; }
    strcpy(sa.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) { *err = errno; return LOST; }
    struct timeval tv = {.tv_sec = (time_t)timeout, .tv_usec = (suseconds_t)((timeout - (double)(time_t)timeout) * 1e6)};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    while (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        if (errno == EINTR) continue;
        *err = errno;
        close(fd);
        switch (*err) {
        case ENOENT: return NO_SOCKET;
        case ECONNREFUSED: return REFUSED;
        case EACCES: case EPERM: return DENIED;
        case EAGAIN: return QUEUE_FULL;
        default: return LOST;
        }
    }
    size_t off = 0, want = strlen(request);
    while (off < want) {
        ssize_t w = send(fd, request + off, want - off, MSG_NOSIGNAL);
        if (w > 0) { off += (size_t)w; continue; }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EPIPE || errno == ECONNRESET)) break;  /* larkd may have answered (busy) and closed */
        *err = errno;
        close(fd);
        return w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) ? TIMED_OUT : LOST;
    }
    size_t cap = 4096, n = 0;
    char *b = malloc(cap);
    if (!b) { close(fd); *err = ENOMEM; return LOST; }
    while (n == 0 || b[n - 1] != '\n') {
        if (n == cap) {
            if (cap >= MAX_ANSWER) { free(b); close(fd); *err = EMSGSIZE; return LOST; }
            char *nb = realloc(b, cap * 2);
            if (!nb) { free(b); close(fd); *err = ENOMEM; return LOST; }
            b = nb;
            cap *= 2;
        }
        ssize_t r = recv(fd, b + n, cap - n, 0);
        if (r > 0) { n += (size_t)r; continue; }
        if (r == 0) break;
        if (errno == EINTR) continue;
        *err = errno;
        free(b);
        close(fd);
        return *err == EAGAIN || *err == EWOULDBLOCK ? TIMED_OUT : LOST;
    }
    close(fd);
    if (n == 0) { free(b); return CLOSED; }
    *buf = b;
    *len = n;
    return GOT_ANSWER;
}

/* Python's truth value of an answer's field. */
static int truthy(enum kind k, double num, const char *text) {
    switch (k) {
    case K_TRUE: case K_OTHER: return 1;
    case K_NUMBER: return num != 0;
    case K_STRING: return text && *text;
    default: return 0;
    }
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

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sleep_s(double s) {
    if (s <= 0) return;
    struct timespec left = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&left, &left) != 0 && errno == EINTR) {}
}

#define PUSH_REQUEST "{\"lark\":1,\"op\":\"push\",\"barrier\":true}\n"  /* protocol.request("push", barrier=True) */
#define PUSH_TIMEOUT_S 30.0
#define START_LARKD "start larkd: condor_on -daemon LARKD, or systemctl start larkd"

/* One client.call("push", barrier=True): 0 answered (a note, if any, in note), 1 failed for good, 2 failed in
 * a way call_patiently retries (DaemonUnreachable, DaemonBusy); msg is str() of the LarkError it raises. */
static int push_once(const char *path, char *msg, size_t cap, char *note, size_t note_cap) {
    char *buf = NULL;
    size_t len = 0;
    int err = 0;
    switch (ask(path, PUSH_REQUEST, PUSH_TIMEOUT_S, &buf, &len, &err)) {
    case GOT_ANSWER: break;
    case NO_SOCKET:
        snprintf(msg, cap, "%s: larkd is not running (no socket) (" START_LARKD ")", path);
        return 2;
    case REFUSED:
        snprintf(msg, cap, "%s: larkd is not running (connection refused) (" START_LARKD ")", path);
        return 2;
    case DENIED:
        snprintf(msg, cap, "%s: permission denied on the larkd socket", path);
        return 1;
    case QUEUE_FULL:
        snprintf(msg, cap, "%s: larkd's connection queue stayed full (retry in a moment)", path);
        return 2;
    case TIMED_OUT:
        snprintf(msg, cap, "%s: larkd did not answer within %g s (check larkd's log)", path, PUSH_TIMEOUT_S);
        return 1;
    case CLOSED:
        snprintf(msg, cap, "%s: larkd closed the connection without answering (check larkd's log)", path);
        return 2;
    case LOST:
        snprintf(msg, cap, "%s: connection to larkd lost (%s) (larkd may have died; check its log and restart it)",
                 path, strerror(err));
        return 2;
    }
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

/* wrapper.barrier(): call_patiently("push", wait=wait, timeout=30, barrier=True); never fails the job. */
static void barrier(const char *path, double wait) {
    static char msg[8192], note[8192];
    double deadline = now_s() + wait, delay = 0.2;
    srand48((long)getpid() ^ (long)now_s());
    for (;;) {
        int r = push_once(path, msg, sizeof msg, note, sizeof note);
        if (r == 0) {
            if (*note) fprintf(stderr, "Lark: final network figures not pushed: %s\n", note);
            return;
        }
        double pause = delay * (0.5 + drand48());  /* random.uniform(0.5, 1.5) */
        if (r == 1 || now_s() + pause > deadline) break;
        sleep_s(pause);
        delay = delay * 2 < 2.0 ? delay * 2 : 2.0;
    }
    fprintf(stderr, "Lark: the job's final network figures were not written into its ad (%s); its history keeps the "
            "last periodic figures and larkd's record keeps the exact ones\n", msg);
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
