"""lark-transfer-plugin: HTCondor's file-transfer plugin, run in the job's network (issue 22).

Named in FILETRANSFER_PLUGINS through a symlink called after the plugin it stands in for
(`$(LARK_LIBEXEC)/transfer/curl_plugin`, made by `lark install-hook`). HTCondor runs it as the job's user, from
the starter, in the execution point's namespace; it has larkd run the real plugin of its name in the job's
network (lark/daemon/transfer_plugin.py says how, and why larkd decides which program runs). The capability query
(`-classad`), which moves no data, runs the real plugin here.

When larkd will not (the job's policy gives it no network, larkd is away), nothing is transferred with the
execution point's network: every file of the request fails with Lark's reason, which HTCondor puts in the job's
hold reason.
"""
from __future__ import annotations

import logging
import os
import sys

from .ssh_session import run_by_larkd

log = logging.getLogger("lark-transfer-plugin")
DEFAULT_PLUGIN_DIR = "/usr/libexec/condor"   # lark.config.Config.transfer_plugin_dir (a unit test keeps them equal)
WRAPPER_NAME = "lark-transfer-plugin"


def plugin_dir() -> str:
    return os.environ.get("LARK_TRANSFER_PLUGIN_DIR") or DEFAULT_PLUGIN_DIR


MAX_REQUEST_TEXT = 256 * 1024   # the plugin's input file HTCondor wrote: a few hundred bytes per URL


def refuse(args: list[str], refusal: dict) -> int:
    """Fail the request with larkd's reason: larkd's result ads (one failed transfer per file of the request)
    go into the output file, where HTCondor reads the reason for the job's hold; exit code 1."""
    sys.stderr.write(f"Lark: this transfer gets no network: {refusal.get('error')}\n")
    results = refusal.get("results")
    try:
        outfile = args[args.index("-outfile") + 1]
    except (ValueError, IndexError):
        return 1
    if isinstance(results, str):    # else (larkd away) HTCondor reports a plugin that gave no result
        with open(outfile, "w", encoding="utf-8") as f:
            f.write(results)
    return 1


def request_text(args: list[str]) -> str:
    """The plugin's input file (the URLs), read as the job's user, for larkd's result ads if it refuses."""
    try:
        with open(args[args.index("-infile") + 1], encoding="utf-8", errors="replace") as f:
            return f.read(MAX_REQUEST_TEXT)
    except (ValueError, IndexError, OSError):
        return ""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv if argv is None else argv
    name, args = os.path.basename(argv[0]), argv[1:]
    if name == WRAPPER_NAME:
        sys.stderr.write("lark-transfer-plugin runs through a symlink named after the plugin it stands in for "
                         "(lark install-hook makes them in $(LARK_LIBEXEC)/transfer)\n")
        return 2
    if args == ["-classad"]:   # what the plugin can do: it moves no data
        real = os.path.join(plugin_dir(), name)
        os.execv(real, [real, *args])
    if "-infile" not in args:   # a single-file plugin's `SRC DEST` would run here, with the EP's network
        return refuse(args, {"error": f"{name} is wrapped by lark-transfer-plugin, which runs only multi-file "
                                      "plugins (-infile/-outfile); do not wrap this one"})
    code, refusal = run_by_larkd("transfer_plugin", [name, *args], request=request_text(args))
    if refusal is not None:
        return refuse(args, refusal)
    return code


if __name__ == "__main__":
    sys.exit(main())
