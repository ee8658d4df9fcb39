"""Figures into the job's ad at its schedd, pushed by larkd (root), on a path the job cannot reach.

Hooks run as the job's user in the host's namespace, and a chirp path to these attributes would be the job's too,
so nothing the job can reach writes them. larkd edits the job ad at the job's schedd with htcondor2 (as
`condor_qedit` would): every `schedd_push_interval` while the job runs, at the job's end when its wrapper
asks (`push`: the starter waits for the wrapper, which is the job's process, so the job is still queued), and once
more at teardown if the counters changed since; a final push that fails is retried for `schedd_push_retry`
seconds. If larkd is down when the job ends, the wrapper waits for it up to `exit_barrier_wait`; past that the
job's history keeps the last periodic push and larkd's finished record keeps the exact figures (`lark report`).

For the job not to overwrite them, the schedd and shadow must refuse the job's own updates of these attributes:
list them in PROTECTED_JOB_ATTRS on the access point (docs/design.md, "Threat model"); larkd's identity (root on
the EP) must be a QUEUE_SUPER_USER there.

Cost at the schedd (issue 23 item 10): a push sends only the attributes whose value changed since the schedd last
took this job's figures (the plan's once, counters and rates while they move, nothing when nothing moved), the
schedd's address is looked up once, and pushes run on one thread in order of urgency (`PushQueue`): the exit
barrier's before the periodic ones. htcondor2 (25.x) edits one attribute per call, each call its own schedd
session (connect, resumed security session, transaction, commit), and has no multi-attribute edit. An edit must
not be marked dirty (TransactionFlag.SetDirty, `condor_qedit -forward`): the schedd would send it to the job's
shadow, which writes NetworkInputMb/NetworkOutputMb (on its own update list) back later with what it merged,
possibly an older value than larkd's last. Every way here leaves that flag off.

Ways to the schedd (EDIT_WAYS, measured side by side by bench/barrier.py and on the pool; docs/performance.md, "The
exit barrier"): `htcondor2` (one session per attribute), `htcondor2-nondurable` (the same without the schedd's
fdatasync per commit), `qedit` (`condor_qedit -edits:new -`: all of a push's attributes in one session and one
transaction, but a process start and a fresh authentication per push, no security session kept). DEFAULT_WAY is
larkd's.

htcondor2's `edit` and `act` hold the GIL for their whole exchange with the schedd (measured on the testbed's
schedd: a spinning Python thread got 4 turns during 50 edits, 20 ms), so every edit in larkd's own process froze
larkd: its event loop, other jobs' setups and exit barriers. larkd therefore talks to the schedds from a child
process (`EditWorker`, `python -m lark.daemon.adpush --worker`), one JSON line per edit on a pipe (issue 27).
"""
from __future__ import annotations

import concurrent.futures
import itertools
import logging
import os
import queue
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)


