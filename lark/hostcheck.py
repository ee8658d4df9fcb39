"""The platform an execution point runs, as `lark doctor` reports it: HTCondor and Python versions, the firewall
in charge next to Lark's own table, and the resolver jobs will see. Each finding says what Lark does about it
and, when the admin must act, the fix.

Every probe goes through a `Runner` (argv -> (exit code, stdout)) so the detection logic is tested with fakes.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

from .config import Config
from .errors import LarkError
from .names import HOST_IF_PREFIX

Runner = Callable[[list[str]], tuple[int, str]]
NO_JOB_NETWORKING_SINCE = (24, 7, 3)   # the starter knob Lark's starter wrapper relies on
PYTHON_SINCE = (3, 11)                 # tomllib, and what setup.py requires


@dataclass
class Finding:
    what: str
    found: str
    ok: bool
    action: str        # what Lark does about it
    fix: str = ""      # what the admin must do (empty when nothing)


def run_cmd(argv: list[str]) -> tuple[int, str]:
    try:
        cp = subprocess.run(argv, capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return 127, ""
    return cp.returncode, cp.stdout


def htcondor(run: Runner) -> Finding:
    rc, out = run(["condor_version"])
    m = re.search(r"\$CondorVersion:\s*(\d+)\.(\d+)\.(\d+)", out) if rc == 0 else None
    if not m:
        return Finding("HTCondor", "not found", False, "Lark networks HTCondor jobs only",
                       "install HTCondor 24.7.3 or later (24.x from 24.7.3, or 25.x) from the HTCondor repositories")
    ver = tuple(int(x) for x in m.groups())
    found = ".".join(m.groups())
    if ver < NO_JOB_NETWORKING_SINCE:
        return Finding("HTCondor", found, False, "its starter has no NO_JOB_NETWORKING: jobs would share the "
                       "host's network namespace and Lark cannot give them their own",
                       "upgrade HTCondor to 24.7.3 or later (or 25.x)")
    return Finding("HTCondor", found, True, "the starter wrapper turns on NO_JOB_NETWORKING for every job")


def python(version: tuple[int, ...] = tuple(sys.version_info[:3])) -> Finding:
    found = ".".join(str(x) for x in version)
    if tuple(version[:2]) < PYTHON_SINCE:
        return Finding("Python", found, False, "larkd cannot run (needs tomllib and 3.11 syntax)",
                       "install python3.11 (EL9: dnf install python3.11 python3.11-pip) and install Lark with it")
    return Finding("Python", found, True, "supported")


def firewalls(run: Runner, cfg: Config) -> list[Finding]:
    """What else filters the forward path: a drop there drops jobs' traffic whatever Lark's table says
    (every base chain of every table must accept a packet)."""
    out: list[Finding] = []
    rc, state = run(["firewall-cmd", "--state"])
    if rc == 0 and state.strip() == "running":
        sources = [cfg.subnet] + ([f"{cfg.bridge_range} (as CIDR blocks)"] if cfg.bridge_range else [])
        out.append(Finding("firewall", "firewalld running", False,
                           "Lark adds its own table and leaves firewalld's zones alone; firewalld rejects "
                           "forwarded traffic between zones, so jobs' NAT traffic is rejected until their "
                           "addresses are in a zone that forwards",
                           "firewall-cmd --permanent --zone=trusted " +
                           " ".join(f"--add-source={s}" for s in sources) + " && firewall-cmd --reload"))
    rc, text = run(["nft", "-j", "list", "chains"])
    if rc == 0 and text.strip():
        for o in json.loads(text).get("nftables", []):
            c = o.get("chain")
            if not c or c.get("hook") != "forward" or c.get("policy") != "drop":
                continue
            if c.get("table") == cfg.nft_table or c.get("table") == "firewalld":
                continue
            where = f"{c['family']} {c['table']} {c['name']}"
            out.append(Finding("firewall", f"nftables chain {where} (forward, policy drop)", False,
                               "Lark's own table accepts and counts jobs' traffic, but this chain drops it too "
                               "(bridged jobs as well when br_netfilter is loaded)",
                               f"nft insert rule {where} iifname \"{HOST_IF_PREFIX}*\" accept; "
                               f"nft insert rule {where} oifname \"{HOST_IF_PREFIX}*\" accept  "
                               "(Lark filters them itself)"))
    rc, text = run(["iptables-legacy-save", "-t", "filter"])
    if rc == 0 and text.strip():
        drop = re.search(r"^:FORWARD DROP", text, re.M)
        rules = [line for line in text.splitlines() if line.startswith("-A ")]
        if drop or rules:
            fix = (f"iptables-legacy -I FORWARD -i {HOST_IF_PREFIX}+ -j ACCEPT && "
                   f"iptables-legacy -I FORWARD -o {HOST_IF_PREFIX}+ -j ACCEPT" if drop else "")
            action = ("legacy iptables rules run alongside nftables; Lark's nftables table does not see them" +
                      ("; their FORWARD policy DROP drops jobs' traffic" if drop else ", nothing drops jobs"))
            out.append(Finding("firewall", f"iptables-legacy ({len(rules)} rules"
                               f"{', FORWARD policy DROP' if drop else ''})", not drop, action, fix))
    if not out:
        out.append(Finding("firewall", f"only Lark's ({cfg.firewall})", True,
                           "nothing else filters the forward path"))
    return out


def resolver(cfg: Config, which: Callable[[str], str | None] = shutil.which) -> Finding:
    from .kernel.dns import forwarder_status, loopback_nameservers
    from .kernel.sections import DnsSection
    loop = loopback_nameservers(cfg.resolv_conf) + loopback_nameservers(cfg.resolv_conf, 6)
    found = ", ".join(loop) or "no loopback nameserver"
    if loop and cfg.dns_forward and not which("dnsmasq"):
        return Finding("DNS", found, False, "jobs cannot resolve names: the forwarder needs dnsmasq",
                       "apt-get install dnsmasq-base (Debian, Ubuntu) or dnf install dnsmasq (EL9)")
    ok = not loop or cfg.dns_forward
    status = forwarder_status(DnsSection.from_config(cfg))
    return Finding("DNS", found, ok, status, "" if ok else "set dns_forward = true in lark.toml")


def dhcpv6_client(cfg: Config, which: Callable[[str], str | None] = shutil.which) -> list[Finding]:
    """With bridge_ipv6 = "dhcpv6", larkd runs dhcpcd for every bridged/OVS job that wants IPv6."""
    if cfg.bridge_ipv6 != "dhcpv6":
        return []
    if not which("dhcpcd"):
        return [Finding("DHCPv6", "dhcpcd not found", False, "bridged jobs that want IPv6 fail to start",
                        "apt-get install dhcpcd-base (Debian, Ubuntu) or dnf install dhcpcd (EL9); do not enable "
                        "its service")]
    return [Finding("DHCPv6", which("dhcpcd") or "dhcpcd", True, "larkd runs it in each job's netns")]


YAMA_SCOPE = "/proc/sys/kernel/yama/ptrace_scope"


def ptrace_scope(path: str = YAMA_SCOPE) -> Finding:
    """Lark's hooks run as the job's user in the host's namespace and make themselves non-dumpable at once; until
    then another process of that user could trace one (docs/design.md, "Threat model"). yama closes that."""
    try:
        with open(path) as f:
            scope = int(f.read().strip())
    except (OSError, ValueError):
        scope = None
    fix = ("sysctl -w kernel.yama.ptrace_scope=1 (and in /etc/sysctl.d), or USE_PID_NAMESPACES = True in "
           "HTCondor's configuration")
    if scope is None:
        return Finding("ptrace", "no yama in this kernel", False,
                       "hooks make themselves untraceable as they start; a same-uid job may race that start",
                       "USE_PID_NAMESPACES = True in HTCondor's configuration (jobs then cannot see the hooks)")
    if scope == 0:
        return Finding("ptrace", "yama ptrace_scope 0", False,
                       "hooks make themselves untraceable as they start; a same-uid job may race that start", fix)
    return Finding("ptrace", f"yama ptrace_scope {scope}", True, "jobs cannot trace Lark's hooks")


def prepare_job_start(run: Runner, path: str = YAMA_SCOPE) -> Finding:
    """Started by the setgid launcher (`lark install-hook`), the PREPARE_JOB hook is never traceable by the job's
    user, whatever yama says; a plain Python hook's start is, unless yama or pid namespaces close it."""
    from .hook_launcher import FIX, launcher_problem
    keyword = condor_param(run, "STARTER_JOB_HOOK_KEYWORD")
    hook = condor_param(run, f"{keyword}_HOOK_PREPARE_JOB") if keyword else None
    if hook is None:
        return ptrace_scope(path)
    problem = launcher_problem(hook)
    if problem is None:
        return Finding("ptrace", f"PREPARE_JOB hook {hook} is the setgid launcher", True,
                       "the hook is never dumpable: no process of the job's user can trace it")
    yama = ptrace_scope(path)
    return Finding("ptrace", f"{yama.found}; PREPARE_JOB hook {hook}: {problem}", yama.ok, yama.action,
                   f"{FIX}, then LARK_HOOK_PREPARE_JOB = the launcher (the shipped 50-lark.conf)" +
                   (f"; or {yama.fix}" if yama.fix else ""))


