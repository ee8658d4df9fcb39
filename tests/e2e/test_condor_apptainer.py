"""Apptainer jobs (issue 25): a container-universe job runs inside the network Lark built for it.

The starter runs `apptainer exec` in the job's namespace, after USER_JOB_WRAPPER had it networked, so the container
shares that namespace: the job's limit, counters, policy and teardown hold as for a vanilla job. Apptainer's own
network namespace (`--net`, asked by the EP's SINGULARITY_EXTRA_ARGUMENTS or by APPTAINER_NET in the job's
environment) would cut the job off from that network: Lark refuses such a job with a hold reason.

The image is made here, from busybox-static (no registry is reachable): a sandbox directory in the EP's root.
Apptainer runs unprivileged (Debian ships no setuid starter): it needs user namespaces, which the kernel refuses
inside a chroot, so the testbed's condor_master runs pivoted into its root (testbed.in_own_root).
"""
import json
import shutil
import subprocess
import time

import pytest
from condor import as_root, assert_goodput_and_count, history, job, out_of, submit, testbed, wait_larkd_back, wait_queue
from test_condor_security import kill_larkd_once_running  # kill -9 larkd a few seconds into the running job
from test_condor_url_transfer import world_file  # the world's 200M.bin, made once

pytestmark = pytest.mark.e2e
IMAGE = "/opt/lark-test/busybox"
APPLETS = ("sh", "cat", "ls", "wget", "nc", "dd", "ip", "echo", "sleep", "wc", "head")
MBIT = 100  # the figure: request_bandwidth = 100
SIZE = 200_000_000  # the world's 200M.bin (made by test_condor_url_transfer.world_file), 16 s at 100 Mbit/s
UP_SIZE = 100_000_000  # the upload, in a job of its own (its NetworkOutgoingBytes is then the upload's alone)
KILL_MBIT, KILL_SIZE = 20, 50_000_000  # the kill -9 test: a 20 s download, longer than larkd's absence
IFACES = "ip -o link | cut -d: -f2 | cut -d@ -f1 > ifaces.txt\n"  # the job's interfaces, one a line


def job_scripts() -> tuple[str, str]:
    """The docker test's DOWNLOAD and UPLOAD job scripts (busybox sh; the image's shell runs any busybox applet).
    Imported when used: test_condor_docker imports this module's helpers."""
    from test_condor_docker import DOWNLOAD, UPLOAD
    return DOWNLOAD, UPLOAD


def in_master_root(argv: list[str]) -> subprocess.CompletedProcess:
    """A command in condor_master's own mount namespace and root (where apptainer can run), in the EP's netns."""
    pid = testbed.load_state()["master_pid"]
    return subprocess.run(["nsenter", "-t", str(pid), "-m", "-n", "-r", "-w", *argv], capture_output=True,
                          text=True, timeout=120)