def job_attributes(stats: dict) -> dict[str, str]:
    """ClassAd attribute name -> ClassAd literal, from larkd's stats answer (what the job's ad gets)."""
    usage = stats.get("usage") or stats.get("finished") or {}
    # An ended job's plan is gone with its record; its final summary keeps what the ad shows (a job shorter
    # than the first push would otherwise end without its type, address and the limit it ran under).
    plan = stats.get("plan") or {k: v for k, v in (stats.get("finished") or {}).items()
                                  if k in ("network_type", "ipv4", "rate_limit_mbit")}
    attrs: dict[str, str] = {}
    if plan:
        attrs["LarkNetworkType"] = f'"{plan.get("network_type", "")}"'
        if plan.get("ipv4"):
            attrs["LarkIPv4Address"] = f'"{plan["ipv4"]}"'
        if plan.get("ipv6"):
            attrs["LarkIPv6Address"] = f'"{plan["ipv6"]}"'
        if plan.get("inbound_port"):
            attrs["LarkInboundPort"] = str(int(plan["inbound_port"]))
        if plan.get("rate_limit_mbit"):
            attrs["LarkBandwidthLimit"] = f"{float(plan['rate_limit_mbit']):g}"
    if usage:
        for attr, key in (("NetworkIncomingBytes", "bytes_in"), ("NetworkOutgoingBytes", "bytes_out"),
                          ("NetworkIncomingPackets", "packets_in"), ("NetworkOutgoingPackets", "packets_out")):
            attrs[attr] = str(int(usage.get(key, 0)))
        # HTCondor's own figures (the starter's docker_proc.cpp: bytes / (1000 * 1000)), from the same bytes, so
        # pool tools that read only these see what Lark counted.
        for attr, key in (("NetworkInputMb", "bytes_in"), ("NetworkOutputMb", "bytes_out")):
            attrs[attr] = megabytes(int(usage.get(key, 0)))
        for attr, key in (("NetworkIncomingAvgRate", "avg_in_bps"), ("NetworkOutgoingAvgRate", "avg_out_bps"),
                          ("NetworkIncomingPeakRate", "peak_in_bps"), ("NetworkOutgoingPeakRate", "peak_out_bps")):
            attrs[attr] = f"{float(usage.get(key, 0.0)):.1f}"
    if attrs:
        # The mark `lark report` counts figures by: only a queue super user can write it (the access point
        # protects it and refuses it at submit), so an ad with figures and without it was not written here.
        import socket
        attrs["LarkFiguresBy"] = '"' + socket.gethostname().replace("\\", "").replace('"', "") + '"'
    return attrs


def megabytes(n_bytes: int) -> str:
    """A byte count as HTCondor's NetworkInputMb/NetworkOutputMb literal: MB of 1,000,000 bytes, six decimals (every
    byte shows, so the figure converts back to the exact NetworkIncomingBytes/NetworkOutgoingBytes)."""
    return f"{n_bytes / 1_000_000:.6f}"


class EditWorker:
    """The schedd edits and holds of `htcondor_edit` / `htcondor_hold`, run in a child process so that htcondor2,
    which keeps the GIL while it waits for the schedd, never stops larkd. One request at a time (a lock; the push
    thread is the only caller in larkd). A worker that died is started again once per request; an error at the
    schedd comes back as the exception's text (RuntimeError)."""

    def __init__(self, argv: list[str] | None = None, way: str = ""):
        way = way or DEFAULT_WAY
        if way not in EDIT_WAYS:
            raise ValueError(f"unknown edit way {way!r}: one of {', '.join(EDIT_WAYS)}")
        self.way = way   # how the worker's edits reach the schedd (EDIT_WAYS), sent with each edit
        self.argv = argv or [sys.executable, "-m", "lark.daemon.adpush", "--worker"]
        self.proc: subprocess.Popen | None = None
        self.lock = threading.Lock()

    def start(self) -> None:
        """Start the child now (larkd does at start: it imports htcondor2 before the first job's end)."""
        with self.lock:
            self._ensure()

    def _ensure(self) -> subprocess.Popen:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True)
        return self.proc

    def stop(self) -> None:
        with self.lock:
            if self.proc is not None:
                if self.proc.stdin:
                    self.proc.stdin.close()   # the worker ends at EOF
                try:
                    self.proc.wait(5)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
                self.proc = None

    def call(self, op: str, **fields: Any) -> None:
        from .. import protocol
        request = protocol.encode({"op": op, **fields})
        with self.lock:
            line = b""
            for _ in range(2):
                proc = self._ensure()
                assert proc.stdin is not None and proc.stdout is not None
                try:
                    proc.stdin.write(request)
                    proc.stdin.flush()
                    line = proc.stdout.readline()
                except OSError:
                    line = b""
                if line:
                    break
                proc.kill()   # died (or its pipe broke) during this request: one fresh worker tries it again
                proc.wait()
                self.proc = None
            if not line:
                raise RuntimeError(f"larkd's schedd worker ({' '.join(self.argv)}) died twice on one {op}")
            answer = protocol.loads(line)
            if not isinstance(answer, dict) or not answer.get("ok"):
                raise RuntimeError(answer.get("error", "no answer") if isinstance(answer, dict) else "bad answer")

    def edit(self, schedd_name: str, job_id: str, attrs: dict[str, str]) -> None:
        self.call("edit", schedd=schedd_name, job=job_id, attrs=attrs, way=self.way)

    def hold(self, schedd_name: str, job_id: str, reason: str) -> None:
        self.call("hold", schedd=schedd_name, job=job_id, reason=reason)


