"""The kernel side of the sandbox transfer's limit (issue 22): a cgroup v2 per starter and two nft policers on the
sockets of that cgroup. lark/daemon/sandbox.py decides which starter, at which rate and when; this module only
writes and reads the kernel (cgroup mkdir / rmdir / cgroup.procs, nft transactions and listings).

The cgroup is `<cgroup2 mount>/<sandbox_cgroup>/starter-<pid>-<start>`: the starter and every process it forks (the
transfer fork) create their sockets there. The policers are rules of the nftables table `<nft_table>_sandbox` in the
EP's netns, `socket cgroupv2 level L "<path>" counter limit rate over <rate> bytes/second drop`, one in an output and
one in an input chain (on loopback, each direction meets the starter's socket once: leaving through output, arriving
through input). nft resolves the path to the cgroup's id when the rule is added, relative to /sys/fs/cgroup: the
cgroup2 mount must be at or under it (hybrid hosts: /sys/fs/cgroup/unified; pure v2: /sys/fs/cgroup).

The state is the kernel's: the cgroup's name carries the starter's pid and start time, the rule's comment the same;
nothing is recorded elsewhere. Every step is idempotent; removal goes on past errors and returns them.

nft runs through libnftables (kernel/firewall/libnft.py), as every other nft call of Lark: the `nft` callable is
libnft's shared context by default, a context made in another netns (libnft.run_in_netns) or a fake in tests.
"""
from __future__ import annotations

import errno
import json
import os
import re
from dataclasses import dataclass

from ..errors import LarkError
from .firewall import libnft
from .firewall.nftverify import Run as Nft  # one nft command (text) -> (rc, JSON output, error)

NFT_CGROUP_ROOT = "/sys/fs/cgroup"  # what nft resolves `socket cgroupv2` paths against
CHAINS = {"sandbox_out": "output", "sandbox_in": "input"}
NAME_RE = re.compile(r"^starter-(\d+)-(\d+)$")
COMMENT_RE = re.compile(r"^lark sandbox starter (\d+) start (\d+) slot (\S+)$")
SLOT_RE = re.compile(r"[A-Za-z0-9_.@-]{1,128}")   # what may stand in a rule's comment (nft text)
MIN_BURST = 65536          # bytes: what the policer lets through at once (64 KiB held TCP at 1.06x of 20 Mbit/s)
BURST_SECONDS = 0.01       # or 10 ms of the rate, where that is more (fast slots)
NFT_FIX = "`lark doctor` says whether this kernel has nft's socket cgroupv2 match"


@dataclass(frozen=True)
class Starter:
    pid: int
    start: int

    @property
    def name(self) -> str:
        return f"starter-{self.pid}-{self.start}"


@dataclass(frozen=True)
class Policer:
    """One policer rule found in the table: its chain, its handle and the starter its comment names."""
    chain: str
    handle: int
    starter: Starter


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


# -- pure: the nft text ------------------------------------------------------------------------------------------
def check_policer(s: Starter, slot: str, mbit: float) -> None:
    """A LarkError unless `slot` may stand in a rule's comment and `mbit` is a limit."""
    if not SLOT_RE.fullmatch(slot):
        raise LarkError(f"slot name {slot!r} is not valid", obj=f"starter pid {s.pid}",
                        fix="slot names are letters, digits and _.@-")
    if mbit <= 0:
        raise LarkError(f"Bandwidth {mbit:g} is not a limit", obj=f"slot {slot}", fix="a positive Mbit/s")


def rate_and_burst(mbit: float) -> tuple[int, int]:
    """The policer's rate and burst in bytes (per second; at once) for a limit of `mbit` Mbit/s."""
    rate = max(1, int(mbit * 1e6 / 8))
    return rate, max(MIN_BURST, int(rate * BURST_SECONDS))


def policer_comment(s: Starter, slot: str) -> str:
    return f"lark sandbox starter {s.pid} start {s.start} slot {slot}"


def table_cmds(table: str) -> str:
    """The table and its two base chains (policy accept: the policers drop, nothing else does)."""
    cmds = [f"add table inet {table}"]
    for chain, hook in CHAINS.items():
        cmds.append(f"add chain inet {table} {chain} {{ type filter hook {hook} priority 0; policy accept; }}")
    return "\n".join(cmds)


def policer_cmds(table: str, s: Starter, slot: str, mbit: float, path: str, level: int) -> str:
    """The two policer rules (one per chain) for the starter's cgroup, `path` as nft names it at `level`."""
    check_policer(s, slot, mbit)
    rate, burst = rate_and_burst(mbit)
    return "\n".join(f'add rule inet {table} {chain} socket cgroupv2 level {level} "{path}" counter '
                     f'limit rate over {rate} bytes/second burst {burst} bytes drop comment '
                     f'"{policer_comment(s, slot)}"' for chain in CHAINS)


def policers_in(objs: list[dict]) -> list[Policer]:
    """The policer rules of a table listing (`nft -j list table`'s "nftables" list), by their comments."""
    found = []
    for obj in objs:
        rule = obj.get("rule") if isinstance(obj, dict) else None
        if not rule:
            continue
        m = COMMENT_RE.match(rule.get("comment", ""))
        if m:
            found.append(Policer(rule["chain"], int(rule["handle"]), Starter(int(m[1]), int(m[2]))))
    return found


