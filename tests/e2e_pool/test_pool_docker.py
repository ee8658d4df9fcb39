"""Docker universe jobs on the pool testbed (issue 25): the pool's SDN policies hold for them as for vanilla jobs.

dockerd runs on both EPs only for this module (pool.start_dockerd: in each EP's netns, pivoted into its root),
each with Lark's OCI runtime and the test image imported (busybox-static, no registry is reachable); the EPs'
DOCKER is Lark's wrapper (lark/job/docker_wrapper.py), as in tests/e2e/test_condor_docker.py. The controllers run
the pool's policies plus one WAN group, "cms" (one controller: WAN group limits are not shared between two, see
docs/controller.md "HA model"); the second controller is back at the end.

Two jobs run at once, with file transfer: alice's on ep1 in accounting group cms (the control: it reaches the site
and the WAN, a site station reaches it, then it uploads to the WAN server), and carol's on ep2 (a dropped owner).
Each tries the WAN server's /link page and the WAN router's own (a site station), listens on pool.JOB_PORT, and
waits for the test's `done` file in its working directory.
"""
import json
import shutil
import subprocess
import sys
import time

import pool
import pytest
from pool_probe import wait_gone

pytestmark = pytest.mark.e2e

IMAGE = "lark-test/busybox:pool"
APPLETS = ("sh", "ip", "sed", "wget", "nc", "dd", "printf", "mv", "sleep", "echo", "kill", "cat", "[")
SHIM = "/usr/local/libexec/lark-docker"
CONF = "97-lark-docker.conf"
UP = 20_000_000  # alice's upload to the WAN server, counted in group cms's share
# alice's job limit, below the group's meter rate: a policed upload's retransmits would be counted as well (seen:
# 23411411 bytes at the meter for 20000000 uploaded without a job limit)
ALICE_MBIT = 50
WAN_GROUP = """
[[wan_group]]
name = "cms"
select = 'AcctGroup =?= "cms"'
rate_mbit = 100
"""
# Runs in the container: argv label. Its address, what it reaches, an upload (alice), then waits for `done`.
SCRIPT = """nc -ll -p {port} -e /bin/echo "$1" &
listener=$!
ip -o -4 addr show dev eth0 | sed 's/.* inet //; s/[/].*//' > a.tmp; mv a.tmp addr.txt
r() {{ wget -q -T 4 -O - "$1" 2>/dev/null || echo blocked; }}
echo "$(r http://{wan}:{http}/link) $(r http://{gw}:{http}/link)" > s.tmp; mv s.tmp seen.txt
if [ "$1" = alice ]; then
  {{ printf 'POST /up HTTP/1.0\\r\\nContent-Length: {up}\\r\\n\\r\\n'
    dd if=/dev/zero bs=100000 count={blocks} 2>/dev/null; }} | nc {wan} {http} | sed -n '$p' > u.tmp; mv u.tmp up.txt
fi
i=0; while [ ! -e done ] && [ $i -lt 600 ]; do sleep 0.5; i=$((i + 1)); done
kill $listener
"""


def ep_conf(ep: str, text: str | None) -> None:
    """Write (None: remove) an EP's config file, then condor_reconfig there (larkd re-reads on the SIGHUP)."""
    conf = pool.root_of(ep) / "etc/condor/config.d" / CONF
    if text is None:
        conf.unlink(missing_ok=True)
    else:
        conf.write_text(text)
    pool.run(pool.in_machine(ep, ["condor_reconfig"]))