def serve(stdin: Any = None, stdout: Any = None) -> None:
    """The worker's loop: one JSON request per line (`edit`, with the way it takes to the schedd, EDIT_WAYS, or
    `hold`), one answer per line, until EOF."""
    from .. import protocol
    stdin = stdin or sys.stdin.buffer
    stdout = stdout or sys.stdout.buffer
    try:
        import classad2  # noqa: F401 - imported now, not in the first job's exit barrier
        import htcondor2  # noqa: F401
    except ImportError:
        pass  # each request then answers with the ImportError
    for line in stdin:
        try:
            msg = protocol.loads(line)
            if not isinstance(msg, dict):
                raise ValueError("request is not a JSON object")
            if msg.get("op") == "edit":
                edit = EDIT_WAYS[str(msg.get("way") or DEFAULT_WAY)]
                edit(str(msg["schedd"]), str(msg["job"]), {str(k): str(v) for k, v in msg["attrs"].items()})
            elif msg.get("op") == "hold":
                htcondor_hold(str(msg["schedd"]), str(msg["job"]), str(msg["reason"]))
            else:
                raise ValueError(f"unknown request {msg.get('op')!r}")
            answer: dict[str, object] = {"ok": True}
        except Exception as e:
            answer = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        stdout.write(protocol.encode(answer))
        stdout.flush()


@dataclass
class Pending:
    schedd: str
    job_id: str
    attrs: dict[str, str]
    until: float


