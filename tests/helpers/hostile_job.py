"""What a hostile job does to escape its network (runs as the job: unprivileged, in its netns, under the starter).

usage: hostile_job.py STEP [STEP ...]; each step prints one JSON line:
  download URL          fetch URL, report bytes
  release               ask larkd to release this job's network
  setup                 ask larkd for a network again (from this same namespace)
  userns-setup          `unshare -Urn lark-job-wrapper tc qdisc del dev eth0 root`: a namespace the job owns
  tc-del                `tc qdisc del dev eth0 root` in the job's own namespace
  qdisc                 `tc qdisc show dev eth0`
  iperf3 HOST PORT SECONDS up|down   goodput as iperf3 sees it (bit/s)
  touch PATH            create PATH (tells the test the job got here)
  wait-file PATH        wait (up to 60 s) until PATH exists: the test acts in between
  netns                 this process's network namespace (readlink /proc/self/ns/net)
  ssh-session CONFIG    ask larkd for a condor_ssh_to_job session (`sshd -i -e -f CONFIG`) in this job's network;
                        report both answers (the session's program writes to this job's stdout)
  raw OP FIELDS_JSON    send larkd {"op": OP, **FIELDS} as a root-only client would (e.g. sandbox_limit with a forged
                        starter argv, docker_setup with a made-up container); report the answer, this pid and uid
  userns-raw OP FIELDS_JSON   the same from `unshare --user --map-root-user`: uid 0 in a user namespace of its own;
                        that process lives on (so that what larkd might have made for it would still stand) until
                        this job's steps are done
  hold                  wait until stdin closes
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


def ssh_session(config: str) -> dict:
    import socket

    from lark.job.client import socket_path
    s = socket.socket(socket.AF_UNIX)
    s.connect(socket_path())
    s.sendall(json.dumps({"lark": 1, "op": "ssh_session", "argv": ["/usr/sbin/sshd", "-i", "-e", "-f", config]})
              .encode() + b"\n")
    answers = [json.loads(line) for line in s.makefile("rb")]
    return {"answers": answers}


def raw(op: str, fields: str) -> dict:
    """One request, as larkd's root-only clients (lark-starter, lark-oci-runtime) send it, and its answer."""
    import socket

    from lark.job.client import socket_path
    s = socket.socket(socket.AF_UNIX)
    s.connect(socket_path())
    s.sendall(json.dumps({"lark": 1, "op": op, **json.loads(fields)}).encode() + b"\n")
    line = s.makefile("rb").readline()
    return {"op": op, "pid": os.getpid(), "uid": os.getuid(), "answer": json.loads(line) if line else None}


HELD: list[subprocess.Popen] = []


def userns_raw(op: str, fields: str) -> dict:
    p = subprocess.Popen(["unshare", "--user", "--map-root-user", sys.executable, __file__, "raw", op, fields, "hold"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    HELD.append(p)
    line = p.stdout.readline()
    if not line.startswith("{"):
        return {"op": op, "answer": None, "err": p.stderr.read()[-500:] if p.poll() is not None else ""}
    return json.loads(line)


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
        elif step == "iperf3":
            host, port, secs, direction = (args.pop(0) for _ in range(4))
            argv = ["iperf3", "-c", host, "-p", port, "-t", secs, "-O", "1", "-J"] + (["-R"] if direction == "down"
                                                                                   else [])
            cp = subprocess.run(argv, capture_output=True, text=True, env=ENV, timeout=float(secs) + 30)
            report = json.loads(cp.stdout) if cp.stdout.strip().startswith("{") else {}
            out = {"bps": report.get("end", {}).get("sum_received", {}).get("bits_per_second"),
                   "error": report.get("error") or cp.stderr[-300:]}
        elif step == "qdisc":
            out = run(["tc", "qdisc", "show", "dev", "eth0"])
        elif step == "netns":
            out = {"netns": os.readlink("/proc/self/ns/net")}
        elif step == "ssh-session":
            out = ssh_session(args.pop(0))
        elif step == "raw":
            out = raw(args.pop(0), args.pop(0))
        elif step == "userns-raw":
            out = userns_raw(args.pop(0), args.pop(0))
        elif step == "hold":
            sys.stdin.read()
            out = {}
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
        print(json.dumps({**out, "step": step}), flush=True)
    for p in HELD:
        p.stdin.close()
        p.wait(30)


if __name__ == "__main__":
    main()