def net_namespaces(path: str | None = None) -> Finding:
    """OSG and EGI advise `user.max_net_namespaces = 0` on worker nodes: that stops root too, so no job starts."""
    from .kernel.netns import net_namespace_limit
    limit = net_namespace_limit(path)
    fix = ("sysctl -w user.max_net_namespaces=<more than the slots> (and in /etc/sysctl.d); to stop unprivileged "
           "user namespaces set user.max_user_namespaces = 0 instead")
    if limit is None:
        return Finding("netns", "user.max_net_namespaces unreadable", True, "no limit known")
    if limit == 0:
        return Finding("netns", "user.max_net_namespaces = 0", False,
                       "no job can start: HTCondor's starter cannot make the job's network namespace (ENOSPC), and "
                       "PREPARE_JOB holds every job saying so", fix)
    return Finding("netns", f"user.max_net_namespaces = {limit}", True, "one per job is available")


def condor_param(run: Runner, name: str) -> str | None:
    """One knob of HTCondor's configuration as condor_config_val prints it; None when it is not defined."""
    rc, out = run(["condor_config_val", name])
    return out.strip() if rc == 0 and out.strip() else None


def job_exit_hook(run: Runner) -> Finding:
    """Any JOB_EXIT hook breaks file-transfer jobs on HTCondor 24.x/25.x: the starter exits as soon as the hook
    returns, which is during the output transfer, and the job is evicted and run again without end."""
    hooks = []
    for keyword_knob in ("STARTER_JOB_HOOK_KEYWORD", "STARTER_DEFAULT_JOB_HOOK_KEYWORD"):
        keyword = condor_param(run, keyword_knob)
        hook = condor_param(run, f"{keyword}_HOOK_JOB_EXIT") if keyword else None
        if hook:
            hooks.append(f"{keyword}_HOOK_JOB_EXIT = {hook}")
    if not hooks:
        return Finding("JOB_EXIT", "no JOB_EXIT hook", True, "lark-job-wrapper holds the exit barrier")
    return Finding("JOB_EXIT", ", ".join(hooks), False,
                   "the starter exits as soon as a JOB_EXIT hook returns, during the job's output transfer: "
                   "file-transfer jobs are evicted and restarted without end",
                   "remove " + ", ".join(h.partition(" =")[0] for h in hooks) +
                   " from the configuration (Lark's barrier is in lark-job-wrapper), then condor_reconfig")


