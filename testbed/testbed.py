#!/usr/bin/env python3
"""The Lark HTCondor testbed: a real one-machine pool (Debian sid's condor + minicondor 25.14.x) in a chroot,
run as an execution point inside its own network namespace with an uplink to a "world" namespace that holds
test servers (HTTP files on :8000, byte sink on :7001, iperf3 on :5201). Nothing outside its own namespaces
and directory is touched.

  testbed.py build     debootstrap + condor into the cache (reused; a fresh machine builds it in ~1 min)
  testbed.py install   copy this working tree's Lark into the root (venv with the distro's htcondor2)
  testbed.py start     namespaces, mounts, world servers, condor_master (which runs larkd; pivoted into the root in
                       a mount namespace of its own, not chrooted: in_own_root); waits for a slot
  testbed.py dockerd   (opt-in, after start) dockerd for docker-universe jobs, in the EP's netns and root
  testbed.py stop      everything started, by PID; gc; unmount; namespaces removed. Safe to repeat
  testbed.py status
Standard library only: it runs under any python3.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

log = logging.getLogger("testbed")
REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("LARK_TESTBED_DIR", "/var/cache/lark-testbed"))
ROOT = CACHE / "root"
STATE = CACHE / "state.json"
BUILD_STAMP = ROOT / ".lark-testbed-built"
MIRROR = os.environ.get("LARK_TESTBED_MIRROR", "http://deb.debian.org/debian")
PACKAGES = ["condor", "minicondor", "nftables", "iproute2", "util-linux", "procps", "python3-venv", "python3-pip",
            "iptables", "ca-certificates", "openvswitch-switch", "dnsmasq-base", "openssh-server",
            "openssh-client", "apptainer", "busybox-static", "docker.io", "docker-cli"]
# Added after the first release of the testbed: a cached root without them gets them on its next build().
LATER_PACKAGES = {"usr/bin/ovs-vsctl": "openvswitch-switch", "usr/sbin/dnsmasq": "dnsmasq-base",
                  "usr/sbin/sshd": "openssh-server", "usr/bin/ssh": "openssh-client",  # condor_ssh_to_job
                  "usr/bin/gcc": "gcc", "usr/include/stdio.h": "libc6-dev",  # lark install-hook compiles
                  # Container jobs (tests/e2e/test_condor_apptainer.py): apptainer, and busybox for its test image
                  "usr/bin/apptainer": "apptainer", "usr/bin/busybox": "busybox-static",
                  # Docker universe (tests/e2e/test_condor_docker.py; dockerd only when start_dockerd() is called)
                  "usr/sbin/dockerd": "docker.io", "usr/bin/docker": "docker-cli"}
APT = ["apt-get", "-o", "Acquire::Check-Valid-Until=false", "-o", "APT::Sandbox::User=root"]
HOST_NS, WORLD_NS = "lark-tb-host", "lark-tb-world"
HOST_IP, WORLD_IP = "198.51.100.2", "198.51.100.1"
USERS = ["alice", "bob", "carol"]
MOUNTS = [("proc", "proc", ["-t", "proc", "proc"]), ("sys", "sys", ["--rbind", "/sys"]),
          ("dev", "dev", ["--rbind", "/dev"])]
# Who may use which accounting group (condor_config.d/56-lark-acct-groups.conf): exactly the groups the e2e tests
# submit with, each for the users that submit with it (tests/e2e/test_condor_acctgroup.py, test_condor_report.py).
ACCT_GROUP_MAP_PATH = "/etc/condor/lark-acct-groups.map"
ACCT_GROUP_MAP = ("* alice cms,group_down,group_m\n"
                  "* bob group_up\n"
                  "* carol group_down,group_up\n")


def run(argv: list[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
    log.debug("run %s", argv)
    cp = subprocess.run(argv, capture_output=True, text=True, **kw)
    if check and cp.returncode != 0:
        raise SystemExit(f"testbed: {' '.join(argv[:6])} failed ({cp.returncode}): {cp.stderr.strip()[-2000:]}")
    return cp


def in_host(argv: list[str]) -> list[str]:
    return ["nsenter", f"--net=/run/netns/{HOST_NS}", *argv]


def in_root(argv: list[str], user: str | None = None) -> list[str]:
    """A command inside the chroot, in the EP's network namespace."""
    pre = ["env", "-i", "PATH=/usr/local/bin:/usr/bin:/usr/sbin:/bin:/sbin", "LANG=C.UTF-8"]
    if user:
        pre += [f"HOME=/home/{user}", f"USER={user}"]
        return in_host(["chroot", f"--userspec={user}:{user}", str(ROOT), *pre, *argv])
    return in_host(["chroot", str(ROOT), *pre, "HOME=/root", *argv])