def import_image(ep: str) -> None:
    raw = pool.root_of(ep) / "tmp/lark-docker-image"
    shutil.rmtree(raw, ignore_errors=True)
    for d in ("bin", "etc", "tmp"):
        (raw / d).mkdir(parents=True)
    (raw / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    shutil.copy2(pool.root_of(ep) / "usr/bin/busybox", raw / "bin/busybox")
    for applet in APPLETS:
        (raw / "bin" / applet).symlink_to("busybox")
    pool.run(["tar", "-C", str(raw), "-cf", str(raw.with_suffix(".tar")), "."])
    pool.docker(ep, ["import", "/tmp/lark-docker-image.tar", IMAGE])
    shutil.rmtree(raw)
    raw.with_suffix(".tar").unlink()


@pytest.fixture(scope="module")
def docker_pool(lark_pool):
    if not pool.controller_available():
        pytest.skip("lark-controller is not in this tree")
    pool.start_dockerd()
    try:
        for ep in pool.EPS:
            import_image(ep)
            shim = pool.root_of(ep) / SHIM.lstrip("/")
            shim.parent.mkdir(parents=True, exist_ok=True)
            shim.write_text('#!/bin/sh\nexec /opt/lark/bin/python -I -m lark.job.docker_wrapper "$@"\n')
            shim.chmod(0o755)
            ep_conf(ep, f"DOCKER = {SHIM}\n"
                        f"LARK_REAL_DOCKER = /usr/bin/docker --host unix://{pool.tb.DOCKER_SOCK}\n"
                        f"LARK_DOCKER_HOST = unix://{pool.tb.DOCKER_SOCK}\n"
                        "DOCKER_PERFORM_TEST = false\nDOCKER_TRUST_LOCAL_IMAGES = true\n")
        pool.reconfigure_controller(pool.SDN_POLICIES + WAN_GROUP, controllers=pool.controllers_for(WAN_GROUP))
        deadline = time.time() + 90
        while True:
            ads = pool.run(pool.in_machine("cm", ["condor_status", "-af", "LarkPoolEP", "HasDocker"])).stdout
            if {line.split()[0] for line in ads.splitlines() if line.lower().endswith("true")} >= set(pool.EPS):
                break
            assert time.time() < deadline, f"the EPs do not advertise HasDocker with DOCKER = {SHIM}: {ads!r}"
            time.sleep(2)
        yield pool
    finally:
        for ep in pool.EPS:
            ep_conf(ep, None)
        pool.reconfigure_controller(None, controllers=pool.CONTROLLERS)
        pool.stop_dockerd()


def submit(user: str, ep: str, extra: str = "") -> int:
    script = SCRIPT.format(port=pool.JOB_PORT, wan=pool.WAN_SERVER, gw=pool.GATEWAY, http=pool.WAN_HTTP_PORT, up=UP,
                           blocks=UP // 100_000)
    body = (f"universe = docker\ndocker_image = {IMAGE}\nexecutable = /bin/sh\ntransfer_executable = false\n"
            f'arguments = "job.sh {user}"\noutput = out.txt\nerror = err.txt\nlog = log.txt\n'
            "should_transfer_files = YES\nwhen_to_transfer_output = ON_EXIT\ntransfer_input_files = job.sh\n"
            f'requirements = TARGET.LarkPoolEP == "{ep}"\n+InboundConnectivity = true\n{extra}\nqueue\n')
    return pool.submit_as(user, f"dk-{user}", body, files={"job.sh": script})


def running_file(user: str, cluster: int, name: str, timeout: float = 180) -> str:
    """A file the running job wrote in its working directory on its EP."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        d = pool.job_scratch(pool.HOME / user / f"dk-{user}" / "log.txt", f"{cluster}.0")
        if d is not None and (d / name).exists():
            return (d / name).read_text().strip()
        time.sleep(0.5)
    q = pool.run(pool.in_machine("cm", ["condor_q", str(cluster), "-af", "JobStatus", "HoldReason"]), check=False)
    raise AssertionError(f"{user}'s docker job {cluster} wrote no {name} in {timeout:.0f} s: {q.stdout.strip()}")


def connect_from_cm(addr: str) -> str:
    """What a site station (the CM) gets from the job's listener: its label, or blocked."""
    code = ("import socket, sys\ntry:\n    c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3)\n"
            "    c.settimeout(3); print(c.recv(100).decode().strip())\nexcept OSError as e:\n"
            "    print('blocked', e)\n")
    cp = subprocess.run(pool.in_ns("cm", [sys.executable, "-c", code, addr, str(pool.JOB_PORT)]), capture_output=True,
                        text=True, check=True)
    return cp.stdout.strip()


def wan_rx_bytes() -> int:
    """Bytes the WAN router received from the core switch (its link w0 on port wan0)."""
    cp = pool.run(["ip", "-j", "-s", "-n", f"{pool.PREFIX}wan", "link", "show", "w0"])
    return int(json.loads(cp.stdout)[0]["stats64"]["rx"]["bytes"])


def cms_bytes() -> int:
    st = json.loads(pool.controller_cli("status", "--config", str(pool.controller_file(0)), "--json").stdout)
    return sum(g["bytes"] for g in st.get("wan_groups", []) if g["group"] == "cms")


@pytest.fixture(scope="module")
def docker_run(docker_pool):
    """alice's (cms, ep1) and carol's (ep2) docker jobs run at once; what each saw, what the CM saw of each, and group
    cms's WAN bytes once alice's upload is done, all while they run."""
    wan_before = wan_rx_bytes()
    jobs = {"alice": submit("alice", "ep1", f"accounting_group = cms\naccounting_group_user = alice\n"
                                          f"request_bandwidth = {ALICE_MBIT}"),
            "carol": submit("carol", "ep2")}
    out: dict = {"jobs": jobs}
    try:
        for user, c in jobs.items():
            out[user] = {"addr": running_file(user, c, "addr.txt"), "seen": running_file(user, c, "seen.txt").split()}
            out[user]["from_cm"] = connect_from_cm(out[user]["addr"])
        out["up"] = running_file("alice", jobs["alice"], "up.txt", timeout=120)
        out["wan_rx"] = wan_rx_bytes() - wan_before  # alice's WAN traffic: carol's never gets past the core
        deadline, last = time.time() + 60, -1
        while ((counted := cms_bytes()) < UP or counted != last) and time.time() < deadline:
            last = counted  # the controller polls the meters: until its figure has all of the upload and stays
            time.sleep(3)
        out["cms_bytes"] = counted
    finally:
        for user, c in jobs.items():
            d = pool.job_scratch(pool.HOME / user / f"dk-{user}" / "log.txt", f"{c}.0")
            if d is not None:
                (d / "done").write_text("")
    wait_gone(list(jobs.values()), timeout=120)
    for user, c in jobs.items():
        deadline = time.time() + 30
        ask = ["condor_history", "-limit", "1", str(c), "-af", "LarkNetworkType", "ExitCode"]
        while not (hist := pool.run(pool.in_machine("cm", ask), check=False).stdout.split()):
            if time.time() > deadline:
                break
            time.sleep(1)
        out[user]["history"] = hist
    print(json.dumps(out))
    return out


def test_docker_job_of_a_dropped_owner_reaches_nothing_and_nothing_reaches_it(docker_run):
    alice, carol = docker_run["alice"], docker_run["carol"]
    # the control: the same image, script and EP setup under a policy that lets it through
    assert alice["seen"] == ["wan0", "wan0"] and alice["from_cm"] == "alice", alice
    assert carol["addr"].startswith("10.77.0."), carol  # carol's job is networked: the drop, not a missing network
    assert carol["seen"] == ["blocked", "blocked"], carol  # neither the WAN nor a site station
    assert carol["from_cm"].startswith("blocked"), carol
    assert alice["history"] == ["bridge", "0"] and carol["history"] == ["bridge", "0"], docker_run


def test_docker_jobs_wan_traffic_is_counted_in_its_accounting_groups_share(docker_run):
    got, link = docker_run["up"].split()
    counted, wan_rx = docker_run["cms_bytes"], docker_run["wan_rx"]
    print(f"alice's docker job (group cms) uploaded {got} bytes to the WAN over {link}; the controller's cms "
          f"share counted {counted} bytes ({counted / UP:.4f} of them), the WAN router received {wan_rx} "
          f"(share/received {counted / wan_rx:.4f})")
    assert (int(got), link) == (UP, "wan0")
    # Every byte of the upload is in the share, and the share is what reached the WAN (as test_controller_wan checks
    # for vanilla jobs: within 10%). Both count frames with their headers, and what was sent again: seen 1.12-1.17
    # of the upload at the meter.
    assert counted >= UP, counted
    assert 0.9 * wan_rx <= counted <= 1.1 * wan_rx, (counted, wan_rx)
    for ep in pool.EPS:
        st = pool.run(pool.in_machine(ep, ["lark", "status", "--json"]))
        assert json.loads(st.stdout) == [], (ep, st.stdout)
        assert pool.docker(ep, ["ps", "-aq"]).stdout.split() == [], f"a job's container was left on {ep}"