def condor_true(value: str | None) -> bool:
    """A boolean knob as HTCondor spells it (`True`, `true`, `1`, `yes`); undefined is false."""
    return (value or "").strip().lower() in ("true", "t", "yes", "y", "1")


STARTER_WRAPPER = "lark-starter"  # the STARTER that turns on NO_JOB_NETWORKING for every job (starter_wrapper.py)


def pid_namespaces(run: Runner) -> Finding:
    """HTCondor's CreateProcessForkit::fork (daemon_core.cpp, 24.7.3 to 25.x and master of 2026-08) makes its pipe
    only for CLONE_NEWPID but writes both pids into it after every clone: with NO_JOB_NETWORKING and no PID
    namespace the starter writes 8 bytes into whatever its uninitialised fd is, and dies ("Unable to write into
    pipe.") when that is no writable fd. USE_PID_NAMESPACES gives the job's clone its pipe (docs/admin.md, "Known
    HTCondor defects"); condor_ssh_to_job's sshd never gets a PID namespace, so it keeps the defect."""
    starter = condor_param(run, "STARTER") or ""
    nojn = condor_true(condor_param(run, "NO_JOB_NETWORKING")) or os.path.basename(starter) == STARTER_WRAPPER
    pidns = condor_true(condor_param(run, "USE_PID_NAMESPACES"))
    sshd = "condor_ssh_to_job's sshd is still cloned without one (HTCondor never gives it a PID namespace)"
    if not nojn:
        return Finding("pidns", f"no NO_JOB_NETWORKING (STARTER = {starter or 'not set'})", True,
                       "the starter clones no job into a namespace, so its pipe defect is not reached")
    if pidns:
        return Finding("pidns", "USE_PID_NAMESPACES = True with NO_JOB_NETWORKING", True,
                       "each job is cloned with CLONE_NEWPID, so the starter writes the job's pids into a real pipe "
                       f"and jobs cannot see Lark's hooks (condor_ssh_to_job sessions still can); {sshd}")
    return Finding("pidns", "NO_JOB_NETWORKING without USE_PID_NAMESPACES", False,
                   "HTCondor's starter clones each job with CLONE_NEWNET alone and then writes 8 bytes of pids into "
                   "an uninitialised file descriptor (CreateProcessForkit::fork): into whatever file it is, or the "
                   "starter dies with \"Unable to write into pipe.\" and the job is restarted",
                   "none complete in configuration (docs/admin.md, \"Known HTCondor defects\"): the crashes seen were "
                   "at condor_ssh_to_job's sshd, which only ENABLE_SSH_TO_JOB = False avoids; USE_PID_NAMESPACES = "
                   "True protects the job's own clone, but lark-job-wrapper as the namespace's init does not yet end "
                   "on a soft kill outside the job's run (a held job waits for the hard kill)")


