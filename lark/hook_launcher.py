"""`lark install-hook`: builds the PREPARE_JOB hook's launcher and installs it setgid to a group without privileges.

The hook runs as the job's user in the execution point's own network namespace. Started by this launcher it is
never dumpable, from its first instruction to its exit, so no process of the job's user can trace it, with or
without yama (`lark/job/launcher/prepare_job.c` says why, from the kernel's rules). The Python hook alone can
only make itself non-dumpable once its interpreter has started: a job watching for its pid attaches first.

The launcher is compiled where Lark is installed (gcc), with the interpreter and the hook's script fixed in it,
and installed as root:lark-hook, mode 2755. Nothing may be replaced by anyone but root on the way from the
launcher to the hook's code, so every file and directory it names is checked for that first.

It also builds the compiled job wrapper (`lark/job/launcher/job_wrapper.c`, issue 27) into the same directory,
$(LARK_LIBEXEC)/lark-job-wrapper, root:root 0755 and not setgid (it runs as the job, with no privilege to
protect); it execs the Python wrapper for every case it does not handle itself. Where that cannot be compiled
(no cc, or no C headers), the same path becomes a symlink to the Python wrapper, so that a USER_JOB_WRAPPER naming
it (condor_config.d/50-lark.conf, LARK_JOB_WRAPPER) always runs a wrapper.

The STARTER wrapper likewise (`lark/job/launcher/starter.c`): $(LARK_LIBEXEC)/lark-starter, compiled with the
Python lark-starter as its fallback and the real condor_starter fixed in it (`condor_config_val LARK_REAL_STARTER`
when install-hook runs), else a symlink to the Python lark-starter (LARK_STARTER in 50-lark.conf).
"""
from __future__ import annotations

import argparse
import grp
import logging
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

from .errors import LarkError

log = logging.getLogger("lark.hook_launcher")

SOURCE = Path(__file__).resolve().parent / "job" / "launcher" / "prepare_job.c"
WRAPPER_SOURCE = Path(__file__).resolve().parent / "job" / "launcher" / "job_wrapper.c"
WRAPPER_NAME = "lark-job-wrapper"  # in the launcher's directory: $(LARK_LIBEXEC)/lark-job-wrapper
STARTER_SOURCE = Path(__file__).resolve().parent / "job" / "launcher" / "starter.c"
STARTER_NAME = "lark-starter"  # $(LARK_LIBEXEC)/lark-starter
# lark/job/starter_wrapper.DEFAULT_REAL (a unit test keeps the two equal)
DEFAULT_REAL_STARTER = "/usr/sbin/condor_starter"
GROUP = "lark-hook"
# Where the shipped condor_config.d/50-lark.conf points LARK_HOOK_PREPARE_JOB: next to the venv's bin/, where
# pip (which rewrites bin/lark-prepare-job on every upgrade) never writes.
DEFAULT_DEST = Path(sys.prefix) / "libexec" / "lark-prepare-job"
# In the binary: how `lark doctor` tells the launcher from the Python hook or anything else at the hook's path.
MARKER = b"the PREPARE_JOB launcher of "
CFLAGS = ["-O2", "-Wall", "-Wextra", "-Werror", "-fstack-protector-strong", "-D_FORTIFY_SOURCE=2", "-fPIE", "-pie",
          "-Wl,-z,relro,-z,now"]
FIX = "run `lark install-hook` as root (docs/install.md)"


def only_root_can_replace(path: Path) -> str | None:
    """Why someone other than root could replace `path` (it, a symlink on the way, or a directory above it),
    or None. A world-writable directory is accepted only with its sticky bit (/tmp), where only root may
    rename or delete root's files."""
    path = Path(os.path.abspath(path))
    seen = [path, *path.parents]
    real = Path(os.path.realpath(path))
    if real != path:
        seen += [real, *real.parents]
    for p in seen:
        try:
            st = os.lstat(p)
        except OSError as e:
            return f"{p}: {e.strerror}"
        if stat.S_ISLNK(st.st_mode):
            continue  # a symlink cannot be changed, only replaced through its directory, checked too
        if st.st_uid != 0:
            return f"{p} is owned by uid {st.st_uid}, not root"
        sticky_dir = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not sticky_dir:
            return f"{p} is writable by its group or by everyone (mode {stat.filemode(st.st_mode)})"
    return None


