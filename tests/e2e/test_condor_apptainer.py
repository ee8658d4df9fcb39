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
from condor import as_root, history, job, out_of, submit, testbed, wait_queue

pytestmark = pytest.mark.e2e
IMAGE = "/opt/lark-test/busybox"
APPLETS = ("sh", "cat", "ls", "wget", "nc", "dd", "ip", "echo", "sleep", "wc", "head")
MBIT = 50
SIZE = 10_000_000  # the world's 10M.bin
IFACES = "ip -o link | cut -d: -f2 | cut -d@ -f1 > ifaces.txt\n"  # the job's interfaces, one a line
# Download the file and send as many bytes to the world's sink; each leg timed from /proc/uptime (1/100 s).
TRANSFER = """set -e
t() {{ read u _ < /proc/uptime; echo "$u"; }}
a=$(t); n=$(wget -q -O - http://{world}:8000/10M.bin | wc -c); b=$(t)
got=$(dd if=/dev/zero bs=100000 count={blocks} 2>/dev/null | nc {world} 7001); c=$(t)
echo "$n $a $b $got $c"
""" + IFACES


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
    d.mkdir(parents=True, exist_ok=True)
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
    blocks = SIZE // 100_000
    c = container_job("apt-net", image, TRANSFER.format(world=testbed.WORLD_IP, blocks=blocks),
                      extra=f"request_bandwidth = {MBIT}")
    kind, limit, inbytes, outbytes, code = history(
        c, ["LarkNetworkType", "LarkBandwidthLimit", "NetworkIncomingBytes", "NetworkOutgoingBytes", "ExitCode"],
        timeout=240)
    assert (kind, limit, code) == ("nat", str(MBIT), "0"), (kind, limit, code, out_of("apt-net", fname="err.txt"))
    n, a, b, got, end = out_of("apt-net").split()
    assert (int(n), int(got)) == (SIZE, SIZE)
    # The container used the job's own network (Lark's eth0 in the job namespace, not the EP's uplink).
    assert out_of("apt-net", fname="ifaces.txt").split() == ["lo", "eth0"]
    # Its download is counted within 1% (headers add ~1%: bytes on the wire over the payload).
    assert SIZE <= int(inbytes) <= SIZE * 1.01 + 200_000, inbytes
    assert int(outbytes) >= SIZE
    # Lower bounds only: neither transfer can beat its limit; a slow VM is just slower.
    least = SIZE * 8 / (MBIT * 1e6) * 0.9
    assert float(b) - float(a) >= least, f"download of {SIZE} B took {float(b) - float(a):.2f} s at {MBIT} Mbit/s"
    assert float(end) - float(b) >= least, f"upload of {SIZE} B took {float(end) - float(b):.2f} s at {MBIT} Mbit/s"
    assert_nothing_left()


def reconfigure(name: str, text: str | None) -> None:
    """Write (or, with None, remove) an EP config file and condor_reconfig: larkd re-reads on the SIGHUP."""
    conf = testbed.ROOT / "etc/condor/config.d" / name
    if text is None:
        conf.unlink(missing_ok=True)
    else:
        conf.write_text(text)
    subprocess.run(testbed.in_root(["condor_reconfig"]), check=True, capture_output=True)
    time.sleep(5)


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