# Plugins that make no connection (data: URLs): they may run as HTCondor runs them.
NO_NETWORK_PLUGINS = ("data_plugin",)


def unwrapped_plugins(run: Runner) -> list[str]:
    """FILETRANSFER_PLUGINS entries that would move data with this machine's network: neither Lark's wrapper
    ($(LARK_LIBEXEC)/transfer/NAME, made by `lark install-hook`) nor a plugin that makes no connection."""
    listed = condor_param(run, "FILETRANSFER_PLUGINS")
    if listed is None:    # HTCondor's default list: its own plugins, none of them wrapped
        return ["curl_plugin (HTCondor's default FILETRANSFER_PLUGINS)"]
    wrapped_dir = os.path.join(condor_param(run, "LARK_LIBEXEC") or "/opt/lark/libexec", "transfer")
    return [p for p in listed.replace(",", " ").split()
            if os.path.dirname(p) != wrapped_dir and os.path.basename(p) not in NO_NETWORK_PLUGINS]


def sandbox_transfer(run: Runner) -> str:
    """What LARK_SANDBOX_LIMIT does here: the sandbox (starter <-> shadow) limited to the slot's Bandwidth when it is
    on (its default), lark-starter is the STARTER (it asks larkd) and cgroup v2 is mounted
    (lark/kernel/sandbox_police.py)."""
    from .kernel.sandbox_police import cgroup2_mount, job_cgroups_follow_the_starter
    counted = "HTCondor counts it in BytesRecvd / BytesSent"
    if not condor_true(condor_param(run, "LARK_SANDBOX_LIMIT") or "true"):
        return f"sandbox transfer to and from the shadow not limited (LARK_SANDBOX_LIMIT = false; {counted})"
    if os.path.basename(condor_param(run, "STARTER") or "") != STARTER_WRAPPER:
        return f"sandbox transfer to and from the shadow not limited (STARTER is not {STARTER_WRAPPER}; {counted})"
    if cgroup2_mount() is None:
        return f"sandbox transfer to and from the shadow not limited (no cgroup v2 mount; {counted})"
    unsafe = job_cgroups_follow_the_starter()
    if unsafe:
        return f"sandbox transfer to and from the shadow not limited ({unsafe}; {counted})"
    return f"sandbox transfer to and from the shadow limited to the slot's Bandwidth (LARK_SANDBOX_LIMIT; {counted})"