@pytest.fixture(scope="module")
def image(pool):
    """A sandbox image of busybox-static in the EP's root, made by `apptainer build --sandbox` from a bare
    directory (HTCondor's pre-job test runs the image's /.singularity.d/actions/test, and wants /etc/passwd).
    Not a SIF: HTCondor requires HasSIF of the EP for one, and Debian's condor never advertises it (it ships no
    exit_37.sif for the startd's SIF self-test)."""
    sandbox = testbed.ROOT / IMAGE.lstrip("/")
    if not (sandbox / ".singularity.d/actions/test").exists():
        raw, part = sandbox.with_suffix(".raw"), sandbox.with_suffix(".part")
        for d in (raw, part):
            shutil.rmtree(d, ignore_errors=True)
        for d in ("bin", "etc", "tmp", "proc", "sys", "dev", "home", "root", "srv", "var/tmp"):
            (raw / d).mkdir(parents=True, exist_ok=True)
        (raw / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
        (raw / "etc/group").write_text("root:x:0:\n")
        shutil.copy2(testbed.ROOT / "usr/bin/busybox", raw / "bin/busybox")
        for applet in APPLETS:
            (raw / "bin" / applet).symlink_to("busybox")
        cp = in_master_root(["apptainer", "build", "--sandbox", f"{IMAGE}.part", f"{IMAGE}.raw"])
        assert cp.returncode == 0, f"apptainer build --sandbox failed: {cp.stderr[-2000:]}"
        shutil.rmtree(sandbox, ignore_errors=True)
        part.rename(sandbox)
        shutil.rmtree(raw)
    cp = as_root(["condor_status", "-af", "HasSingularity", "HasSandboxImage", "SingularityVersion"])
    assert cp.stdout.lower().startswith("true true"), f"the EP advertises no working apptainer: {cp.stdout}"
    return IMAGE


def container_job(name: str, image: str, script: str, extra: str = "") -> int:
    """A container-universe job running `script` with the image's /bin/sh; the script goes by file transfer."""
    d = testbed.ROOT / "home/alice" / name
    shutil.rmtree(d, ignore_errors=True)  # no output of an earlier run
    d.mkdir(parents=True)
    (d / "job.sh").write_text(script)
    # the image is the EP's own (a directory is not sent)
    return submit(name, job(exe="/bin/sh", args="job.sh", inputs=("job.sh",),
                            extra=f"universe = container\ncontainer_image = {image}\ntransfer_container = false\n"
                                  f"{extra}"))


def lark_jobs() -> list:
    st = as_root(["lark", "status", "--json"])
    return json.loads(st.stdout) if st.returncode == 0 else [f"lark status failed: {st.stderr.strip()}"]


def assert_nothing_left() -> None:
    """No job left in larkd, nothing for gc, no host-side veth, no per-job nft chain, no netns name (as
    test_condor_many checks after its jobs)."""
    deadline = time.time() + 60
    while lark_jobs() and time.time() < deadline:
        time.sleep(1)
    assert lark_jobs() == [], "larkd still has jobs after the container job ended"
    gc = as_root(["lark", "gc", "--dry-run"])
    assert gc.returncode == 0 and "nothing" in gc.stdout.lower(), (gc.stdout, gc.stderr)
    links = as_root(["ip", "-o", "link"]).stdout
    assert " lk-" not in links, links
    nft = as_root(["nft", "list", "table", "inet", "lark"]).stdout
    assert "chain j_" not in nft, nft
    assert not list((testbed.ROOT / "run/netns").glob("lark-*"))


def test_apptainer_job_gets_its_lark_network_limit_and_counters(pool, image):
    """A container job at request_bandwidth = 100: its 200 MB download from the world is held to its limit and
    counted within 1% in its history; then a second job's 100 MB upload likewise; nothing is left after either."""
    download, upload = job_scripts()
    c = container_job("apt-net", image, download.format(world=testbed.WORLD_IP, file=world_file("200M.bin", SIZE)),
                      extra=f"request_bandwidth = {MBIT}")
    kind, limit, inbytes, code = history(
        c, ["LarkNetworkType", "LarkBandwidthLimit", "NetworkIncomingBytes", "ExitCode"], timeout=240)
    assert (kind, limit, code) == ("nat", str(MBIT), "0"), (kind, limit, code, out_of("apt-net", fname="err.txt"))
    # The container used the job's own network (Lark's eth0 in the job namespace, not the EP's uplink).
    assert out_of("apt-net", fname="ifaces.txt").split() == ["lo", "eth0"]
    addr = out_of("apt-net", fname="addr.txt")
    assert addr.startswith("10.213.0."), addr  # the testbed's LARK_SUBNET: an address of the job's own
    n, a, b = out_of("apt-net").split()
    assert int(n) == SIZE
    assert_goodput_and_count("apptainer job", SIZE, MBIT, float(b) - float(a), "NetworkIncomingBytes", inbytes)
    assert_nothing_left()

    c = container_job("apt-up", image, upload.format(world=testbed.WORLD_IP, blocks=UP_SIZE // 100_000),
                      extra=f"request_bandwidth = {MBIT}")
    outbytes, code = history(c, ["NetworkOutgoingBytes", "ExitCode"], timeout=240)
    assert code == "0", out_of("apt-up", fname="err.txt")
    got, a, b = out_of("apt-up", fname="up.txt").split()
    assert int(got) == UP_SIZE
    assert_goodput_and_count("apptainer job upload", UP_SIZE, MBIT, float(b) - float(a), "NetworkOutgoingBytes",
                             outbytes)
    assert_nothing_left()


def test_apptainer_job_outlives_a_killed_larkd_and_leaves_nothing(pool, image):
    """larkd killed -9 three seconds into a container job's 20 s download: condor_master restarts it, it adopts the
    job from its record, tears it down when the starter exits; the history has every byte, nothing is left."""
    c = container_job("apt-kill", image, job_scripts()[0].format(world=testbed.WORLD_IP, file="50M.bin"),
                      extra=f"request_bandwidth = {KILL_MBIT}")
    killed_at = kill_larkd_once_running(c)
    back_at = wait_larkd_back(c)
    inbytes, code = history(c, ["NetworkIncomingBytes", "ExitCode"], timeout=180)
    assert code == "0", out_of("apt-kill", fname="err.txt")
    n, a, b = out_of("apt-kill").split()
    assert int(n) == KILL_SIZE
    assert back_at - killed_at < float(b) - float(a), "the download was shorter than larkd's absence: proves nothing"
    print(f"apptainer job across larkd's kill -9: back after {back_at - killed_at:.1f} s; history "
          f"NetworkIncomingBytes {inbytes}")
    assert KILL_SIZE <= int(inbytes) <= KILL_SIZE * 1.01, inbytes
    assert_nothing_left()


reconfigure = testbed.reconfigure  # an EP config file written (or removed), then condor_reconfig


def test_apptainer_job_under_no_network_policy_sees_only_lo(pool, image):
    expr = (testbed.REPO / "policies/network_type_by_connectivity.ad").read_text().strip().splitlines()[-1]
    reconfigure("95-policy.conf", f"{expr}\n")
    try:
        c = container_job("apt-none", image, IFACES + f"wget -q -T 5 -O - http://{testbed.WORLD_IP}:8000/10M.bin"
                          " | wc -c\n", extra="+InboundConnectivity = false\n+OutboundConnectivity = false")
        assert history(c, ["LarkNetworkType", "ExitCode"], timeout=180) == ["none", "0"]
    finally:
        reconfigure("95-policy.conf", None)
    assert out_of("apt-none", fname="ifaces.txt").split() == ["lo"]
    assert out_of("apt-none") == "0"  # nothing came through
    assert_nothing_left()


def test_apptainer_told_to_make_its_own_netns_is_held_with_the_reason(pool, image):
    """SINGULARITY_EXTRA_ARGUMENTS = --net would put the container in an empty netns of Apptainer's (only lo,
    seen without Lark's check): Lark refuses the job before it starts, naming the knob and the fix."""
    reconfigure("96-apptainer-net.conf", "SINGULARITY_EXTRA_ARGUMENTS = --net --network none\n")
    try:
        c = container_job("apt-ownnet", image, IFACES)
        _, code, subcode, reason = wait_queue(c, ["JobStatus", "HoldReasonCode", "HoldReasonSubCode", "HoldReason"],
                                              until=lambda r: r[0] == "5", timeout=120)
        assert (code, subcode) == ("19", "112"), (code, subcode, reason)  # PREPARE_JOB failed; larkd refused
        assert "SINGULARITY_EXTRA_ARGUMENTS" in reason and "network namespace of its own (--net)" in reason, reason
        assert f"job {c}.0" in reason, reason
        as_root(["condor_rm", str(c)])
    finally:
        reconfigure("96-apptainer-net.conf", None)
    assert not (testbed.ROOT / "home/alice/apt-ownnet/ifaces.txt").exists()  # it never ran
    assert_nothing_left()