class AdPusher:
    def __init__(self, retry_seconds: float = 600.0, edit: Callable[[str, str, dict[str, str]], None] | None = None,
                 hold: Callable[[str, str, str], None] | None = None, between: Callable[[], None] = lambda: None):
        self.retry_seconds = retry_seconds
        self.between = between  # run before each retried final push: urgent pushes (barriers) go first
        # the schedd edits in a child process (EditWorker), started lazily or by larkd at start
        worker = EditWorker() if edit is None or hold is None else None
        self.worker = worker
        self.edit = edit or (worker.edit if worker else htcondor_edit)
        self.hold_at = hold or (worker.hold if worker else htcondor_hold)
        self.pending: dict[str, Pending] = {}   # key -> a final push not yet accepted
        # key -> (job id, the attributes its schedd holds from larkd): a push sends only what differs, and a final
        # push whose counters are these is not sent (after the exit barrier's push the job usually leaves the
        # queue before teardown)
        self.taken: dict[str, tuple[str, dict[str, str]]] = {}
        self._warned: dict[str, float] = {}

    def push(self, key: str, schedd: str, job_id: str, stats: dict) -> bool:
        """Push what larkd's `stats` answer says about a job to `schedd`, the schedd the startd's claim names (never
        one taken from the job's own GlobalJobId: policy/startd.py): the attributes it does not hold yet, in one
        edit (none when it holds them all). False (logged at most once a minute) on failure or without a schedd."""
        attrs = job_attributes(stats)
        if not attrs or not schedd:
            return False
        held_job, held = self.taken.get(key, ("", {}))
        held = held if held_job == job_id else {}
        changed = {a: v for a, v in attrs.items() if held.get(a) != v}
        if not changed:
            return True
        try:
            self.edit(schedd, job_id, changed)
        except Exception as e:  # the schedd may be down or the job gone: never fatal for larkd
            now = time.monotonic()
            # Per job, not per slot: the failures of a slot's previous job (gone from the queue) must not hide
            # the next job's.
            if now - self._warned.get(job_id, -1e9) > 60:
                self._warned[job_id] = now
                log.warning("could not push figures of job %s to schedd %s: %s", job_id, schedd, e)
            return False
        self.taken[key] = (job_id, {**held, **changed})
        return True

    def hold(self, schedd: str, job_id: str, reason: str) -> bool:
        """Put a job on hold at `schedd`, the claim's (as root), with `reason`; False (logged) if it would not."""
        if not schedd:
            return False
        try:
            self.hold_at(schedd, job_id, reason)
        except Exception as e:
            log.warning("could not hold job %s at schedd %s: %s", job_id, schedd, e)
            return False
        return True

    def push_final(self, key: str, schedd: str, job_id: str, summary: dict) -> bool:
        """The job's final figures; kept and retried by retry_pending() if the schedd does not take them now."""
        stats = {"finished": summary, "plan": {}}
        last_job, last = self.taken.pop(key, ("", {}))
        if last_job == job_id and counters(last) and counters(last) == counters(job_attributes(stats)):
            self.pending.pop(key, None)
            return True   # its schedd already has these counters (the exit barrier's push)
        if self.push(key, schedd, job_id, stats):
            self.taken.pop(key, None)
            self.pending.pop(key, None)
            return True
        if not schedd:
            return False
        self.pending[key] = Pending(schedd, job_id, job_attributes(stats),
                                    time.monotonic() + self.retry_seconds)
        return False

    def retry_pending(self) -> None:
        """Final pushes the schedd did not take yet."""
        now = time.monotonic()
        for key, p in list(self.pending.items()):
            self.between()
            if now > p.until:
                log.warning("gave up pushing the final figures of job %s; they stay in larkd's finished records",
                            p.job_id)
                self.pending.pop(key, None)
                continue
            try:
                self.edit(p.schedd, p.job_id, p.attrs)
            except Exception:
                continue
            self.pending.pop(key, None)


HOLD_SUBCODE_SETUP_FAILED = 113  # HoldReasonSubCode of a job larkd held (111/112 come from PREPARE_JOB)
COUNTERS = ("NetworkIncomingBytes", "NetworkOutgoingBytes", "NetworkIncomingPackets", "NetworkOutgoingPackets")


def counters(attrs: dict[str, str]) -> dict[str, str]:
    return {a: attrs[a] for a in COUNTERS if a in attrs}


_schedd_locations: dict[str, Any] = {}  # schedd name -> its location ad from the collector


def schedd_at(schedd_name: str) -> Any:
    """The htcondor2 Schedd of this name, located once (not one collector query per push); a failed edit forgets
    the location, so a schedd that moved is looked up again. Always by name (the claim's): never "whichever schedd
    the collector knows", which on a pool with several would be any of them."""
    import htcondor2 as ht
    return ht.Schedd(schedd_location(schedd_name))


def schedd_location(schedd_name: str) -> Any:
    """The location ad of the schedd of this name (MyAddress, ...), from the collector once (schedd_at)."""
    import htcondor2 as ht
    if not schedd_name:
        raise LookupError("no schedd named: larkd edits a job only at the schedd its claim names")
    loc = _schedd_locations.get(schedd_name)
    if loc is None:
        loc = ht.Collector().locate(ht.DaemonType.Schedd, schedd_name)
        _schedd_locations[schedd_name] = loc
    return loc