def file_transfer(run: Runner) -> Finding:
    """What of a job's data HTCondor moves outside the job's network (docs/design.md, "File transfer")."""
    url = (condor_param(run, "ENABLE_URL_TRANSFERS") or "true").lower() not in ("false", "0", "no")
    gaps = [sandbox_transfer(run)]
    unwrapped = unwrapped_plugins(run) if url else []
    if unwrapped:
        gaps.append(f"URL transfers by plugins not run in the job's network: {', '.join(unwrapped)}")
    return Finding("transfer", "; ".join(gaps), not unwrapped,
                   "run by the starter in this machine's network namespace, not the job's: not in its Network* "
                   "figures, not filtered, and limited to the job's Bandwidth only as this line says (URL transfers "
                   "by Lark's wrapped plugins run in the job's network); submitters' own plugins are refused at submit "
                   "(55-lark-access-point.conf) and here (`plugins` line)",
                   "list only $(LARK_LIBEXEC)/transfer/NAME plugins (lark install-hook --transfer-plugins) and "
                   "data_plugin in FILETRANSFER_PLUGINS, as the shipped 50-lark.conf does, or ENABLE_URL_TRANSFERS "
                   "= False (jobs with URL inputs or outputs then fail)" if unwrapped else "")


def own_plugins(run: Runner) -> Finding:
    """Whether this EP keeps a job's own transfer plugin (TransferPlugins) from running with this machine's network:
    START refuses such jobs (50-lark.conf's LARK_START_NO_OWN_PLUGINS), and HTCondor 25.11+'s
    STARTER_DISABLE_USER_SUPPLIED_TRANSFER_PLUGINS makes the starter refuse to run one. larkd's pre-flight also
    holds such a job before it starts (lark/policy/transfers.py), too late for an input plugin on its own."""
    start = condor_param(run, "START") or ""
    by_start = "TransferPlugins" in start
    knob = condor_param(run, "STARTER_DISABLE_USER_SUPPLIED_TRANSFER_PLUGINS")
    by_starter = condor_true(knob) or (knob or "").strip() == "2"
    found = ("START refuses TransferPlugins" if by_start else "START does not look at TransferPlugins") + "; " + \
        (f"STARTER_DISABLE_USER_SUPPLIED_TRANSFER_PLUGINS = {knob}" if knob else
         "STARTER_DISABLE_USER_SUPPLIED_TRANSFER_PLUGINS unset")
    if by_start or by_starter:
        return Finding("plugins", found, True,
                       "a job's own transfer plugin never runs here: " +
                       ("such a job is never matched to this EP" if by_start else
                        "the starter refuses it (HTCondor 25.11+; the job is evicted and tried elsewhere)"))
    return Finding("plugins", found, False,
                   "a job that reaches this EP with its own transfer plugin (TransferPlugins; from a schedd without "
                   "Lark's SUBMIT_REQUIREMENT_LarkOwnPlugins) has that code run by the starter with this machine's "
                   "network, before Lark's pre-flight can hold it",
                   "keep 50-lark.conf's START = ($(START)) && $(LARK_START_NO_OWN_PLUGINS) (a later START must keep "
                   "that clause) and, on HTCondor 25.11+, STARTER_DISABLE_USER_SUPPLIED_TRANSFER_PLUGINS = true; "
                   "then condor_reconfig")


def uplink_speed(ifname: str) -> int | None:
    """The uplink's negotiated speed, None when the driver reports none or there is no such interface."""
    from .errors import LarkError
    from .kernel.linkspeed import link_speed_mbit
    try:
        return link_speed_mbit(ifname)
    except (LarkError, OSError):
        return None


