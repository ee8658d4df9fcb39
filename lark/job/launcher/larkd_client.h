/* larkd's client for the compiled launchers (job_wrapper.c, starter.c, prepare_job.c): lark/job/client.py's call()
 * up to the answer, and call_patiently()'s retries, in C, so that each launcher holds no copy of them. Header-only
 * (static inline functions): each launcher stays one file for the compiler (`lark install-hook` builds `gcc ...
 * job_wrapper.c`; #include "..." finds this file next to it), and a launcher that does not use a function gets no
 * code for it.
 *
 * What is here: the answer's parser (one JSON object; only the fields a launcher reads are kept, the rest is
 * checked and skipped; anything that is not plain ASCII JSON is refused, and the launcher then hands the case to
 * its Python twin), client.socket_path(), one request and its answer line with client.call()'s cases told apart
 * (enum outcome) and their texts as str() of the LarkError client.py raises (describe_outcome; outcome_parts for
 * its parts), call_patiently()'s retry loop (job_wrapper.c's exit barrier, prepare_job.c's check), Python's truth
 * value of a field, the C-locale coercion Python's interpreter does (so the environment a launcher leaves is the
 * one its Python twin would leave), and a monotonic clock for call_patiently's retries.
 */
#ifndef LARKD_CLIENT_H
#define LARKD_CLIENT_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <locale.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_SOCKET "/run/lark/lark.sock"
#define CONFIG_FILE "/etc/lark/lark.toml"
#define MAX_ANSWER (1 << 20)
#define MAX_ENV 64
#define START_LARKD "start larkd: condor_on -daemon LARKD, or systemctl start larkd"

/* -- the answer: one JSON object; only what a launcher reads is kept, the rest is checked and skipped -------- */
enum kind { K_NONE, K_TRUE, K_FALSE, K_NULL, K_NUMBER, K_STRING, K_EMPTY, K_OTHER };  /* K_EMPTY: [] {} */
struct answer {
    enum kind ok, busy, held, barrier, error, pushed, reason;
    double barrier_value, ok_value, busy_value, pushed_value;
    char *error_text, *reason_text, *ok_text, *busy_text, *pushed_text;
    int env_seen, env_bad, n_env;
    char *env_key[MAX_ENV], *env_value[MAX_ENV];
};

struct parser { const char *p, *end; };

static inline void ws(struct parser *ps) {
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r')) ps->p++;
}

static inline int hex4(const char *s, unsigned *out) {
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
static inline int string(struct parser *ps, char **out) {
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

static inline int literal(struct parser *ps, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n)) return -1;
    ps->p += n;
    return 0;
}