def htcondor_edit(schedd_name: str, job_id: str, attrs: dict[str, str], flags: Any = None) -> None:
    """Set attributes of one job at its schedd (htcondor2, as root). htcondor2 takes one attribute per edit, each
    its own schedd session; its default flags do not mark them dirty, so the job's shadow is not sent them (see
    the module's docstring)."""
    import classad2
    try:
        schedd = schedd_at(schedd_name)
        extra = {} if flags is None else {"flags": flags}
        for attr, literal in attrs.items():
            if schedd.edit(job_id, attr, classad2.ExprTree(literal), **extra) < 1:
                raise LookupError(f"the schedd no longer holds job {job_id}")
    except Exception:
        _schedd_locations.pop(schedd_name, None)
        raise


def htcondor_edit_nondurable(schedd_name: str, job_id: str, attrs: dict[str, str]) -> None:
    """htcondor_edit with TransactionFlag.NonDurable: the schedd does not fsync its job queue log for these edits
    (measured in bench/barrier.py; not larkd's way: see docs/design.md, "The exit barrier")."""
    import htcondor2 as ht
    htcondor_edit(schedd_name, job_id, attrs, flags=ht.TransactionFlag.NonDurable)


ATTR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def qedit_edits(attrs: dict[str, str]) -> str:
    """The ClassAd that `condor_qedit -edits:new -` reads on stdin: the attributes of one push, each literal as
    larkd built it (new ClassAd syntax, the same text htcondor2's edit sends). A name that is not a ClassAd
    attribute name or a literal with a line break (which could carry a second attribute) is refused."""
    if not attrs:
        raise ValueError("no attributes to edit")
    for attr, literal in attrs.items():
        if not ATTR_NAME.match(attr):
            raise ValueError(f"{attr!r} is not a ClassAd attribute name")
        if "\n" in literal or "\r" in literal or not literal.strip():
            raise ValueError(f"the value of {attr} is not a one-line ClassAd literal: {literal!r}")
    return "[ " + "; ".join(f"{attr} = {literal}" for attr, literal in attrs.items()) + " ]\n"


def qedit_argv(qedit: str, schedd: str, job_id: str) -> list[str]:
    """condor_qedit's command line for one job's push (without -forward: nothing marked dirty, as htcondor2's
    default flags; the edits come on stdin)."""
    if not re.fullmatch(r"[0-9]+\.[0-9]+", job_id):
        raise ValueError(f"{job_id!r} is not a job id (cluster.proc)")
    return [qedit, "-name", schedd, job_id, "-edits:new", "-"]


def find_qedit(which: Callable[[str], str | None] = shutil.which, bindir: str | None = None) -> str:
    """condor_qedit from PATH, else from HTCondor's BIN (`bindir`, else the configuration's; an EP has it)."""
    found = which("condor_qedit")
    if found:
        return found
    if bindir is None:
        bindir = "/usr/bin"
        try:
            import htcondor2 as ht
            bindir = str(ht.param.get("BIN", bindir))
        except Exception:   # no bindings: the error below names the fix
            pass
    candidate = os.path.join(bindir, "condor_qedit")
    if os.access(candidate, os.X_OK):
        return candidate
    raise FileNotFoundError(f"condor_qedit is neither on PATH nor in HTCondor's BIN ({bindir}): larkd's figures "
                            "cannot reach the schedd; install HTCondor's tools on this EP (the condor package) or "
                            "put condor_qedit on larkd's PATH")


