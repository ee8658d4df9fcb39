"""Docker universe jobs (issue 25): HTCondor's DOCKER names Lark's wrapper (lark/job/docker_wrapper.py), which
creates every container with --network=none and refuses the networks Lark does not manage (host, a Docker network
not in LARK_DOCKER_NETWORKS, port publishing) with a hold reason.

dockerd runs only for this module (testbed.start_dockerd: in the EP's netns, pivoted into the root in a mount
namespace of its own, its socket, data and exec roots inside the root, no iptables rules; its docker0 bridge in the
EP's netns, where a container without --network would land). The image is made here from busybox-static (no
registry is reachable) and `docker import`ed.
"""
import json
import shutil
import time

import pytest
from condor import as_root, assert_ran_once, history, job, out_of, submit, testbed, wait_queue

# an EP config file written (or removed), then condor_reconfig; larkd's jobs, links, nft and netns names all gone
from test_condor_apptainer import assert_nothing_left, reconfigure
from test_condor_security import kill_larkd_once_running  # kill -9 larkd a few seconds into the running job
from test_condor_url_transfer import world_file  # the world's 200M.bin, made once

pytestmark = pytest.mark.e2e
IMAGE = testbed.DOCKER_IMAGE
IFACES = "ip -o link | cut -d: -f2 | cut -d@ -f1 > ifaces.txt\n"  # the job's interfaces, one a line
MBIT = 100  # the figure: request_bandwidth = 100
SIZE = 200_000_000  # the world's 200M.bin (made by test_condor_url_transfer.world_file), 16 s at 100 Mbit/s
KILL_MBIT, KILL_SIZE = 20, 50_000_000  # the kill -9 test: a 20 s download, longer than larkd's absence
# The job's interfaces and IPv4 address, then the download timed from /proc/uptime (1/100 s).
DOWNLOAD = IFACES + """ip -o -4 addr show dev eth0 | sed 's/.* inet //; s/ .*//' > addr.txt
t() {{ read u _ < /proc/uptime; echo "$u"; }}
a=$(t); n=$(wget -q -O - http://{world}:8000/{file} | wc -c); b=$(t)
echo "$n $a $b"
"""
UP_SIZE = 100_000_000
# A job of its own (its history's NetworkOutgoingBytes is then the upload's, not a download's ACKs too): as many
# bytes to the world's sink (:7001, which answers how many it got), timed the same way.
UPLOAD = """t() {{ read u _ < /proc/uptime; echo "$u"; }}
a=$(t); got=$(dd if=/dev/zero bs=100000 count={blocks} 2>/dev/null | nc {world} 7001); b=$(t)
echo "$got $a $b" > up.txt
"""


@pytest.fixture(scope="module")
def docker_ep(pool):
    """dockerd up, the test image imported, DOCKER = Lark's wrapper; the EP advertising HasDocker."""
    yield testbed.enable_docker_jobs()
    testbed.disable_docker_jobs()  # with dockerd's docker0: the modules after this one never see them


def docker_job(name: str, script: str, extra: str = "") -> int:
    d = testbed.ROOT / "home/alice" / name
    shutil.rmtree(d, ignore_errors=True)  # no output of an earlier run
    d.mkdir(parents=True)
    (d / "job.sh").write_text(script)
    return submit(name, job(exe="/bin/sh", args="job.sh", inputs=("job.sh",),
                            extra=f"universe = docker\ndocker_image = {IMAGE}\n{extra}"))


def containers() -> list[str]:
    return testbed.docker(["ps", "-aq"]).stdout.split()