def privilegeless_group(name: str, create: bool = True) -> int:
    """The gid of `name`, made as a system group when absent. Refused when anybody is in it: the launcher's
    whole point is that no process but the hook ever has this group."""
    try:
        group = grp.getgrnam(name)
    except KeyError:
        if not create:
            raise LarkError(f"no group {name}", fix=FIX) from None
        subprocess.run(["groupadd", "--system", name], check=True)
        group = grp.getgrnam(name)
        log.info("made system group %s (gid %d)", name, group.gr_gid)
    members = set(group.gr_mem) | {u.pw_name for u in pwd.getpwall() if u.pw_gid == group.gr_gid}
    if group.gr_gid == 0 or members:
        raise LarkError(f"group {name} (gid {group.gr_gid}) has members: {', '.join(sorted(members)) or 'root'}",
                        obj="the PREPARE_JOB launcher's group",
                        fix="use a group no user and no file needs, e.g. the default lark-hook (--group)")
    return group.gr_gid


def _c_string(what: str, path: Path) -> str:
    text = str(path)
    if not path.is_absolute() or any(c in text for c in '"\\') or not text.isprintable():
        raise LarkError(f"{what} {text!r} must be an absolute path without quotes, backslashes or control "
                        "characters (it is compiled into the launcher)", obj="lark install-hook")
    return f'"{text}"'


def _temp_beside(dest: Path, what: str) -> tuple[Path, str]:
    """`dest` made absolute, its directory made and checked root-only, and a new empty file there to replace it
    with atomically."""
    dest = Path(os.path.abspath(dest))
    dest.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    why = only_root_can_replace(dest.parent)
    if why:
        raise LarkError(f"others could replace {what}: {why}", obj=str(dest),
                        fix="choose a destination in root-owned directories (--dest)")
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
    os.close(fd)
    return dest, tmp


def install(dest: Path, python: Path, script: Path, gid: int, cc: str = "gcc") -> None:
    """Compile the launcher for `python -I script` and put it at `dest` as root:gid, mode 2755, atomically."""
    for what, path in (("interpreter", python), ("hook script", script)):
        why = only_root_can_replace(path)
        if why:
            raise LarkError(f"the launcher would run code that not only root controls: {why}",
                            obj=f"the hook's {what} {path}", fix="install Lark in a root-owned venv (docs/install.md)")
    dest, tmp = _temp_beside(dest, "the launcher")
    try:
        cp = subprocess.run([cc, *CFLAGS, f"-DLARK_HOOK_PYTHON={_c_string('interpreter', python)}",
                             f"-DLARK_HOOK_SCRIPT={_c_string('hook script', script)}", "-o", tmp, str(SOURCE)],
                            capture_output=True, text=True)
        if cp.returncode != 0:
            raise LarkError(f"{cc} failed: {cp.stderr.strip()}", obj=str(SOURCE),
                            fix="install gcc and the C library headers (Debian: gcc libc6-dev; EL: gcc glibc-devel)")
        os.chown(tmp, 0, gid)
        os.chmod(tmp, 0o2755)  # after chown, which clears the setgid bit
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    log.info("installed %s (root:%d, 2755) for %s -I %s", dest, gid, python, script)


def _install_compiled(dest: Path, source: Path, defines: dict[str, Path], fallback: Path, what: str,
                      unwanted: str | None, cc: str) -> bool:
    """`source` compiled with `defines` (paths, as C strings) at `dest` (root:root 0755); True when compiled. When
    `unwanted` says why it is not wanted, or it cannot be compiled, `dest` becomes a symlink to `fallback`, the
    Python program of the same name, and the reason is logged: the Python one stays what runs."""
    flags = [f"-D{name}={_c_string(name, path)}" for name, path in defines.items()]
    dest, tmp = _temp_beside(dest, f"the {what}")
    try:
        problem = unwanted
        if problem is None and shutil.which(cc) is None:
            problem = (f"no C compiler {cc!r} on PATH (install gcc and the C library headers, Debian: gcc libc6-dev; "
                       "EL: gcc glibc-devel, then run `lark install-hook` again)")
        elif problem is None:
            cp = subprocess.run([cc, *CFLAGS, *flags, "-o", tmp, str(source)], capture_output=True, text=True)
            if cp.returncode != 0:
                problem = (f"{cc} failed on {source}: {cp.stderr.strip()} (install the C library headers, "
                           "Debian: libc6-dev; EL: glibc-devel, then run `lark install-hook` again)")
        if problem is None:
            os.chown(tmp, 0, 0)
            os.chmod(tmp, 0o755)
            os.replace(tmp, dest)
            log.info("installed %s (compiled %s, falls back to %s)", dest, what, fallback)
            return True
        os.unlink(tmp)
        os.symlink(fallback, tmp)
        os.replace(tmp, dest)
        log.warning("%s: the Python %s (a symlink to %s), not the compiled one: %s", dest, what, fallback, problem)
        return False
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def install_job_wrapper(dest: Path, py_wrapper: Path, cc: str = "gcc", compiled: bool = True) -> bool:
    """The compiled job wrapper at `dest` (root:root 0755), its fallback `py_wrapper`; True when compiled. When
    `compiled` is False or it cannot be compiled, `dest` becomes a symlink to `py_wrapper` and the reason is
    logged: the Python wrapper stays what runs."""
    _c_string("Python job wrapper", py_wrapper)
    return _install_compiled(dest, WRAPPER_SOURCE, {"LARK_PY_WRAPPER": py_wrapper}, py_wrapper, "job wrapper",
                             None if compiled else "--python-job-wrapper asked for the Python wrapper", cc)


