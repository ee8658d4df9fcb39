/* lark-starter, compiled: lark/job/starter_wrapper.py's common path without an interpreter start and without a
 * `condor_config_val LARK_REAL_STARTER` per starter start (issue 27; measured in the testbed root: 23.04 ms of
 * Python and imports and 8.12 ms of condor_config_val per starter). `lark install-hook` builds it into
 * $(LARK_LIBEXEC)/lark-starter (lark/hook_launcher.py); condor_config.d/50-lark.conf chooses it or the Python one
 * for STARTER (LARK_STARTER); measured by bench/starter_compiled.py (docs/performance.md, "A compiled starter").
 *
 * What it does itself, as the Python lark-starter does:
 *   the real starter is $LARK_REAL_STARTER when set and not empty, else LARK_REAL_STARTER_PATH, the value
 *   `lark install-hook` read from `condor_config_val LARK_REAL_STARTER` when it built this program (so changing
 *   LARK_REAL_STARTER needs `lark install-hook` again);
 *   unless LARK_SANDBOX_LIMIT in the environment, stripped and lower-cased, is one of 0 false no off, and when the
 *   arguments name a slot (`-a <slot>`, not last), it asks larkd `sandbox_limit` with protocol.request()'s bytes
 *   ({"lark":1,"op":"sandbox_limit","slot":...,"argv":[...]}\n) and a 5 s timeout (SANDBOX_ASK_TIMEOUT);
 *   fail open: when larkd is away, busy, refuses or is silent, the Python one's stderr line, byte for byte
 *   ("lark-starter: slot S: sandbox transfer not limited to the slot's Bandwidth, the starter starts anyway:
 *   <str() of client.call's LarkError>");
 *   then it leaves the environment and signal dispositions as the Python one's exec does (_CONDOR_NO_JOB_NETWORKING
 *   =true; LC_CTYPE coerced as Python's interpreter coerces a C locale; SIGPIPE and SIGXFSZ ignored, as Python
 *   starts) and execs the real starter with the same arguments.
 * Everything else execs the Python lark-starter (LARK_PY_STARTER, fixed at build time) with the same arguments and
 * LARK_REAL_STARTER set to the starter this program would run, so both run the same one: `-classad` (the startd
 * asking capabilities: the Python one adds LarkVersion and LarkNetworkTypes), no arguments, an argument that is not
 * plain ASCII (the request's JSON escapes would have to follow Python's surrogateescape), a socket a lark.toml
 * could move, and after the question (larkd moves the same pid again at a second one: the answer is the same) an
 * answer that is not plain ASCII JSON, or whose "error" is not an ASCII string, or one too large to hold.
 *
 * The larkd client (socket_path, ask, describe_outcome, parse_answer, truthy, coerce_c_locale_like_python) is
 * larkd_client.h, which the compiled job wrapper uses too.
 *
 * Build: gcc -O2 -Wall -Wextra -Werror -DLARK_PY_STARTER='"/opt/lark/bin/lark-starter"'
 *            -DLARK_REAL_STARTER_PATH='"/usr/sbin/condor_starter"' -o OUT starter.c
 */
#ifndef LARK_PY_STARTER
#error "build with -DLARK_PY_STARTER='\"/opt/lark/bin/lark-starter\"' (the Python lark-starter every other case runs)"
#endif
#ifndef LARK_REAL_STARTER_PATH
#error "build with -DLARK_REAL_STARTER_PATH='\"/usr/sbin/condor_starter\"' (condor_config_val LARK_REAL_STARTER)"
#endif

#include "larkd_client.h"  /* larkd's client, shared with job_wrapper.c */
#include <signal.h>

#define ASK_TIMEOUT_S 5.0  /* starter_wrapper.SANDBOX_ASK_TIMEOUT */

static char **starter_args;  /* the starter's arguments (argv[1..]), NULL-terminated */

/* The starter this program runs: $LARK_REAL_STARTER, else the one compiled in. */
static const char *real_starter(void) {
    const char *s = getenv("LARK_REAL_STARTER");
    return s && *s ? s : LARK_REAL_STARTER_PATH;
}

/* The cases left to the Python lark-starter: it, with the same arguments (argv[0] is replaced), running the same
 * real starter. */
static int python_starter(char **argv) {
    setenv("LARK_REAL_STARTER", real_starter(), 1);
    argv[0] = (char *)LARK_PY_STARTER;
    execv(LARK_PY_STARTER, argv);
    fprintf(stderr, "lark-starter: cannot run the Python lark-starter " LARK_PY_STARTER ": %s (reinstall Lark on "
            "this execution point and run `lark install-hook` again)\n", strerror(errno));
    return 1;
}

/* LARK_SANDBOX_LIMIT, as `.strip().lower() in ("0", "false", "no", "off")` reads it; -1: not plain ASCII. */
static int sandbox_limit_off(void) {
    const char *s = getenv("LARK_SANDBOX_LIMIT");
    if (!s) return 0;
    size_t n = strlen(s);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] >= 0x80) return -1;
    /* str.isspace() among ASCII: \t \n \v \f \r, \x1c-\x1f, space */