def test_docker_job_gets_its_lark_network_limit_and_counters(docker_ep):
    """Without docker_network_type (Docker's bridge NAT, docker0, by default) the wrapper creates the container
    with --network=none --runtime=lark: lark-oci-runtime has larkd build the job's network in the container's own
    namespace before the job starts. The job never sees the EP's uplink nor Docker's bridge, but its own eth0 and
    address; its 200 MB download from the world is limited to its 100 Mbit/s, counted within 1% and in its history;
    then a second job's 100 MB upload likewise; nothing is left after them."""
    script = DOWNLOAD.format(world=testbed.WORLD_IP, file=world_file("200M.bin", SIZE))
    c = docker_job("dk-net", script, extra=f"request_bandwidth = {MBIT}\n")
    kind, limit, inbytes, code = history(
        c, ["LarkNetworkType", "LarkBandwidthLimit", "NetworkIncomingBytes", "ExitCode"], timeout=240)
    assert (kind, limit, code) == ("nat", str(MBIT), "0"), (kind, limit, code, out_of("dk-net", fname="err.txt"))
    assert_ran_once(c)
    assert out_of("dk-net", fname="ifaces.txt").split() == ["lo", "eth0"]
    addr = out_of("dk-net", fname="addr.txt")
    assert addr.startswith("10.213.0."), addr  # the testbed's LARK_SUBNET: an address of the job's own
    n, a, b = out_of("dk-net").split()
    assert int(n) == SIZE
    seconds = float(b) - float(a)
    ratio = SIZE * 8 / seconds / (MBIT * 1e6)
    print(f"docker job: {n} bytes in {seconds:.2f} s, goodput {ratio:.3f} of {MBIT} Mbit/s; history "
          f"NetworkIncomingBytes {inbytes} ({int(inbytes) / SIZE:.4f} of the bytes)")
    assert SIZE <= int(inbytes) <= SIZE * 1.01, inbytes  # counted within 1% (headers: bytes on the wire)
    assert 0.5 <= ratio <= 1.02, f"goodput {ratio:.3f} of the {MBIT} Mbit/s limit"  # generous: a slow VM is slower
    assert_nothing_left()

    c = docker_job("dk-up", UPLOAD.format(world=testbed.WORLD_IP, blocks=UP_SIZE // 100_000),
                   extra=f"request_bandwidth = {MBIT}\n")
    outbytes, code = history(c, ["NetworkOutgoingBytes", "ExitCode"], timeout=240)
    assert code == "0", out_of("dk-up", fname="err.txt")
    got, a, b = out_of("dk-up", fname="up.txt").split()
    assert int(got) == UP_SIZE
    up_ratio = UP_SIZE * 8 / (float(b) - float(a)) / (MBIT * 1e6)
    print(f"docker job upload: {got} bytes in {float(b) - float(a):.2f} s, goodput {up_ratio:.3f} of {MBIT} Mbit/s; "
          f"history NetworkOutgoingBytes {outbytes} ({int(outbytes) / UP_SIZE:.4f} of the bytes)")
    assert UP_SIZE <= int(outbytes) <= UP_SIZE * 1.01, outbytes  # counted within 1%
    assert 0.5 <= up_ratio <= 1.02, f"upload goodput {up_ratio:.3f} of the {MBIT} Mbit/s limit"
    assert_nothing_left()
    deadline = time.time() + 30
    while containers() and time.time() < deadline:
        time.sleep(1)
    assert containers() == [], "the jobs' containers were left behind"


def test_docker_job_asking_for_the_host_network_is_held_with_the_reason(docker_ep):
    c = docker_job("dk-host", IFACES, extra="docker_network_type = host\n")
    _, code, reason = wait_queue(c, ["JobStatus", "HoldReasonCode", "HoldReason"], until=lambda r: r[0] == "5",
                                 timeout=120)
    assert "docker_network_type = host" in reason and f"job {c}.0" in reason, reason
    assert "remove docker_network_type" in reason, reason
    print(f"held: code {code}: {reason}")
    as_root(["condor_rm", str(c)])
    assert not (testbed.ROOT / "home/alice/dk-host/ifaces.txt").exists()  # it never ran
    assert containers() == [], "a refused job left a container"
    st = as_root(["lark", "status", "--json"])
    assert st.returncode == 0, st.stderr
    assert not [j for j in json.loads(st.stdout) if j["job_id"].startswith(f"{c}.")], st.stdout  # never networked


def test_docker_job_under_no_network_policy_sees_only_lo(docker_ep):
    """The policy decides a docker job's mode as a vanilla job's: no network, and the container has only `lo`."""
    expr = (testbed.REPO / "policies/network_type_by_connectivity.ad").read_text().strip().splitlines()[-1]
    reconfigure("95-policy.conf", f"{expr}\n")
    try:
        c = docker_job("dk-none", IFACES + f"wget -q -T 5 -O - http://{testbed.WORLD_IP}:8000/10M.bin | wc -c\n",
                       extra="+InboundConnectivity = false\n+OutboundConnectivity = false\n")
        assert history(c, ["LarkNetworkType", "ExitCode"], timeout=180) == ["none", "0"]
    finally:
        reconfigure("95-policy.conf", None)
    assert out_of("dk-none", fname="ifaces.txt").split() == ["lo"]
    assert out_of("dk-none") == "0"  # nothing came through
    assert_nothing_left()


def test_docker_job_outlives_a_killed_larkd_and_leaves_nothing(docker_ep):
    """larkd killed -9 three seconds into a docker job's 20 s download: condor_master restarts it, it adopts the
    job from its record (the starter still runs), tears it down when the starter exits; the history has every
    byte (the exit barrier after `docker start -a` waits for larkd), and nothing is left, not even for gc."""
    c = docker_job("dk-kill", DOWNLOAD.format(world=testbed.WORLD_IP, file="50M.bin"),
                   extra=f"request_bandwidth = {KILL_MBIT}\n")
    killed_at = kill_larkd_once_running(c)
    deadline = time.time() + 40
    while (st := as_root(["lark", "status", "--json"])).returncode != 0:
        assert time.time() < deadline, "larkd did not come back"
        time.sleep(0.5)
    back_at = time.time()
    assert [j["phase"] for j in json.loads(st.stdout) if j["job_id"] == f"{c}.0"] == ["ready"], st.stdout
    inbytes, code = history(c, ["NetworkIncomingBytes", "ExitCode"], timeout=180)
    n, a, b = out_of("dk-kill").split()
    assert (int(n), code) == (KILL_SIZE, "0")
    assert back_at - killed_at < float(b) - float(a), "the download was shorter than larkd's absence: proves nothing"
    assert KILL_SIZE <= int(inbytes) <= KILL_SIZE * 1.01, inbytes
    print(f"docker job across larkd's kill -9: back after {back_at - killed_at:.1f} s; history NetworkIncomingBytes "
          f"{inbytes}")
    assert_nothing_left()
    assert containers() == [], "the job's container was left behind"