def configured_real_starter() -> Path:
    """`condor_config_val LARK_REAL_STARTER` (50-lark.conf sets it), else the Python lark-starter's default: the
    compiled lark-starter keeps it, so a change needs `lark install-hook` again (docs/admin.md)."""
    try:
        cp = subprocess.run(["condor_config_val", "LARK_REAL_STARTER"], capture_output=True, text=True, timeout=60)
        if cp.returncode == 0 and cp.stdout.strip():
            return Path(cp.stdout.strip())
        why = cp.stderr.strip() or "not set"
    except (OSError, subprocess.TimeoutExpired) as e:
        why = str(e)
    log.warning("LARK_REAL_STARTER: %s; the compiled lark-starter runs %s (set LARK_REAL_STARTER as 50-lark.conf "
                "does, then run `lark install-hook` again)", why, DEFAULT_REAL_STARTER)
    return Path(DEFAULT_REAL_STARTER)


def install_starter(dest: Path, py_starter: Path, real_starter: Path, cc: str = "gcc", compiled: bool = True) -> bool:
    """The compiled lark-starter at `dest` (root:root 0755), running `real_starter` unless $LARK_REAL_STARTER
    names another, its fallback `py_starter`; True when compiled, else `dest` links to `py_starter` (the reason
    logged)."""
    _c_string("Python lark-starter", py_starter)
    _c_string("real condor_starter", real_starter)
    return _install_compiled(dest, STARTER_SOURCE, {"LARK_PY_STARTER": py_starter,
                                                    "LARK_REAL_STARTER_PATH": real_starter}, py_starter,
                             "lark-starter", None if compiled else "--python-starter asked for the Python one", cc)


def launcher_problem(path: str) -> str | None:
    """Why the hook at `path` would start traceable by the job's user, or None when it is the setgid launcher."""
    try:
        st = os.stat(path)
        with open(path, "rb") as f:
            is_launcher = MARKER in f.read(1 << 20)
    except OSError as e:
        return f"unreadable ({e.strerror})"
    if not is_launcher:
        return "not the setgid launcher (a Python hook's start is traceable by the job's user)"
    if not st.st_mode & stat.S_ISGID or st.st_gid == 0:
        return f"the launcher has no setgid group (mode {stat.filemode(st.st_mode)}, gid {st.st_gid})"
    return only_root_can_replace(Path(path))


def install_transfer_wrappers(directory: Path, wrapper: Path, names: list[str]) -> list[Path]:
    """`directory/NAME` -> `wrapper` for each plugin name: what FILETRANSFER_PLUGINS names in the shipped
    50-lark.conf, so that HTCondor's plugins run in the job's network (lark/job/transfer_plugin.py)."""
    why = only_root_can_replace(wrapper)
    if why:
        raise LarkError(f"the transfer plugin wrapper would run code that not only root controls: {why}",
                        obj=str(wrapper), fix="install Lark in a root-owned venv (docs/install.md)")
    directory.mkdir(mode=0o755, parents=True, exist_ok=True)
    made = []
    for name in names:
        if "/" in name or name in ("", ".", ".."):
            raise LarkError(f"{name!r} is not a plugin's file name", obj="--transfer-plugins",
                            fix="name the plugins as in HTCondor's LIBEXEC, e.g. curl_plugin")
        link = directory / name
        tmp = directory / f".{name}.new"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(wrapper)
        os.replace(tmp, link)
        made.append(link)
    return made