#define PY_SPACE(c) ((c) == ' ' || ((c) >= '\t' && (c) <= '\r') || ((c) >= 0x1c && (c) <= 0x1f))
    while (n && PY_SPACE(s[n - 1])) n--;
    while (n && PY_SPACE(*s)) { s++; n--; }
    char word[8] = {0};
    if (n >= sizeof word) return 0;
    for (size_t i = 0; i < n; i++) word[i] = (char)(s[i] >= 'A' && s[i] <= 'Z' ? s[i] + 32 : s[i]);
    static const char *const off[] = {"0", "false", "no", "off"};
    for (size_t i = 0; i < sizeof off / sizeof *off; i++)
        if (!strcmp(word, off[i])) return 1;
    return 0;
}

/* starter_wrapper.slot_of(): the word after the first `-a` that is not the last argument. */
static const char *slot_of(void) {
    for (int i = 0; starter_args[i] && starter_args[i + 1]; i++)
        if (!strcmp(starter_args[i], "-a")) return starter_args[i + 1];
    return NULL;
}

/* One ASCII string as protocol.dumps writes it (json's encode_basestring_ascii). */
static char *json_string(char *out, const char *s) {
    static const char hex[] = "0123456789abcdef";
    *out++ = '"';
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        const char *esc = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\n' ? "\\n" : c == '\r' ? "\\r" :
                          c == '\t' ? "\\t" : c == '\b' ? "\\b" : c == '\f' ? "\\f" : NULL;
        if (esc) { memcpy(out, esc, 2); out += 2; }
        else if (c >= ' ' && c <= '~') *out++ = (char)c;
        else { memcpy(out, "\\u00", 4); out[4] = hex[c >> 4]; out[5] = hex[c & 15]; out += 6; }
    }
    *out++ = '"';
    return out;
}

/* protocol.request("sandbox_limit", slot=slot, argv=argv), NUL-terminated. */
static char *sandbox_request(const char *slot) {
    size_t need = 64 + 6 * strlen(slot);
    for (int i = 0; starter_args[i]; i++) need += 3 + 6 * strlen(starter_args[i]);
    char *req = malloc(need), *p = req;
    if (!req) return NULL;
    p += sprintf(p, "{\"lark\":1,\"op\":\"sandbox_limit\",\"slot\":");
    p = json_string(p, slot);
    p += sprintf(p, ",\"argv\":[");
    for (int i = 0; starter_args[i]; i++) {
        if (i) *p++ = ',';
        p = json_string(p, starter_args[i]);
    }
    strcpy(p, "]}\n");
    return req;
}

static int plain_ascii(const char *s) {
    for (; *s; s++)
        if ((unsigned char)*s >= 0x80) return 0;
    return 1;
}

/* starter_wrapper.ask_sandbox_limit(): 0 done (asked, or said why not on stderr), -1 left to the Python one. */
static int ask_sandbox_limit(void) {
    int off = sandbox_limit_off();
    if (off) return off < 0 ? -1 : 0;
    const char *slot = slot_of();
    if (!slot) return 0;  /* not a job's starter (e.g. -version): nothing moves a sandbox */
    const char *path = socket_path();
    struct sockaddr_un sa;
    if (!path || strlen(path) >= sizeof sa.sun_path) return -1;  /* a lark.toml could move it; or too long */
    char *req = sandbox_request(slot);
    if (!req) return -1;
    char *buf = NULL, why[8192];
    size_t len = 0;
    int err = 0;
    enum outcome got = ask(path, req, ASK_TIMEOUT_S, &buf, &len, &err);
    free(req);
    if (got == LOST && (err == EMSGSIZE || err == ENOMEM)) return -1;  /* an answer past 1 MiB: Python reads on */
    if (got != GOT_ANSWER) describe_outcome(why, sizeof why, path, got, err, ASK_TIMEOUT_S);
    else {
        struct answer a;
        int bad = parse_answer(buf, len, &a);
        free(buf);
        if (bad) return -1;
        if (truthy(a.ok, a.ok_value, a.ok_text)) return 0;
        if (a.error != K_NONE && (a.error != K_STRING || !plain_ascii(a.error_text))) return -1;
        int busy = truthy(a.busy, a.busy_value, a.busy_text);
        const char *text = a.error == K_STRING ? a.error_text : busy ? "busy" : "unknown error";
        snprintf(why, sizeof why, "larkd: %s%s", text, busy ? " (retry in a moment)" : "");
    }
    fprintf(stderr, "lark-starter: slot %s: sandbox transfer not limited to the slot's Bandwidth, the starter starts "
            "anyway: %s\n", slot, why);
    return 0;
}

int main(int argc, char **argv) {
    static char *no_args[] = {(char *)"lark-starter", NULL};
    if (argc < 1) argv = no_args;
    if (argc < 2) return python_starter(argv);  /* no arguments: the Python one does what it does */
    starter_args = argv + 1;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-classad") || !plain_ascii(argv[i])) return python_starter(argv);
    if (ask_sandbox_limit() < 0) return python_starter(argv);
    const char *real = real_starter();
    setenv("_CONDOR_NO_JOB_NETWORKING", "true", 1);
    coerce_c_locale_like_python();
    signal(SIGPIPE, SIG_IGN);  /* what the Python one's interpreter leaves its exec (ignored stays ignored) */
    signal(SIGXFSZ, SIG_IGN);
    argv[0] = (char *)real;
    execv(real, argv);
    fprintf(stderr, "lark-starter: cannot run the real condor_starter %s: %s (set LARK_REAL_STARTER in the HTCondor "
            "configuration to its path and run `lark install-hook` again)\n", real, strerror(errno));
    return 1;
}