def qedit_edit(schedd_name: str, job_id: str, attrs: dict[str, str],
               run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
               which: Callable[[str], str | None] = shutil.which, bindir: str | None = None) -> None:
    """Set all of a push's attributes of one job in ONE schedd session and transaction (`condor_qedit -edits`):
    one connect, authentication and commit (one fsync of the job queue log) instead of one per attribute. The
    schedd is named by its address from the collector (located once, as htcondor_edit), so condor_qedit does no
    collector query. Without -forward: not marked dirty, the shadow is not sent them (the module's docstring)."""
    text = qedit_edits(attrs)
    try:
        qedit = find_qedit(which, bindir)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"figures of job {job_id} not pushed to schedd {schedd_name}: {e}") from None
    try:
        address = str(schedd_location(schedd_name).get("MyAddress") or schedd_name)
        cp = run(qedit_argv(qedit, address, job_id), input=text, capture_output=True, text=True, timeout=60)
    except Exception:
        _schedd_locations.pop(schedd_name, None)
        raise
    if cp.returncode != 0:
        _schedd_locations.pop(schedd_name, None)
        err = " ".join((cp.stderr or cp.stdout or "").split())
        if "Failed to set attribute" in err:
            raise LookupError(f"the schedd no longer holds job {job_id} (condor_qedit: {err})")
        raise RuntimeError(f"condor_qedit could not edit job {job_id} at schedd {schedd_name} (exit "
                           f"{cp.returncode}): {err}")


def htcondor_hold(schedd_name: str, job_id: str, reason: str) -> None:
    """Hold one job at its schedd (htcondor2, as root, a queue super user): the shadow is told to vacate it. The
    reason goes as a (text, subcode) tuple: htcondor2 25.14's `act` drops a reason given as a plain string (the
    job is held with HoldReason ""), and puts the text into a ClassAd string unescaped (a `"` leaves HoldReason
    undefined), so quotes and backslashes are replaced."""
    reason = reason.replace('"', "'").replace("\\", "/")
    import htcondor2 as ht
    try:
        result = schedd_at(schedd_name).act(ht.JobAction.Hold, job_id, reason=(reason, HOLD_SUBCODE_SETUP_FAILED))
    except Exception:
        _schedd_locations.pop(schedd_name, None)
        raise
    if int(result.get("TotalSuccess", 0)) < 1:
        raise LookupError(f"the schedd did not hold job {job_id}: {result}")


EDIT_WAYS: dict[str, Callable[[str, str, dict[str, str]], None]] = {
    "qedit": qedit_edit, "htcondor2": htcondor_edit, "htcondor2-nondurable": htcondor_edit_nondurable}

DEFAULT_WAY = "htcondor2"

URGENT, ROUTINE = 0, 1  # PushQueue priorities: the exit barrier's push, then everything else


class PushQueue(concurrent.futures.Executor):
    """One thread for every edit at the schedds, taking the most urgent work first (FIFO among equals): a job's
    exit barrier waits at most for the edit in progress, not for the periodic pushes of every other job (issue 23
    item 10: neighbours looping on `push` delayed barriers past the wrapper's 30 s). One thread keeps a job's
    pushes from overtaking each other; a push reads its job's counters when it runs, so one that runs later never
    carries older figures. `submit` is ROUTINE (what `loop.run_in_executor` uses)."""

    def __init__(self, name: str = "lark-push"):
        self._work: queue.PriorityQueue[tuple[int, int, Callable[[], None]]] = queue.PriorityQueue()
        self._order = itertools.count()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future:
        return self.submit_at(ROUTINE, fn, *args, **kwargs)

    def submit_at(self, priority: int, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as e:  # handed to whoever waits on the future, like ThreadPoolExecutor does
                future.set_exception(e)
        self._work.put((priority, next(self._order), run))
        return future

    def run_urgent(self) -> None:
        """Run the URGENT work queued now, in the push thread, from inside a long ROUTINE task (between the jobs
        of a periodic round), so that a barrier does not wait for the whole round."""
        if threading.current_thread() is not self._thread:
            return
        while True:
            try:
                priority, order, run = self._work.get_nowait()
            except queue.Empty:
                return
            if priority != URGENT:
                self._work.put((priority, order, run))  # back in its place: same priority and order
                return
            run()

    def _serve(self) -> None:
        while True:
            _, _, run = self._work.get()
            run()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """The thread is a daemon that ends with larkd; queued edits are dropped with the process (the final
        figures stay in larkd's finished records)."""


if __name__ == "__main__" and sys.argv[1:] == ["--worker"]:
    serve()