def cmd_install_hook(args: argparse.Namespace) -> int:
    # The job wrapper first: USER_JOB_WRAPPER may name its path, which then exists even where the launcher below
    # cannot be compiled.
    wrapper_dest = Path(args.dest).parent / WRAPPER_NAME
    if install_job_wrapper(wrapper_dest, Path(args.job_wrapper), args.cc, not args.python_job_wrapper):
        print(f"{wrapper_dest}: the compiled job wrapper (falls back to {args.job_wrapper}); USER_JOB_WRAPPER runs "
              "it with LARK_JOB_WRAPPER = $(LARK_LIBEXEC)/lark-job-wrapper (50-lark.conf)")
    else:
        print(f"{wrapper_dest}: the Python job wrapper {args.job_wrapper}, not compiled (the reason is logged above)")
    starter_dest = Path(args.dest).parent / STARTER_NAME
    real = Path(args.real_starter) if args.real_starter else configured_real_starter()
    if install_starter(starter_dest, Path(args.starter), real, args.cc, not args.python_starter):
        print(f"{starter_dest}: the compiled lark-starter, runs {real} (falls back to {args.starter}); STARTER runs it "
              "with LARK_STARTER = $(LARK_LIBEXEC)/lark-starter (50-lark.conf); run `lark install-hook` again after "
              "changing LARK_REAL_STARTER")
    else:
        print(f"{starter_dest}: the Python lark-starter {args.starter}, not compiled (the reason is logged above)")
    gid = privilegeless_group(args.group)
    install(Path(args.dest), Path(args.python), Path(args.script), gid, args.cc)
    print(f"{args.dest}: setgid {args.group}, runs {args.python} -I {args.script}; "
          f"LARK_HOOK_PREPARE_JOB = {args.dest} (as in the shipped 50-lark.conf)")
    links = install_transfer_wrappers(Path(args.dest).parent / "transfer", Path(args.transfer_wrapper),
                                      args.transfer_plugins.split(","))
    print(f"transfer plugin wrappers: {', '.join(map(str, links))} (FILETRANSFER_PLUGINS in the shipped "
          "50-lark.conf)")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("install-hook", help="build and install the PREPARE_JOB hook's setgid launcher (as root)")
    p.add_argument("--dest", default=str(DEFAULT_DEST), help="where to install it (default: %(default)s)")
    p.add_argument("--group", default=GROUP, help="its group, made when absent, with no members (default: "
                   "%(default)s)")
    # sys.executable unresolved: the venv's bin/python, whose pyvenv.cfg gives the hook Lark's packages.
    p.add_argument("--python", default=sys.executable, help="the interpreter it runs (default: %(default)s)")
    p.add_argument("--script", default=str(Path(sys.executable).parent / "lark-prepare-job"),
                   help="the hook it runs with `python -I` (default: %(default)s)")
    p.add_argument("--cc", default="gcc", help="C compiler (default: %(default)s)")
    p.add_argument("--transfer-plugins", default="curl_plugin",
                   help="the file-transfer plugins to run in the job's network, comma-separated (default: "
                        "%(default)s)")
    p.add_argument("--transfer-wrapper", default=str(Path(sys.executable).parent / "lark-transfer-plugin"),
                   help="the wrapper the plugins' symlinks point to (default: %(default)s)")
    p.add_argument("--job-wrapper", default=str(Path(sys.executable).parent / "lark-job-wrapper"),
                   help="the Python job wrapper the compiled one falls back to (default: %(default)s)")
    p.add_argument("--python-job-wrapper", action="store_true",
                   help="do not compile the job wrapper: $(LARK_LIBEXEC)/lark-job-wrapper links to the Python one")
    p.add_argument("--starter", default=str(Path(sys.executable).parent / "lark-starter"),
                   help="the Python lark-starter the compiled one falls back to (default: %(default)s)")
    p.add_argument("--real-starter", default=None,
                   help="the condor_starter the compiled lark-starter runs (default: condor_config_val "
                        f"LARK_REAL_STARTER, else {DEFAULT_REAL_STARTER})")
    p.add_argument("--python-starter", action="store_true",
                   help="do not compile lark-starter: $(LARK_LIBEXEC)/lark-starter links to the Python one")
    p.set_defaults(func=cmd_install_hook)