def in_own_root(argv: list[str]) -> list[str]:
    """A command run as in_root, but in a mount namespace of its own whose root *is* ROOT (pivot_root, as unshare
    and systemd-nspawn do), not a chroot: the kernel refuses user namespaces to a chrooted process (EPERM), and
    Apptainer's unprivileged mode (Debian ships no setuid starter) needs them. ROOT/run/netns is a shared mount
    (start()), so the netns names larkd makes inside are seen from the host as before."""
    pre = ["env", "-i", "PATH=/usr/local/bin:/usr/bin:/usr/sbin:/bin:/sbin", "LANG=C.UTF-8", "HOME=/root"]
    script = ('root=$0; inner=$1; shift; cd "$root" && mkdir -p .oldroot && pivot_root . .oldroot && '
              'exec /bin/sh -c "$inner" sh "$@"')
    # The old root's mounts are copies of the host's, some shared (/run/netns): made slaves first, so that
    # unmounting them here does not unmount the host's own (every `ip netns` name on the machine).
    inner = 'mount --make-rslave /.oldroot && umount -l /.oldroot && rmdir /.oldroot && cd / && exec "$@"'
    return in_host(["unshare", "--mount", "--propagation", "unchanged", "sh", "-c", script, str(ROOT), inner,
                    *pre, *argv])


def prepare(who: str) -> None:
    """For scripts that drive the pool (demo, benchmarks): root, then the cached root with this tree's Lark."""
    if os.geteuid() != 0:
        raise SystemExit(f"{who}: run as root: the testbed lives in its own network namespaces")
    build()
    install()


def submit_as(user: str, name: str, body: str) -> int:
    """Write `body` as /home/<user>/<name>/job.sub in the pool and condor_submit it as that user; the cluster."""
    d = ROOT / "home" / user / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "job.sub").write_text(body)
    run(["chroot", str(ROOT), "chown", "-R", f"{user}:{user}", f"/home/{user}/{name}"])
    cp = run(in_root(["sh", "-c", 'cd "$0" && exec condor_submit -terse job.sub', f"/home/{user}/{name}"],
                     user=user), check=False)
    if cp.returncode != 0:
        raise RuntimeError(f"condor_submit as {user} in {name} failed: {cp.stderr.strip()}")
    return int(cp.stdout.split(".")[0])