def counters_in(objs: list[dict], s: Starter) -> dict[str, int]:
    """Bytes each of the starter's policers counted (chain -> bytes), from a table listing."""
    got: dict[str, int] = {}
    for obj in objs:
        rule = obj.get("rule") if isinstance(obj, dict) else None
        m = COMMENT_RE.match((rule or {}).get("comment", ""))
        if rule and m and Starter(int(m[1]), int(m[2])) == s:
            for e in rule.get("expr", []):
                if isinstance(e, dict) and "counter" in e:
                    got[rule["chain"]] = int(e["counter"]["bytes"])
    return got


def _libnft(cmd: str) -> tuple[int, str, str]:
    """libnft's shared context, loaded at the first command (not when a limiter is made: `lark gc` as a user)."""
    return libnft.get().run(cmd)


def _missing(err: str) -> bool:
    return "No such file" in err or "does not exist" in err


class SandboxPolice:
    """The starters' cgroups under one parent, and their policers in one nft table: made, removed, listed."""

    def __init__(self, cg2: str | None, nft_root: str, cgroup_name: str, table: str, nft: Nft | None = None):
        self.cg2 = cg2            # the cgroup2 mount (None: there is none)
        self.nft_root = nft_root  # what nft resolves `socket cgroupv2` paths against
        self.parent = os.path.join(cg2 or "", cgroup_name)
        self.table = table
        self.nft: Nft = nft or _libnft

    # -- cgroups ---------------------------------------------------------------------------------------------
    def unavailable(self) -> str | None:
        """Why this host cannot police a cgroup's sockets (None: it can)."""
        if not self.cg2:
            return "cgroup v2 is not mounted (no cgroup2 line in /proc/self/mountinfo)"
        if os.path.relpath(self.cg2, self.nft_root).startswith(".."):
            return (f"cgroup v2 is mounted at {self.cg2}, outside {self.nft_root}, where nft resolves "
                    f"`socket cgroupv2` paths")
        return None

    def cgroup_dir(self, s: Starter) -> str:
        return os.path.join(self.parent, s.name)

    def has_cgroup(self, s: Starter) -> bool:
        return os.path.isdir(self.cgroup_dir(s))

    def nft_path(self, s: Starter) -> tuple[str, int]:
        """(the cgroup's path as nft names it, its level in the v2 hierarchy)."""
        path = self.cgroup_dir(s)
        level = len(os.path.relpath(path, self.cg2 or "/").split("/"))
        return os.path.relpath(path, self.nft_root), level

    def join(self, s: Starter) -> str:
        """Make the starter's cgroup and move the starter into it (its later forks follow); returns the path."""
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

    def remove_cgroup(self, s: Starter, errors: list[str]) -> None:
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

    def cgroups(self) -> list[Starter]:
        """The starters that have a cgroup under the parent."""
        try:
            names = os.listdir(self.parent) if self.cg2 else []
        except FileNotFoundError:
            return []
        return [Starter(int(m[1]), int(m[2])) for m in map(NAME_RE.match, sorted(names)) if m]

    def remove_parent(self) -> str | None:
        """`lark gc --purge`: the cgroups' parent (what was done, or why not; None: there was none)."""
        if not self.cg2:
            return None
        try:
            os.rmdir(self.parent)
        except FileNotFoundError:
            return None
        except OSError as e:   # a starter of another larkd (a second test bed) may still be under it
            return f"cgroup {self.parent} (kept: {e.strerror or e})"
        return f"cgroup {self.parent}"

    # -- nft -------------------------------------------------------------------------------------------------
    def _run(self, cmd: str, what: str) -> None:
        rc, _, err = self.nft(cmd)
        if rc != 0:
            raise LarkError(f"nft failed: {err.strip()[:500]}", obj=what, fix=NFT_FIX)

    def _listing(self, missing_ok: bool) -> list[dict]:
        rc, out, err = self.nft(f"list table inet {self.table}")
        if rc != 0:
            if missing_ok and _missing(err):
                return []
            raise LarkError(f"nft list failed: {err.strip()[:300]}", obj=f"nft table inet {self.table}")
        return json.loads(out).get("nftables", []) if out.strip() else []

    def ensure_table(self) -> None:
        self._run(table_cmds(self.table), f"nft table inet {self.table}")

    def policers(self) -> list[Policer]:
        """Every policer in the table (none when the table is not there)."""
        return policers_in(self._listing(missing_ok=True))

    def add_policers(self, s: Starter, slot: str, mbit: float) -> None:
        """Both policers for the starter's cgroup, in one transaction."""
        path, level = self.nft_path(s)
        self._run(policer_cmds(self.table, s, slot, mbit, path, level),
                  f"sandbox policers of starter pid {s.pid} (slot {slot})")

    def delete_policers(self, s: Starter, errors: list[str]) -> None:
        """The starter's policers, each by its handle; what fails goes to `errors`."""
        try:
            found = self.policers()
        except LarkError as e:
            errors.append(str(e))
            return
        for p in found:
            if p.starter == s:
                try:
                    self._run(f"delete rule inet {self.table} {p.chain} handle {p.handle}",
                              f"sandbox rule of starter pid {s.pid}")
                except LarkError as e:
                    errors.append(str(e))

    def counters(self, s: Starter) -> dict[str, int]:
        """Bytes each of the starter's policers counted (chain -> bytes)."""
        return counters_in(self._listing(missing_ok=False), s)

    def delete_table(self) -> str | None:
        """`lark gc --purge`: the table (what was done, or why not; None: there was none)."""
        rc, _, err = self.nft(f"delete table inet {self.table}")
        if rc == 0:
            return f"nft table inet {self.table}"
        if _missing(err):
            return None
        return f"nft table inet {self.table} (incomplete: {err.strip()[:200]})"
