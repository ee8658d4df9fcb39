/* lark-prepare-job, the PREPARE_JOB hook's launcher: starts the Python hook so that it is never traceable.
 *
 * The hook runs as the job's user in the execution point's own network namespace. A process of that user may
 * ptrace it (where yama is absent or ptrace_scope is 0) unless it is not dumpable, and the Python hook can make
 * itself non-dumpable only after its interpreter has started and imported, tens of ms in which a same-uid job
 * that watches for the hook's pid can attach first.
 *
 * Installed setgid to a group with no privileges at all (`lark install-hook`, group lark-hook, mode 2755).
 * From the exec of this file on, the process's effective gid differs from its real gid, so:
 *  - at each exec (this one, and the hook's below), begin_new_exec() (fs/exec.c) sets the process dumpable only
 *    when euid == uid and egid == gid; otherwise it takes fs.suid_dumpable (0 or 2), and __ptrace_may_access()
 *    (kernel/ptrace.c) refuses a tracer without CAP_SYS_PTRACE unless the target is SUID_DUMP_USER;
 *  - the same function's credential check refuses a tracer whose gid differs from the target's egid/sgid/gid
 *    (this one alone holds where fs.suid_dumpable = 1).
 * Within each exec the credentials and dumpability change under the lock PTRACE_ATTACH takes (cred_guard_mutex),
 * and between the two execs this launcher runs with both refusals in force: no instant is left to attach.
 *
 * Nothing comes from the environment or the arguments: the interpreter and the hook's script are fixed at build
 * time (-DLARK_HOOK_PYTHON, -DLARK_HOOK_SCRIPT), and the interpreter runs isolated (-I: no PYTHON* variables,
 * no user site-packages in the job user's home, no current directory on sys.path, which may be the job's
 * scratch directory, filled by the job). The environment is passed on as it is (the glibc
 * loader already drops its unsafe variables for a setgid exec; the hook needs none of them).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#ifndef LARK_HOOK_PYTHON
#error "build with -DLARK_HOOK_PYTHON='\"/opt/lark/bin/python\"' (lark install-hook does)"
#endif
#ifndef LARK_HOOK_SCRIPT
#error "build with -DLARK_HOOK_SCRIPT='\"/opt/lark/bin/lark-prepare-job\"' (lark install-hook does)"
#endif

extern char **environ;

/* A hold ad on stdout: HTCondor holds the job with this reason (HoldReasonCode 19, subcode 112, like a policy
 * refusal in the Python hook), rather than starting it after a hook that could not check it. */
static int hold(const char *reason, const char *detail) {
    printf("HookStatusCode = 112\nHookStatusMessage = \"Lark: job not started: %s%s; "
           "fix: run lark install-hook as root on this execution point (docs/install.md)\"\n", reason, detail);
    fflush(stdout);
    return 1;
}

int main(void) {
    /* Without the setgid bit (copied without -p, a nosuid mount, a foreign owner), the hook would start dumpable
     * again: refuse rather than run with the window open. */
    if (getegid() == getgid())
        return hold("the PREPARE_JOB launcher of " LARK_HOOK_SCRIPT " runs without its setgid group", "");
    char *const argv[] = {LARK_HOOK_PYTHON, "-I", LARK_HOOK_SCRIPT, NULL};
    execve(LARK_HOOK_PYTHON, argv, environ);
    return hold("cannot run " LARK_HOOK_PYTHON ": ", strerror(errno));
}