def load_state(path: Path = STATE) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def save_state(s: dict, path: Path = STATE) -> None:
    """Written whole and renamed into place: a crash mid-write leaves the previous state (pool.py shares it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(s))
    tmp.rename(path)


# -- build --------------------------------------------------------------------------------------------------
def _apt_install(root: Path, packages: list[str]) -> None:
    env = {"DEBIAN_FRONTEND": "noninteractive", "PATH": "/usr/bin:/usr/sbin:/bin:/sbin"}
    # No init system in the chroot: keep package scripts from starting services (OVS, dnsmasq) there.
    policy = root / "usr/sbin/policy-rc.d"
    policy.write_text("#!/bin/sh\nexit 101\n")
    policy.chmod(0o755)
    # apt needs the host's resolver; the installed testbed keeps its own (empty) one.
    resolv = root / "etc/resolv.conf"
    saved = resolv.read_text() if resolv.exists() and not resolv.is_symlink() else None
    if resolv.is_symlink():
        resolv.unlink()
    resolv.write_text(Path("/etc/resolv.conf").read_text())
    run(["mount", "-t", "proc", "proc", str(root / "proc")])
    try:
        run(["chroot", str(root), *APT, "update", "-q"], env=env)
        run(["chroot", str(root), *APT, "install", "-y", "-q", "--no-install-recommends", *packages], env=env)
    finally:
        run(["umount", str(root / "proc")], check=False)
        if saved is not None:
            resolv.write_text(saved)


def build() -> None:
    if BUILD_STAMP.exists():
        missing = [pkg for path, pkg in LATER_PACKAGES.items() if not (ROOT / path).exists()]
        if missing:
            if load_state().get("master_pid"):
                stop()
            log.info("adding %s to the cached testbed root", ", ".join(missing))
            _apt_install(ROOT, missing)
        log.info("testbed root cached at %s", ROOT)
        return
    tmp = CACHE / "root.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    CACHE.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    log.info("debootstrap sid into %s", tmp)
    run(["debootstrap", "--variant=minbase", "sid", str(tmp), MIRROR])
    _apt_install(tmp, PACKAGES)
    for u in USERS:
        run(["chroot", str(tmp), "useradd", "-m", "-s", "/bin/sh", u])
    tmp.rename(ROOT)
    BUILD_STAMP.write_text(time.strftime("%F %T"))
    log.info("testbed root built in %.0f s", time.time() - t0)


# -- install Lark -------------------------------------------------------------------------------------------
def runtime_requirements() -> list[str]:
    """What Lark needs at run time on an EP (setup.py's install_requires, no extras), but HTCondor's bindings:
    the root has them from its condor package, matching the pool."""
    import importlib.metadata
    return [r.split(";")[0].strip() for r in importlib.metadata.requires("htcondor-lark") or []
            if "extra ==" not in r and not r.startswith("htcondor")]


def extra_requirements(extra: str) -> list[str]:
    """An extra of setup.py (e.g. `report`: matplotlib for `lark report --html`)."""
    import importlib.metadata
    return [r.split(";")[0].strip() for r in importlib.metadata.requires("htcondor-lark") or []
            if re.search(rf"extra\s*==\s*['\"]{re.escape(extra)}['\"]", r)]


def _root_wheel_tags(env: dict) -> list[str]:
    """pip download options for wheels the root's Python can install (it is newer than the host's, and
    compiled wheels such as matplotlib's must match it): its version, ABI and glibc's manylinux tags."""
    out = run(["chroot", str(ROOT), "python3", "-c", "import platform, sys; "
               "print(f'{sys.version_info[0]}{sys.version_info[1]}', platform.libc_ver()[1], platform.machine())"],
              env=env).stdout.split()
    ver, glibc, arch = out[0], int(out[1].split(".")[1]), out[2]
    tags = ["--python-version", ver, "--implementation", "cp", "--abi", f"cp{ver}", "--abi", "abi3",
            "--abi", "none", "--platform", f"manylinux2014_{arch}"]
    for minor in range(17, glibc + 1):
        tags += ["--platform", f"manylinux_2_{minor}_{arch}"]
    return tags


def install() -> None:
    if not BUILD_STAMP.exists():
        raise SystemExit("testbed: not built; run `testbed.py build` first")
    src = ROOT / "opt/lark-src"
    shutil.rmtree(src, ignore_errors=True)
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(".git", ".venv", "__pycache__", "*.egg-info",
                                                              ".pytest_cache", ".hypothesis", "build"))
    env = {"PATH": "/usr/local/bin:/usr/bin:/usr/sbin:/bin:/sbin", "HOME": "/root"}
    if not (ROOT / "opt/lark/bin/python").exists():
        # System site-packages: htcondor2/classad2 come from Debian's condor package, matching the pool.
        # pyroute2 (pure Python) is fetched by the host's pip, whose network and CA setup already work.
        wheels = ROOT / "opt/lark-wheels"
        wheels.mkdir(parents=True, exist_ok=True)
        run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(wheels),
             "pyroute2>=0.9,<0.10"])
        run(["chroot", str(ROOT), "python3", "-m", "venv", "--system-site-packages", "/opt/lark"], env=env)
        run(["chroot", str(ROOT), "/opt/lark/bin/pip", "install", "-q", "--no-index", "--find-links",
             "/opt/lark-wheels", "pyroute2"], env=env)
    # Run-time dependencies added since the venv was made (metrics, report tables, OVSDB...), as the checkout
    # declares them, so a new one in setup.py cannot be forgotten here. All are pure Python: the host's pip
    # fetches them for the root's newer Python.
    needs = runtime_requirements()
    names = [re.match(r"[A-Za-z0-9_.-]+", r).group(0) for r in needs]
    if needs and run(["chroot", str(ROOT), "/opt/lark/bin/python", "-c",
                      "import importlib.metadata as m, sys; [m.version(n) for n in sys.argv[1:]]", *names],
                     check=False, env=env).returncode != 0:
        run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "-d",
             str(ROOT / "opt/lark-wheels"), *needs])
        run(["chroot", str(ROOT), "/opt/lark/bin/pip", "install", "-q", "--no-index", "--find-links",
             "/opt/lark-wheels", *needs], env=env)
    # The `report` extra too, so `lark report --html` runs in the root as on a submit host. Its wheels are
    # compiled (matplotlib, numpy, pillow...): fetched for the root's Python and glibc.
    report = extra_requirements("report")
    if report and run(["chroot", str(ROOT), "/opt/lark/bin/python", "-c", "import matplotlib"],
                      check=False, env=env).returncode != 0:
        run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", *_root_wheel_tags(env), "-d",
             str(ROOT / "opt/lark-wheels"), *report])
        run(["chroot", str(ROOT), "/opt/lark/bin/pip", "install", "-q", "--no-index", "--find-links",
             "/opt/lark-wheels", *report], env=env)
    # The wheel is built by the host's pip (setuptools is there); the chroot installs it offline.
    wheels = ROOT / "opt/lark-wheels"
    for old in [*wheels.glob("lark-*.whl"), *wheels.glob("htcondor_lark-*.whl")]:
        old.unlink()
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels),
         str(src)])
    wheel = next(wheels.glob("htcondor_lark-*.whl")).name
    # The distribution was called "lark" before: drop that one, so one package owns lark/ in the venv.
    run(["chroot", str(ROOT), "/opt/lark/bin/pip", "uninstall", "-q", "-y", "lark"], env=env, check=False)
    run(["chroot", str(ROOT), "/opt/lark/bin/pip", "install", "-q", "--no-deps", "--force-reinstall",
         f"/opt/lark-wheels/{wheel}"], env=env)
    for name in ("larkd", "lark", "lark-job-wrapper", "lark-starter", "lark-hook", "lark-prepare-job"):
        link = ROOT / "usr/local/bin" / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(f"/opt/lark/bin/{name}")
    # The PREPARE_JOB hook's setgid launcher (/opt/lark/libexec/lark-prepare-job, as 50-lark.conf names it).
    run(["chroot", str(ROOT), "/opt/lark/bin/lark", "install-hook"], env=env)
    confd = ROOT / "etc/condor/config.d"
    for f in (REPO / "condor_config.d").iterdir():
        # *.example files are for other hosts (HTCondor would read them: its exclude list has no .example).
        if f.suffix == ".example":
            (confd / f.name).unlink(missing_ok=True)
            continue
        shutil.copy(f, confd / f.name)
    (confd / "90-lark-testbed.conf").write_text(
        "# Testbed only: a chroot cannot unshare the mount namespace for MOUNT_UNDER_SCRATCH (EINVAL).\n"
        "MOUNT_UNDER_SCRATCH =\n"
        "NETWORK_INTERFACE = 127.0.0.1\n"
        "# The EP namespace has no DNS server: name lookups would each wait for a timeout.\n"
        "NO_DNS = True\nDEFAULT_DOMAIN_NAME = lark.test\n"
        "STARTER_UPDATE_INTERVAL = 5\n"
        "STARTER_INITIAL_UPDATE_INTERVAL = 2\n"
        "# No docker universe unless a test turns it on (test_condor_docker.py sets DOCKER and starts dockerd)\n"
        "DOCKER =\n"
        "# Lark's transient holds (larkd down) are released sooner than on a real access point, for the tests\n"
        "PERIODIC_EXPR_INTERVAL = 5\nLARK_RELEASE_AFTER = 5\n"
        "NUM_CPUS = 16\nMEMORY = 16384\n"
        "# Hooks run as the job user and must find the larkd socket\n"
        "LARKD_LOG = $(LOG)/LarkdLog\n"
        "# Node figures in the machine ad (60-lark-startd-cron.conf) refreshed often enough for tests\n"
        "STARTD_CRON_LARK_PERIOD = 5s\n"
        "# larkd's own knobs (docs/admin.md)\n"
        "LARK_AD_SOURCE = startd\nLARK_POLL_INTERVAL = 1.0\n"
        "LARK_UPLINK = up0\nLARK_SUBNET = 10.213.0.0/24\nLARK_BANDWIDTH_MBIT = 1000\n"
        "# Users claim only their own accounting groups (56-lark-acct-groups.conf)\n"
        f"LARK_ACCT_GROUP_MAP = {ACCT_GROUP_MAP_PATH}\n")
    (ROOT / ACCT_GROUP_MAP_PATH.lstrip("/")).write_text(ACCT_GROUP_MAP)
    (ROOT / "etc/hosts").write_text(f"127.0.0.1 localhost {os.uname().nodename}\n")
    (ROOT / "etc/resolv.conf").unlink(missing_ok=True)
    (ROOT / "etc/resolv.conf").write_text("# testbed: no resolver in the EP namespace\n")
    # Configuration is HTCondor's (the LARK_* knobs above); a lark.toml left by an older install would be
    # read too (deprecated), so it goes.
    (ROOT / "etc/lark/lark.toml").unlink(missing_ok=True)
    log.info("Lark installed into the testbed from %s", REPO)


# -- start / stop -------------------------------------------------------------------------------------------
def make_ep_namespaces(host_ns: str, world_ns: str) -> None:
    """An execution point's netns with uplink `up0` (HOST_IP) to a world netns (`w0`, WORLD_IP, its gateway).

    Shared by this testbed and the integration tests' fake host (tests/helpers/fakehost.py).
    """
    run(["ip", "netns", "add", host_ns])
    run(["ip", "netns", "add", world_ns])
    run(["ip", "link", "add", "name", "up0", "netns", host_ns, "type", "veth", "peer", "name", "w0", "netns",
         world_ns])
    for ns, dev, ip in ((host_ns, "up0", HOST_IP), (world_ns, "w0", WORLD_IP)):
        run(["ip", "-n", ns, "link", "set", "lo", "up"])
        run(["ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", dev])
        run(["ip", "-n", ns, "link", "set", dev, "up"])
    run(["ip", "-n", host_ns, "route", "add", "default", "via", WORLD_IP])


def start() -> None:
    if load_state().get("master_pid"):
        stop()
    make_ep_namespaces(HOST_NS, WORLD_NS)
    state = {"mounts": []}
    save_state(state)
    # ROOT as a mount point of its own, for condor_master to pivot into (in_own_root; pivot_root refuses a shared
    # one), and its /run/netns shared, so that larkd's netns names made in there are seen from the host too.
    netns_dir = ROOT / "run/netns"
    netns_dir.mkdir(parents=True, exist_ok=True)
    for target, propagation in ((ROOT, "--make-private"), (netns_dir, "--make-shared")):
        run(["mount", "--bind", str(target), str(target)])
        state["mounts"].append(str(target))
        save_state(state)
        run(["mount", propagation, str(target)])
    for _, sub, args in MOUNTS:
        target = ROOT / sub
        run(["mount", *args, str(target)])
        if "--rbind" in args:
            run(["mount", "--make-rslave", str(target)])
        state["mounts"].append(str(target))
        save_state(state)
    www = CACHE / "www"
    www.mkdir(exist_ok=True)
    for name, size in (("10M.bin", 10_000_000), ("50M.bin", 50_000_000)):
        f = www / name
        if not f.exists() or f.stat().st_size != size:
            f.write_bytes(os.urandom(size))
    world_log = open(CACHE / "world.log", "a")
    # HTTP files on :8000, who-am-I on :7000 and a byte sink on :7001 (uploads), as on the fake EP.
    http = subprocess.Popen(["nsenter", f"--net=/run/netns/{WORLD_NS}", sys.executable,
                             str(REPO / "tests/helpers/worldserver.py"), "--log-requests", str(www)], stdout=world_log,
                            stderr=world_log)
    state["world_pids"] = [http.pid]
    if shutil.which("iperf3"):
        iperf = subprocess.Popen(["nsenter", f"--net=/run/netns/{WORLD_NS}", "iperf3", "-s", "-p", "5201"],
                                 stdout=world_log, stderr=world_log)
        state["world_pids"].append(iperf.pid)
    save_state(state)
    # The chroot's /run is a plain directory (no systemd-tmpfiles): make what condor expects there.
    for d in ("var/log/condor", "var/lib/condor/execute", "var/lib/condor/spool", "run/condor", "run/lock/condor"):
        (ROOT / d).mkdir(parents=True, exist_ok=True)
        run(["chroot", str(ROOT), "chown", "condor:condor", "/" + d])
    (ROOT / "run/lark").mkdir(parents=True, exist_ok=True)
    master = subprocess.Popen(in_own_root(["/usr/sbin/condor_master", "-f"]), stdout=subprocess.DEVNULL,
                              stderr=open(CACHE / "master.stderr", "a"))
    state["master_pid"] = master.pid
    save_state(state)
    wait_for_slot()
    remove_leftover_jobs()
    log.info("testbed up: EP netns %s (uplink %s), world %s (%s: http :8000, iperf3 :5201)", HOST_NS, HOST_IP,
             WORLD_NS, WORLD_IP)


# -- dockerd (opt-in: only the docker-universe tests start it) -----------------------------------------------
# Everything inside ROOT: the socket (group condor: HTCondor runs the docker CLI as the condor user), the data
# and exec roots, the pid file. Its cgroups (cgroupfs, v1 here) go under a parent of its own, removed at stop().
DOCKER_SOCK = "/run/lark-docker/docker.sock"
DOCKER_CGROUP_PARENT = "lark-testbed-docker"
DOCKER_BRIDGE_IP = "172.31.254.1/24"  # docker0, in the EP's netns: apart from Lark's subnets and the uplink's
DOCKERD = ["dockerd", "--host", f"unix://{DOCKER_SOCK}", "--group", "condor", "--data-root", "/var/lib/lark-docker",
           "--exec-root", "/run/lark-docker", "--pidfile", "/run/lark-docker/dockerd.pid",
           "--cgroup-parent", DOCKER_CGROUP_PARENT,
           # No firewall rules (the machine's firewall is never touched; the EP's netns is larkd's). docker0 (in the
           # EP's netns only) stays, as on a site's EP: a container created without --network lands on it.
           "--iptables=false", "--ip6tables=false", "--bip", DOCKER_BRIDGE_IP,
           # Lark's OCI runtime: lark-docker creates job containers with --runtime=lark (docs/admin.md)
           "--add-runtime", "lark=/opt/lark/bin/lark-oci-runtime"]


def docker(argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
    """The docker CLI in the EP's root and netns, on the testbed's dockerd."""
    return run(in_root(["docker", "--host", f"unix://{DOCKER_SOCK}", *argv]), check=check)


def start_dockerd(timeout: float = 60) -> None:
    """dockerd on the running EP: in its netns, in a mount namespace of its own pivoted into ROOT (in_own_root).
    In a plain chroot it cannot import an image ("remount /, flags: 0x84000: invalid argument": / is no mount
    point there). Safe to repeat."""
    state = load_state()
    if not state.get("master_pid"):
        raise SystemExit("testbed: start the testbed before dockerd")
    pid = state.get("dockerd_pid")
    if pid and Path(f"/proc/{pid}").exists() and docker(["version"], check=False).returncode == 0:
        return
    (ROOT / "run/lark-docker").mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(in_own_root(DOCKERD), stdout=subprocess.DEVNULL, stderr=open(CACHE / "dockerd.log", "a"))
    state["dockerd_pid"] = proc.pid  # nsenter, unshare and sh exec: this is dockerd's pid
    save_state(state)
    deadline = time.time() + timeout
    while docker(["version"], check=False).returncode != 0:
        if proc.poll() is not None or time.time() > deadline:
            raise SystemExit(f"testbed: dockerd did not answer on {DOCKER_SOCK}; see {CACHE / 'dockerd.log'}")
        time.sleep(0.5)
    log.info("dockerd up (pid %d) on %s in the EP's root", proc.pid, DOCKER_SOCK)


def stop_dockerd(state: dict) -> None:
    pid = state.get("dockerd_pid")
    try:
        if not pid or Path(f"/proc/{pid}/comm").read_text().strip() != "dockerd":
            return  # never started, or gone (its pid may be another process's by now)
    except OSError:
        return
    for c in docker(["ps", "-aq"], check=False).stdout.split():
        docker(["rm", "-f", c], check=False)
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    _wait_or_kill(pid, 30)
    run(["ip", "-n", HOST_NS, "link", "del", "docker0"], check=False)  # dockerd leaves its bridge behind
    state.pop("dockerd_pid", None)
    save_state(state)
    for cg in Path("/sys/fs/cgroup").glob(f"*/{DOCKER_CGROUP_PARENT}"):
        try:
            cg.rmdir()  # empty once its containers are gone; one still in use stays
        except OSError as e:
            log.warning("cgroup %s left: %s", cg, e)


# -- docker-universe jobs on the EP (tests/e2e/test_condor_docker.py, demo/container_demo.py) --------------------
DOCKER_IMAGE = "lark-test/busybox:3"  # busybox-static, `docker import`ed (no registry is reachable); :3 has dd, nc
DOCKER_APPLETS = ("sh", "cat", "ls", "ip", "echo", "sleep", "wc", "head", "cut", "wget", "sed", "dd", "nc")
DOCKER_SHIM = "/usr/local/libexec/lark-docker"  # DOCKER takes one path: a shim that runs Lark's wrapper
DOCKER_CONF = "97-lark-docker.conf"


def reconfigure(name: str, text: str | None) -> None:
    """Write (or, with None, remove) an EP config file and condor_reconfig: larkd re-reads on the SIGHUP."""
    conf = ROOT / "etc/condor/config.d" / name
    if text is None:
        conf.unlink(missing_ok=True)
    else:
        conf.write_text(text)
    run(in_root(["condor_reconfig"]))
    time.sleep(5)


def enable_docker_jobs(timeout: float = 60) -> str:
    """dockerd up, the test image imported, DOCKER = Lark's wrapper, until the EP advertises HasDocker; the image."""
    start_dockerd()
    if docker(["image", "inspect", DOCKER_IMAGE], check=False).returncode != 0:
        raw = ROOT / "tmp/lark-docker-image"
        shutil.rmtree(raw, ignore_errors=True)
        for d in ("bin", "etc", "tmp"):
            (raw / d).mkdir(parents=True)
        (raw / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
        shutil.copy2(ROOT / "usr/bin/busybox", raw / "bin/busybox")
        for applet in DOCKER_APPLETS:
            (raw / "bin" / applet).symlink_to("busybox")
        run(["tar", "-C", str(raw), "-cf", str(raw.with_suffix(".tar")), "."])
        docker(["import", "/tmp/lark-docker-image.tar", DOCKER_IMAGE])
        shutil.rmtree(raw)
        raw.with_suffix(".tar").unlink()
    shim = ROOT / DOCKER_SHIM.lstrip("/")
    shim.parent.mkdir(parents=True, exist_ok=True)
    shim.write_text('#!/bin/sh\nexec /opt/lark/bin/python -I -m lark.job.docker_wrapper "$@"\n')
    shim.chmod(0o755)
    reconfigure(DOCKER_CONF, f"DOCKER = {DOCKER_SHIM}\n"
                f"LARK_REAL_DOCKER = /usr/bin/docker --host unix://{DOCKER_SOCK}\n"
                f"LARK_DOCKER_HOST = unix://{DOCKER_SOCK}\n"
                "# No test image ships with Debian's condor; the job's image is local (no registry)\n"
                "DOCKER_PERFORM_TEST = false\nDOCKER_TRUST_LOCAL_IMAGES = true\n")
    deadline = time.time() + timeout
    ad = ""
    while time.time() < deadline:
        ad = run(in_root(["condor_status", "-af", "HasDocker", "DockerVersion"]), check=False).stdout
        if ad.lower().startswith("true"):
            return DOCKER_IMAGE
        time.sleep(2)
    raise SystemExit(f"testbed: the EP does not advertise HasDocker with DOCKER = {DOCKER_SHIM}: {ad!r}")


def disable_docker_jobs() -> None:
    """DOCKER unset again, dockerd stopped with its docker0: what comes after never sees them."""
    reconfigure(DOCKER_CONF, None)
    stop_dockerd(load_state())


def wait_for_slot(timeout: float = 90) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        cp = run(in_root(["condor_status", "-af", "Name", "HasJobNetworking", "LarkVersion"]), check=False)
        larkd = run(in_root(["lark", "status"]), check=False)
        if cp.returncode == 0 and "true" in cp.stdout.lower() and larkd.returncode == 0:
            log.info("slot: %s", cp.stdout.strip())
            return
        time.sleep(1)
    raise SystemExit(f"testbed: no slot with job networking after {timeout:.0f} s; see {ROOT}/var/log/condor")


def remove_leftover_jobs(timeout: float = 90) -> None:
    """Remove every job the persistent queue kept from an earlier, interrupted session, and wait until larkd has
    none. Such jobs run again at each start (the shipped periodic release frees held ones) and take slots and
    larkd records from this session's tests (a CI run failed on one: 'larkd still has jobs')."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        left = run(in_root(["condor_q", "-all", "-af", "ClusterId", "ProcId"]), check=False)
        jobs = run(in_root(["lark", "status", "--json"]), check=False)
        if left.returncode == 0 and not left.stdout.strip() and jobs.returncode == 0 and \
                not json.loads(jobs.stdout or "[]"):
            return
        if left.returncode == 0 and left.stdout.strip():
            log.warning("testbed: removing jobs an earlier session left in the queue: %s",
                        ", ".join(".".join(line.split()) for line in left.stdout.splitlines()))
            run(in_root(["condor_rm", "-all"]), check=False)
            run(in_root(["condor_rm", "-forcex", "-all"]), check=False)   # those already being removed
        time.sleep(1)
    raise SystemExit(f"testbed: jobs or job networks left from an earlier session after {timeout:.0f} s; see "
                     f"condor_q -all and lark status in {ROOT}")


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.1)
    return False


def stop() -> None:
    state = load_state()
    stop_dockerd(state)
    pid = state.get("master_pid")
    if pid:
        # condor_master's pid is nsenter's child (chroot execs); signal the whole process group it leads.
        run(in_root(["condor_off", "-master", "-fast"]), check=False)
        _wait_or_kill(pid, 30)
    for p in state.get("world_pids", []):
        try:
            os.kill(p, signal.SIGTERM)
        except ProcessLookupError:
            pass
        _wait_gone(p, 5)
    # lexists: usr/local/bin/lark is a symlink to /opt/lark/bin/lark, absolute, so exists() would look on the host
    if Path(f"/run/netns/{HOST_NS}").exists() and os.path.lexists(ROOT / "usr/local/bin/lark"):
        purge_lark(lambda argv: run(in_root(argv), check=False))
    # Lark's netns names inside the chroot, then the chroot's own mounts (deepest first).
    for line in reversed(Path("/proc/mounts").read_text().splitlines()):
        target = line.split()[1]
        if target.startswith(str(ROOT) + "/"):
            run(["umount", "-l", target], check=False)
    if str(ROOT) in state.get("mounts", []) or run(["mountpoint", "-q", str(ROOT)], check=False).returncode == 0:
        run(["umount", "-l", str(ROOT)], check=False)
    for ns in (HOST_NS, WORLD_NS):
        run(["ip", "netns", "del", ns], check=False)
    save_state({})
    log.info("testbed stopped")


def purge_lark(run_in_ep, timeout: float = 20) -> None:
    """`lark gc --purge` in an EP whose condor_master was told to stop: larkd, the master's child, can still be
    running for a moment, and then only larkd's own sweep runs (the sandbox limiter's cgroup parent stayed in the
    machine's cgroup tree); tried again until larkd is gone."""
    deadline = time.time() + timeout
    while True:
        cp = run_in_ep(["lark", "gc", "--purge"])
        if cp.returncode == 0 or "needs larkd stopped" not in cp.stderr or time.time() > deadline:
            if cp.returncode != 0:
                log.warning("lark gc --purge: %s", cp.stderr.strip()[-300:])
            return
        time.sleep(0.5)


def _wait_or_kill(pid: int, timeout: float) -> None:
    """Wait for pid to end; after timeout, SIGKILL it and its descendants."""
    if not _wait_gone(pid, timeout):
        for p in _descendants(pid) + [pid]:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _wait_gone(pid, 10)


def _descendants(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == pid:
                out += [int(d.name), *_descendants(int(d.name))]
    return out


def status() -> None:
    state = load_state()
    print(json.dumps({"built": BUILD_STAMP.exists(), "root": str(ROOT), **state}, indent=2))
    if state.get("master_pid"):
        print(run(in_root(["condor_status"]), check=False).stdout)
        print(run(in_root(["lark", "status"]), check=False).stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=["build", "install", "start", "stop", "status", "up", "dockerd"])
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="testbed: %(message)s")
    if os.geteuid() != 0:
        raise SystemExit("testbed: run as root")
    if args.command == "up":
        build()
        install()
        start()
    else:
        {"build": build, "install": install, "start": start, "stop": stop, "status": status,
         "dockerd": start_dockerd}[args.command]()
    return 0


if __name__ == "__main__":
    sys.exit(main())
