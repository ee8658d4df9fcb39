"""The sandbox transfer (starter <-> shadow) limited to the slot's Bandwidth (issue 22, LARK_SANDBOX_LIMIT).

HTCondor's starter moves a job's input and output sandbox itself, in the execution point's own network namespace,
before and after the job runs. lark-starter (lark/job/starter_wrapper.py) asks larkd with `sandbox_limit` before it
execs condor_starter; larkd puts the asker (the starter-to-be, same pid) into a cgroup v2 of its own,
`<cgroup2 mount>/<sandbox_cgroup>/starter-<pid>-<start>`, so the starter and every process it forks (the transfer
fork) create their sockets there, and adds two policers to the nftables table `<nft_table>_sandbox` in the EP's
netns: `socket cgroupv2 level L "<path>" counter limit rate over <Bandwidth> bytes/second drop`, in an output and
an input chain (on loopback, each direction meets the starter's socket once: leaving through output, arriving
through input). When the starter exits (larkd watches its pidfd) both go; `lark gc` and larkd's start remove what a
starter that is gone left (sweep()).

Why cgroup v2 and nft's `socket cgroupv2`: the kernels Lark runs on need no cls_cgroup, net_cls, cls_fw nor
connmark for it (this machine has none of them), and the match is on the socket's cgroup, which a forked child
keeps. nft resolves the path to the cgroup's id when the rule is added, relative to /sys/fs/cgroup: the cgroup2
mount must be at or under it (hybrid hosts: /sys/fs/cgroup/unified; pure v2: /sys/fs/cgroup).

The state is the kernel's: the cgroup's name carries the starter's pid and start time, the rule's comment the
same; nothing is recorded elsewhere. Every step here is idempotent, and removal goes on past errors.
"""
from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass

from ..config import Config
from ..errors import LarkError
from . import peercred

log = logging.getLogger(__name__)
NFT_CGROUP_ROOT = "/sys/fs/cgroup"  # what nft resolves `socket cgroupv2` paths against
CHAINS = {"sandbox_out": "output", "sandbox_in": "input"}
NAME_RE = re.compile(r"^starter-(\d+)-(\d+)$")
COMMENT_RE = re.compile(r"^lark sandbox starter (\d+) start (\d+) slot (\S+)$")
MIN_BURST = 65536          # bytes: what the policer lets through at once (64 KiB held TCP at 1.06x of 20 Mbit/s)
BURST_SECONDS = 0.01       # or 10 ms of the rate, where that is more (fast slots)

Nft = Callable[[str], tuple[int, str, str]]   # one nft command (text) -> (rc, JSON output, error)


def cgroup2_mount(mountinfo: str = "/proc/self/mountinfo") -> str | None:
    """Where cgroup v2 is mounted (the first such mount), or None."""
    try:
        with open(mountinfo) as f:
            for line in f:
                left, _, right = line.partition(" - ")
                if right.split(" ", 1)[0] == "cgroup2":
                    return left.split()[4]
    except OSError:
        return None
    return None


@dataclass(frozen=True)
class Starter:
    pid: int
    start: int

    @property
    def name(self) -> str:
        return f"starter-{self.pid}-{self.start}"


def _default_nft(cmd: str) -> tuple[int, str, str]:
    from ..kernel.firewall import libnft
    return libnft.get().run(cmd)


def job_cgroups_follow_the_starter(cgroup_root: str = NFT_CGROUP_ROOT) -> str | None:
    """Why moving a starter on this host would move its jobs' cgroups too (None: it would not).

    Where HTCondor itself runs on cgroup v2 (a pure v2 host: cgroup.procs at the root of /sys/fs/cgroup, the
    test of its ProcFamilyDirectCgroupV2::has_cgroup_v2), the starter makes each job's cgroup under the parent
    of its own cgroup (current_parent_cgroup()). A starter moved into <sandbox_cgroup>/starter-* would put its
    jobs' cgroups under <sandbox_cgroup>, out of HTCondor's tree and without the controllers their memory and
    CPU limits need. On hybrid hosts HTCondor uses cgroup v1 and the unified tree holds no job cgroup."""
    if os.path.exists(os.path.join(cgroup_root, "cgroup.procs")):
        return ("this is a pure cgroup v2 host, where HTCondor puts each job's cgroup next to its starter's: "
                "moving the starter into a cgroup of Lark's would take its jobs' cgroups out of HTCondor's tree "
                "(not supported yet)")
    return None