def bandwidth_capacity(cfg: Config, speed_of: Callable[[str], int | None] = uplink_speed) -> Finding:
    """What the fair share of jobs without a reservation divides when their slot ad has no Bandwidth inventory
    (lark/policy/engine.py, in the same order): bandwidth_mbit, else the uplink's link speed."""
    if cfg.default_bandwidth != "fair":
        return Finding("bandwidth", f"default_bandwidth = {cfg.default_bandwidth}", True,
                       "jobs without a reservation run unlimited, as configured" if cfg.default_bandwidth ==
                       "unlimited" else "jobs without a reservation get this limit")
    if cfg.bandwidth_mbit > 0:
        return Finding("bandwidth", f"bandwidth_mbit = {cfg.bandwidth_mbit}", True,
                       "jobs without a reservation share it (or the slot ad's Bandwidth inventory)")
    speed = speed_of(cfg.uplink)
    if speed:
        return Finding("bandwidth", f"uplink {cfg.uplink} at {speed} Mbit/s", True,
                       "jobs without a reservation share it (or the slot ad's Bandwidth inventory)")
    return Finding("bandwidth", f"no capacity known (uplink {cfg.uplink} reports no speed, bandwidth_mbit unset)",
                   False, "a job without request_bandwidth on a slot without a Bandwidth inventory is held "
                   "(never run unlimited unless configured)",
                   "set LARK_BANDWIDTH_MBIT to the uplink's capacity in Mbit/s (detect-bandwidth then reports it "
                   "to MACHINE_RESOURCE_INVENTORY_Bandwidth too), or LARK_DEFAULT_BANDWIDTH = unlimited")


def process_identity(fallback: Callable[[], str] | None = None, kernel: str | None = None) -> Finding:
    """How larkd tells a requesting process from a later one with the same pid (docs/design.md, threat model)."""
    from .daemon.peercred import identity_fallback
    used = (fallback or identity_fallback)()
    kernel = kernel or os.uname().release
    if not used:
        return Finding("identity", f"SO_PEERPIDFD available (kernel {kernel})", True,
                       "larkd holds a pidfd of each requesting process and checks it before acting on its job; "
                       "starters are pinned by their start time")
    return Finding("identity", f"no SO_PEERPIDFD (kernel {kernel}; it needs Linux 6.5)", True,
                   f"fallback: {used} before every request acts on a job; starters are pinned the same way. "
                   "A pid reused between connect and accept is not caught (it takes a pid wrap-around)")


def docker_runtime(run: Runner, cfg: Config) -> list[Finding]:
    """Docker universe (DOCKER set): whether the dockerd larkd asks (LARK_DOCKER_HOST) has Lark's OCI runtime, which
    builds a docker job's network (lark-oci-runtime; docs/admin.md "Container jobs")."""
    if not condor_param(run, "DOCKER"):
        return []
    from .daemon.docker_setup import runtimes
    fix = ("register it: \"runtimes\": {\"lark\": {\"path\": \"/opt/lark/bin/lark-oci-runtime\"}} in "
           "/etc/docker/daemon.json (or dockerd --add-runtime lark=...), and restart dockerd")
    try:
        known = runtimes(cfg.docker_host)
    except LarkError as e:
        return [Finding("docker", f"dockerd at {cfg.docker_host} not reachable", False,
                        f"docker jobs are refused (larkd cannot tell which job a container is: {e.what})",
                        "set LARK_DOCKER_HOST to the dockerd that DOCKER uses, and start it")]
    if "lark" not in known:
        return [Finding("docker", f"dockerd has no 'lark' runtime ({', '.join(sorted(known)) or 'none'})", False,
                        "docker jobs are held (lark-docker creates them with --runtime=lark)", fix)]
    path = known["lark"].get("path", "?") if isinstance(known["lark"], dict) else "?"
    return [Finding("docker", f"dockerd runtime lark = {path}", True,
                    "docker jobs get their Lark network before they start")]


def check(cfg: Config, run: Runner = run_cmd) -> list[Finding]:
    return [htcondor(run), python(), *firewalls(run, cfg), resolver(cfg), *dhcpv6_client(cfg), prepare_job_start(run),
            net_namespaces(), pid_namespaces(run), job_exit_hook(run), file_transfer(run), own_plugins(run),
            bandwidth_capacity(cfg), *docker_runtime(run, cfg),
            process_identity()]


def report(findings: list[Finding]) -> tuple[str, int]:
    """Text for `lark doctor`, and how many findings need the admin."""
    lines = ["", f"{'platform':<10} {'status':<7} found / what Lark does / fix"]
    bad = 0
    for f in findings:
        bad += not f.ok
        lines.append(f"{f.what:<10} {'ok' if f.ok else 'ACTION':<7} {f.found}: {f.action}")
        if f.fix:
            lines.append(f"{'':<18} fix: {f.fix}")
    return "\n".join(lines), bad
