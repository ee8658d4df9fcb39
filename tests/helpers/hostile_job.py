"""What a hostile job does to escape its network (runs as the job: unprivileged, in its netns, under the starter).

usage: hostile_job.py STEP [STEP ...]; each step prints one JSON line:
  download URL          fetch URL, report bytes
  release               ask larkd to release this job's network
  setup                 ask larkd for a network again (from this same namespace)
  userns-setup          `unshare -Urn lark-job-wrapper tc qdisc del dev eth0 root`: a namespace the job owns
  tc-del                `tc qdisc del dev eth0 root` in the job's own namespace
  qdisc                 `tc qdisc show dev eth0`
  touch PATH            create PATH (tells the test the job got here)
  wait-file PATH        wait (up to 60 s) until PATH exists: the test acts in between
"""
import json
import os
import subprocess
import sys
import time
import urllib.request

ENV = dict(os.environ, PATH="/usr/sbin:/sbin:/usr/bin:/bin")


def ask(op: str) -> dict:
    from lark.errors import LarkError
    from lark.job.client import call
    try:
        return call(op)
    except LarkError as e:
        return {"ok": False, "error": str(e)}


def run(argv: list[str]) -> dict:
    cp = subprocess.run(argv, capture_output=True, text=True, env=ENV, timeout=60)
    return {"rc": cp.returncode, "out": cp.stdout[-500:], "err": cp.stderr[-500:]}


def main() -> None:
    args = sys.argv[1:]
    while args:
        step = args.pop(0)
        if step == "download":
            with urllib.request.urlopen(args.pop(0), timeout=30) as r:
                out = {"downloaded": len(r.read())}
        elif step in ("release", "setup"):
            answer = ask(step)
            out = {"ok": answer.get("ok"), "error": answer.get("error", "")}
        elif step == "userns-setup":
            out = run(["unshare", "-Urn", sys.executable, "-m", "lark.job.wrapper",
                       "tc", "qdisc", "del", "dev", "eth0", "root"])
        elif step == "tc-del":
            out = run(["tc", "qdisc", "del", "dev", "eth0", "root"])
        elif step == "qdisc":
            out = run(["tc", "qdisc", "show", "dev", "eth0"])
        elif step == "touch":
            open(args.pop(0), "w").close()
            out = {}
        elif step == "wait-file":
            path, deadline = args.pop(0), time.time() + 60
            while not os.path.exists(path) and time.time() < deadline:
                time.sleep(0.05)
            out = {"waited": os.path.exists(path)}
        else:
            sys.exit(f"unknown step {step}")
        print(json.dumps({"step": step, **out}), flush=True)


if __name__ == "__main__":
    main()