class SandboxLimiter:
    """Per-starter cgroups and their nft policers: add (join + limit), remove, what gc finds, check."""

    def __init__(self, cfg: Config, nft: Nft | None = None, cg2: str | None = None,
                 nft_root: str = NFT_CGROUP_ROOT):
        self.cfg = cfg
        self.nft = nft or _default_nft
        self.cg2 = cgroup2_mount() if cg2 is None else (cg2 or None)   # "": none (tests)
        self.nft_root = nft_root
        self.table = f"{cfg.nft_table}_sandbox"
        # limit() (after the slot ad came) and remove() (the starter exited) may run at once in two workers: one
        # at a time, so policers are never added after their starter's removal listed the rules.
        self.lock = threading.Lock()

    # -- where ---------------------------------------------------------------------------------------
    def unavailable(self) -> str | None:
        """Why this host cannot limit the sandbox (None: it can)."""
        if not self.cg2:
            return "cgroup v2 is not mounted (no cgroup2 line in /proc/self/mountinfo)"
        rel = os.path.relpath(self.cg2, self.nft_root)
        if rel.startswith(".."):
            return (f"cgroup v2 is mounted at {self.cg2}, outside {self.nft_root}, where nft resolves "
                    f"`socket cgroupv2` paths")
        return None

    def moves_job_cgroups(self) -> str | None:
        """Why moving a starter here would move its jobs' cgroups too (None: it would not)."""
        return job_cgroups_follow_the_starter(self.nft_root)

    @property
    def parent(self) -> str:
        return os.path.join(self.cg2 or "", self.cfg.sandbox_cgroup)

    def cgroup_dir(self, s: Starter) -> str:
        return os.path.join(self.parent, s.name)

    def _nft_path(self, s: Starter) -> tuple[str, int]:
        """(the cgroup's path as nft names it, its level in the v2 hierarchy)."""
        path = self.cgroup_dir(s)
        level = len(os.path.relpath(path, self.cg2 or "/").split("/"))
        return os.path.relpath(path, self.nft_root), level

    # -- add -----------------------------------------------------------------------------------------
    def join(self, s: Starter) -> str:
        """Make the starter's cgroup and move the starter into it (its later forks follow)."""
        why = self.unavailable()
        if why:
            raise LarkError(why, obj=f"sandbox limit of starter pid {s.pid}",
                            fix="mount cgroup2 under /sys/fs/cgroup, or set LARK_SANDBOX_LIMIT = false")
        path = self.cgroup_dir(s)
        try:
            os.makedirs(path, exist_ok=True)
            with open(os.path.join(path, "cgroup.procs"), "w") as f:
                f.write(str(s.pid))
        except OSError as e:
            raise LarkError(f"cannot put the starter into cgroup {path}: {e.strerror or e}",
                            obj=f"starter pid {s.pid}", fix="check that larkd runs as root and cgroup2 is writable "
                            "(pure cgroup v2 hosts: see docs/admin.md 'Sandbox transfer')") from None
        return path

    def _ensure_table(self) -> None:
        cmds = [f"add table inet {self.table}"]
        for chain, hook in CHAINS.items():
            cmds.append(f"add chain inet {self.table} {chain} {{ type filter hook {hook} priority 0; policy accept; }}")
        self._run("\n".join(cmds), f"nft table inet {self.table}")

    def limit(self, s: Starter, slot: str, mbit: float) -> None:
        """The two policers for this starter's cgroup (replacing any it had)."""
        if not re.fullmatch(r"[A-Za-z0-9_.@-]{1,128}", slot):
            raise LarkError(f"slot name {slot!r} is not valid", obj=f"starter pid {s.pid}",
                            fix="slot names are letters, digits and _.@-")
        if mbit <= 0:
            raise LarkError(f"Bandwidth {mbit:g} is not a limit", obj=f"slot {slot}", fix="a positive Mbit/s")
        with self.lock:
            self._limit(s, slot, mbit)

    def _limit(self, s: Starter, slot: str, mbit: float) -> None:
        if not os.path.isdir(self.cgroup_dir(s)):
            log.info("sandbox transfer of slot %s (starter pid %d) not limited: its starter is gone", slot, s.pid)
            return
        self._ensure_table()
        errors: list[str] = []
        self._delete_rules(s, errors)
        if errors:   # else a second pair of policers would join the first
            raise LarkError(f"cannot replace the sandbox policers of starter pid {s.pid}: {'; '.join(errors)}",
                            obj=f"nft table inet {self.table}", fix="lark gc (as root), then restart the job")
        rate = max(1, int(mbit * 1e6 / 8))
        burst = max(MIN_BURST, int(rate * BURST_SECONDS))
        path, level = self._nft_path(s)
        comment = f"lark sandbox starter {s.pid} start {s.start} slot {slot}"
        cmds = [f'add rule inet {self.table} {chain} socket cgroupv2 level {level} "{path}" counter '
                f'limit rate over {rate} bytes/second burst {burst} bytes drop comment "{comment}"' for chain in CHAINS]
        self._run("\n".join(cmds), f"sandbox policers of starter pid {s.pid} (slot {slot})")
        log.info("sandbox transfer of slot %s (starter pid %d) limited to %g Mbit/s each way", slot, s.pid, mbit)

    # -- remove --------------------------------------------------------------------------------------
    def remove(self, s: Starter) -> list[str]:
        """Rules first (their cgroup id would dangle), then the cgroup. Goes on past errors; returns them."""
        with self.lock:
            return self._remove(s)

    def _remove(self, s: Starter) -> list[str]:
        errors: list[str] = []
        self._delete_rules(s, errors)
        path = self.cgroup_dir(s)
        try:
            os.rmdir(path)
        except FileNotFoundError:
            pass
        except OSError as e:
            if e.errno == errno.EBUSY:
                errors.append(f"cgroup {path} still has processes (the starter's children outlived it)")
            else:
                errors.append(f"cgroup {path}: {e.strerror or e}")
        return errors

    def _delete_rules(self, s: Starter, errors: list[str]) -> None:
        try:
            rules = self._rules()
        except LarkError as e:
            errors.append(str(e))
            return
        for chain, handle, owner in rules:
            if owner == s:
                try:
                    self._run(f"delete rule inet {self.table} {chain} handle {handle}",
                              f"sandbox rule of starter pid {s.pid}")
                except LarkError as e:
                    errors.append(str(e))

    # -- what is there -------------------------------------------------------------------------------
    def _rules(self) -> list[tuple[str, int, Starter]]:
        rc, out, err = self.nft(f"list table inet {self.table}")
        if rc != 0:
            if "No such file" in err or "does not exist" in err:
                return []
            raise LarkError(f"nft list failed: {err.strip()[:300]}", obj=f"nft table inet {self.table}")
        found = []
        for obj in (json.loads(out).get("nftables", []) if out.strip() else []):
            rule = obj.get("rule") if isinstance(obj, dict) else None
            if not rule:
                continue
            m = COMMENT_RE.match(rule.get("comment", ""))
            if m:
                found.append((rule["chain"], int(rule["handle"]), Starter(int(m[1]), int(m[2]))))
        return found

    def _cgroups(self) -> list[Starter]:
        try:
            names = os.listdir(self.parent) if self.cg2 else []
        except FileNotFoundError:
            return []
        return [Starter(int(m[1]), int(m[2])) for m in map(NAME_RE.match, sorted(names)) if m]

    def keys(self) -> dict[Starter, list[str]]:
        """Every starter something is held for, and what: 'cgroup', 'rule in sandbox_out', ..."""
        found: dict[Starter, list[str]] = {}
        for s in self._cgroups():
            found.setdefault(s, []).append(f"cgroup {self.cgroup_dir(s)}")
        with contextlib.suppress(LarkError):
            for chain, _, s in self._rules():
                found.setdefault(s, []).append(f"nft rule in {self.table} {chain}")
        return found

    def live(self) -> list[Starter]:
        return [s for s in self.keys() if peercred.alive(s.pid, s.start)]

    def sweep(self, dry_run: bool = False) -> list[str]:
        """Remove what starters that are gone left; one failure does not stop the others."""
        actions = []
        for s, whats in sorted(self.keys().items(), key=lambda kv: kv[0].pid):
            if peercred.alive(s.pid, s.start):
                continue
            action = f"sandbox limit of gone starter pid {s.pid}: " + ", ".join(whats)
            if not dry_run:
                failed = self.remove(s)
                if failed:
                    action += f" (incomplete: {'; '.join(failed)}; run gc again once fixed)"
            actions.append(action)
        return actions

    def purge(self) -> list[str]:
        """`lark gc --purge`: the shared objects, once no live starter holds anything: the nft table and the
        cgroups' parent (an uninstall, or a test bed's stop, leaves nothing in the machine's cgroup tree)."""
        live = self.live()
        if live:
            return [f"nft table inet {self.table} and cgroup {self.parent} (kept: {len(live)} live starter(s) "
                    f"limited, e.g. pid {live[0].pid})"]
        actions = []
        rc, _, err = self.nft(f"delete table inet {self.table}")
        if rc == 0:
            actions.append(f"nft table inet {self.table}")
        elif not ("No such file" in err or "does not exist" in err):
            actions.append(f"nft table inet {self.table} (incomplete: {err.strip()[:200]})")
        if self.cg2:
            try:
                os.rmdir(self.parent)
                actions.append(f"cgroup {self.parent}")
            except FileNotFoundError:
                pass
            except OSError as e:   # a starter of another larkd (a second test bed) may still be under it
                actions.append(f"cgroup {self.parent} (kept: {e.strerror or e})")
        return actions

    def check(self, s: Starter) -> list[str]:
        """What a live, limited starter lacks (empty: both policers and its cgroup are there)."""
        problems = []
        if not os.path.isdir(self.cgroup_dir(s)):
            problems.append(f"cgroup {self.cgroup_dir(s)} is missing")
        chains = {chain for chain, _, owner in self._rules() if owner == s}
        problems += [f"no policer in {self.table} {chain}" for chain in CHAINS if chain not in chains]
        return problems

    def counters(self, s: Starter) -> dict[str, int]:
        """Bytes each policer's counter saw (chain -> bytes)."""
        rc, out, err = self.nft(f"list table inet {self.table}")
        if rc != 0:
            raise LarkError(f"nft list failed: {err.strip()[:300]}", obj=f"nft table inet {self.table}")
        got: dict[str, int] = {}
        for obj in json.loads(out).get("nftables", []):
            rule = obj.get("rule") if isinstance(obj, dict) else None
            m = COMMENT_RE.match((rule or {}).get("comment", ""))
            if rule and m and Starter(int(m[1]), int(m[2])) == s:
                for e in rule.get("expr", []):
                    if isinstance(e, dict) and "counter" in e:
                        got[rule["chain"]] = int(e["counter"]["bytes"])
        return got

    def _run(self, cmd: str, what: str) -> None:
        rc, _, err = self.nft(cmd)
        if rc != 0:
            raise LarkError(f"nft failed: {err.strip()[:500]}", obj=what,
                            fix="`lark doctor` says whether this kernel has nft's socket cgroupv2 match")


def slot_bandwidth(ads: object, starter: peercred.StarterInfo) -> float | None:
    """The slot ad's Bandwidth (Mbit/s) from larkd's trusted ad source; None when the slot has none."""
    slot_ad = getattr(ads, "slot_ad", None)
    if slot_ad is not None:   # StartdAdSource: the startd's own ad of the claimed slot
        ad = slot_ad(starter)
    else:                     # FileAdSource: <ad_dir>/<slot>.machine.ad, root-owned
        ad = ads._trusted(os.path.join(ads.dir, f"{starter.slot}.machine.ad"), starter.slot)  # type: ignore[attr-defined]
    value = ad.get("Bandwidth") if ad is not None else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        return None
    return float(value)