/* JSON's number grammar (Python's NaN and Infinity are left to the Python twin: -1). */
static inline int number(struct parser *ps, double *out) {
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
static inline int value(struct parser *ps, int depth, double *num, char **str) {
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

static inline void set_env_entry(struct answer *a, char *key, char *val) {
    if (!*key || strchr(key, '=')) { a->env_bad = 1; free(key); free(val); return; }
    for (int i = 0; i < a->n_env; i++)  /* a key twice: the last one, as Python's dict keeps */
        if (!strcmp(a->env_key[i], key)) { free(a->env_value[i]); a->env_value[i] = val; free(key); return; }
    if (a->n_env == MAX_ENV) { a->env_bad = 1; free(key); free(val); return; }
    a->env_key[a->n_env] = key;
    a->env_value[a->n_env++] = val;
}

/* "env": an object of strings, else env_bad (os.environ.update would raise in the Python wrapper). */
static inline int env_object(struct parser *ps, struct answer *a) {
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
static inline int parse_answer(const char *buf, size_t len, struct answer *a) {
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
/* client.socket_path(): NULL when a lark.toml could name another socket (the Python twin reads it). */
static inline const char *socket_path(void) {
    const char *s = getenv("LARK_SOCKET");
    if (s && *s) return s;
    const char *cfg = getenv("LARK_CONFIG");
    if (!cfg || !*cfg) cfg = CONFIG_FILE;
    struct stat st;
    return stat(cfg, &st) == 0 ? NULL : DEFAULT_SOCKET;
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
static inline enum outcome ask(const char *path, const char *request, double timeout, char **buf, size_t *len, int *err) {
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
static inline int truthy(enum kind k, double num, const char *text) {
    switch (k) {
    case K_TRUE: case K_OTHER: return 1;
    case K_NUMBER: return num != 0;
    case K_STRING: return text && *text;
    default: return 0;
    }
}

/* What the Python twin's interpreter leaves in the job's environment (PEP 538, Python/pylifecycle.c): with no
 * LC_ALL and an LC_CTYPE that resolves to the C locale, it sets LC_CTYPE to the first of C.UTF-8, C.utf8, UTF-8
 * the system has, unless PYTHONCOERCECLOCALE=0 (read: pip's console script runs Python without -I or -E). The job
 * sees the same environment from either path. */
static inline void coerce_c_locale_like_python(void) {
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

static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static inline void sleep_s(double s) {
    if (s <= 0) return;
    struct timespec left = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&left, &left) != 0 && errno == EINTR) {}
}

/* The LarkError client.call() raises for an outcome other than GOT_ANSWER, in parts: its `what` into what, its
 * `fix` (NULL: none) in *fix, its obj being the socket's path; returns 1 when client.call_patiently retries it
 * (DaemonUnreachable, DaemonBusy), 0 when it fails at once. `timeout` is the one the request was asked with. */
static inline int outcome_parts(enum outcome got, int err, double timeout, char *what, size_t cap, const char **fix) {
    *fix = NULL;
    switch (got) {
    case NO_SOCKET:
        snprintf(what, cap, "larkd is not running (no socket)");
        *fix = START_LARKD;
        return 1;
    case REFUSED:
        snprintf(what, cap, "larkd is not running (connection refused)");
        *fix = START_LARKD;
        return 1;
    case DENIED:
        snprintf(what, cap, "permission denied on the larkd socket");
        return 0;
    case QUEUE_FULL:
        snprintf(what, cap, "larkd's connection queue stayed full");
        *fix = "retry in a moment";
        return 1;
    case TIMED_OUT:
        snprintf(what, cap, "larkd did not answer within %g s", timeout);
        *fix = "check larkd's log";
        return 0;
    case CLOSED:
        snprintf(what, cap, "larkd closed the connection without answering");
        *fix = "check larkd's log";
        return 1;
    case LOST:
        snprintf(what, cap, "connection to larkd lost (%s)", strerror(err));
        *fix = "larkd may have died; check its log and restart it";
        return 1;
    case GOT_ANSWER:
        break;
    }
    snprintf(what, cap, "larkd answered");
    return 0;
}

/* str() of the LarkError client.call() raises for an outcome other than GOT_ANSWER (LarkError.render(): "obj:
 * what (fix)"), into msg; returns 1 when client.call_patiently retries it, 0 when it fails at once. */
static inline int describe_outcome(char *msg, size_t cap, const char *path, enum outcome got, int err, double timeout) {
    char what[512];
    const char *fix;
    int retried = outcome_parts(got, err, timeout, what, sizeof what, &fix);
    if (fix) snprintf(msg, cap, "%s: %s (%s)", path, what, fix);
    else snprintf(msg, cap, "%s: %s", path, what);
    return retried;
}

/* What one try of a request came to, for call_patiently(). */
enum try_result {
    TRY_DONE = 0,     /* answered, and the caller is done */
    TRY_FAILED = 1,   /* failed in a way client.call_patiently does not retry (a LarkError other than the two) */
    TRY_AGAIN = 2,    /* failed in a way it retries: DaemonUnreachable, DaemonBusy */
};

/* client.call_patiently()'s loop: `attempt` again while it returns TRY_AGAIN (larkd away or busy), pausing 0.2 s
 * doubling to 2 s, each with jitter (random.uniform(0.5, 1.5)), while the next try would start within `wait` s;
 * returns the last try's result (a launcher may return results of its own above TRY_AGAIN: they end the loop). */
static inline int call_patiently(int (*attempt)(void *ctx), void *ctx, double wait) {
    double deadline = now_s() + wait, delay = 0.2;
    srand48((long)getpid() ^ (long)now_s());
    for (;;) {
        int r = attempt(ctx);
        if (r != TRY_AGAIN) return r;
        double pause = delay * (0.5 + drand48());
        if (now_s() + pause > deadline) return r;
        sleep_s(pause);
        delay = delay * 2 < 2.0 ? delay * 2 : 2.0;
    }
}

#endif
