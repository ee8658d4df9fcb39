"""File-transfer plugins in the job's network (issue 22): what larkd agrees to run for a plugin wrapper.

HTCondor runs each plugin named in FILETRANSFER_PLUGINS as the job's user, from the starter, in the execution
point's own network namespace. Lark names its wrapper there instead (`lark-transfer-plugin`, one symlink per
wrapped plugin, named after it); the wrapper asks larkd (`transfer_plugin`), and larkd runs the real plugin of
that name from its own `transfer_plugin_dir` in the job's network namespace, as the wrapper's user, exactly as it
runs condor_ssh_to_job's sshd (ssh_session.py): the plugin's transfers are then limited, counted and filtered as
the job's own traffic is. Before input transfer the job has no namespace yet: larkd builds the job's network in
a namespace of its own making, used by the plugins until the job starts (server.py, `op_setup` then replaces it
by the network in the job's namespace, carrying its figures). Output plugins run after the job's program has
ended, in the job's namespace, which larkd keeps named until the starter exits.

Only the plugin's name comes from the request, and only a root-owned program no one else may write, in the
configured directory, is run: a submitter's own plugin never gets here (HTCondor runs those itself, and Lark
refuses them: lark/policy/transfers.py).
"""
from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass

import classad2

from ..errors import LarkError

PLUGIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}")
MAX_PATH = 4096
# A refusal's result names at most this many of the request's files: the request text is the job's to write
# (one request line holds tens of thousands of empty ads), and HTCondor holds the job on the first failure.
MAX_RESULT_ADS = 64


@dataclass(frozen=True)
class PluginCommand:
    """A checked request: the real plugin (larkd's choice) and HTCondor's multi-file plugin arguments."""
    program: str
    infile: str
    outfile: str
    upload: bool

    def argv(self) -> list[str]:
        return [self.program, "-infile", self.infile, "-outfile", self.outfile, *(["-upload"] if self.upload else [])]


def _file_path(value: str, what: str) -> str:
    if not os.path.isabs(value) or "\0" in value or len(value) > MAX_PATH:
        raise LarkError(f"the plugin's {what} must be an absolute path", obj=f"{what} {value[:120]!r}",
                        fix="only HTCondor's starter runs transfer plugins (FILETRANSFER_PLUGINS)")
    return value


def system_plugin(plugin_dir: str, name: str) -> str:
    """The real plugin `name` in `plugin_dir`: a regular file owned by root that no one else may change (so never a
    submitter's code), else a LarkError that says what to fix."""
    if not PLUGIN_NAME.fullmatch(name):
        raise LarkError("a transfer plugin's name is one file name", obj=f"plugin {name[:80]!r}",
                        fix="name the wrapper after the plugin it wraps (lark install-hook does)")
    path = os.path.join(plugin_dir, name)
    try:
        st = os.stat(path)
        dir_st = os.stat(plugin_dir)
    except OSError as e:
        raise LarkError(f"no transfer plugin {name} in {plugin_dir}: {e.strerror}", obj=path,
                        fix="install HTCondor's plugin there, or set LARK_TRANSFER_PLUGIN_DIR") from None
    for what, s in ((path, st), (plugin_dir, dir_st)):
        if s.st_uid != 0 or s.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise LarkError("a transfer plugin must be root's and writable by no one else", obj=what,
                            fix=f"chown root and chmod go-w {what}")
    if not stat.S_ISREG(st.st_mode) or not st.st_mode & stat.S_IXUSR:
        raise LarkError("the transfer plugin is not an executable file", obj=path, fix="reinstall HTCondor's plugin")
    return path


def plugin_command(argv: object, plugin_dir: str) -> PluginCommand:
    """`argv` as the wrapper got it, with the plugin's name first: `NAME -infile IN -outfile OUT [-upload]`."""
    if not (isinstance(argv, list) and 5 <= len(argv) <= 6 and all(isinstance(a, str) for a in argv)):
        raise LarkError("transfer_plugin needs the plugin's name and HTCondor's multi-file arguments",
                        obj="argv", fix="NAME -infile IN -outfile OUT [-upload]")
    name, i, infile, o, outfile, *rest = argv
    if (i, o) != ("-infile", "-outfile") or rest not in ([], ["-upload"]):
        raise LarkError("transfer_plugin runs only HTCondor's multi-file plugin protocol",
                        obj=f"argv {' '.join(argv)[:160]}", fix="NAME -infile IN -outfile OUT [-upload]")
    return PluginCommand(system_plugin(plugin_dir, name), _file_path(infile, "input file"),
                         _file_path(outfile, "output file"), upload=bool(rest))


def failure_ads(request_text: object, reason: str) -> str:
    """HTCondor's multi-file plugin result for a refused request: one failed transfer per file the plugin's input
    file (`request_text`, as the wrapper read it) names, each with `reason` as its TransferError, which HTCondor
    puts in the job's hold reason."""
    requests: list = []
    if isinstance(request_text, str):
        try:
            for request in classad2.parseAds(request_text):   # lazily: only the first MAX_RESULT_ADS are read
                requests.append(request)
                if len(requests) == MAX_RESULT_ADS:
                    break
        except (ValueError, RuntimeError):
            pass
    results = []
    for request in requests[:MAX_RESULT_ADS] or [classad2.ClassAd()]:
        url = str(request.get("Url", request.get("URL", "")))
        ad = classad2.ClassAd()
        ad["TransferUrl"] = url
        ad["TransferFileName"] = os.path.basename(str(request.get("LocalFileName", "")))
        ad["TransferProtocol"] = url.split(":", 1)[0] if ":" in url else ""
        ad["TransferSuccess"] = False
        ad["TransferError"] = reason
        results.append(str(ad))
    return "\n".join(results) + "\n"
