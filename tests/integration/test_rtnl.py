"""The raw rtnetlink path of a job's setup (lark/kernel/rtnl.py) on the real kernel: it leaves exactly what the
pyroute2 path leaves, fails with the same errors, and never acts in a netns other than the IPRoute's it stands in
for. Each test works in namespaces it makes."""
from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from lark.config import Config
from lark.kernel import links, mtu, netns, rtnl
from lark.kernel.attach.nat import NatMode
from lark.kernel.sections import NatSection
from lark.names import JobNames
from lark.plan import JobNetwork, NetworkPlan

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces)")


def sh(*cmd: str) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def ns() -> Iterator[str]:
    """A netns with a veth pair a1/a2 (both down), removed at the end."""
    name = f"lark-rtnl-{secrets.token_hex(3)}"
    sh("ip", "netns", "add", name)
    try:
        sh("ip", "-n", name, "link", "add", "a1", "type", "veth", "peer", "name", "a2")
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name])


@pytest.fixture
def pair() -> Iterator[tuple[str, str]]:
    """Two netns, each with one end of a veth pair named j0 (down), as a job's netns has; removed at the end."""
    names = (f"lark-rtnl-{secrets.token_hex(3)}", f"lark-rtnl-{secrets.token_hex(3)}")
    for n in names:
        sh("ip", "netns", "add", n)
    try:
        sh("ip", "-n", names[0], "link", "add", "j0", "type", "veth", "peer", "name", "j0", "netns", names[1])
        yield names
    finally:
        for n in names:
            subprocess.run(["ip", "netns", "del", n])


def state(ns: str) -> tuple[str, str, str]:
    """What `ip` sees in a netns: j0's and lo's flags and addresses (without link-local: from the MAC, which
    differs), and every route of every table (IPv4 and IPv6)."""
    links_ = json.loads(sh("ip", "-n", ns, "-j", "addr", "show"))
    seen = [(ln["ifname"], sorted(ln["flags"]), ln["operstate"],
             sorted((a["family"], a["local"], a["prefixlen"], a.get("scope"), bool(a.get("nodad")))
                    for a in ln.get("addr_info", []) if a.get("scope") != "link")) for ln in links_]
    routes = [sh("ip", "-n", ns, "-d", fam, "route", "show", "table", "all") for fam in ("-4", "-6")]
    return json.dumps(seen, sort_keys=True), routes[0], "\n".join(ln for ln in routes[1].splitlines()
                                                                   if "fe80" not in ln)


def fd_of(ns: str) -> int:
    return os.open(f"/run/netns/{ns}", os.O_RDONLY)


def test_the_raw_path_leaves_what_pyroute2_leaves(pair: tuple[str, str]) -> None:
    """The same job setup steps, one netns through pyroute2 (a plain IPRoute), the other through netns.netlink_in's
    raw socket: the same kernel state."""
    for ns, raw in zip(pair, (False, True), strict=True):
        fd = fd_of(ns)
        try:
            if raw:
                nipr = netns.netlink_in(fd)
            else:
                with netns.entered(fd):
                    nipr = IPRoute()
            with nipr:
                assert isinstance(nipr, netns.JobNetlink) == raw
                idx = links.bring_up_job_side(nipr, "j0")
                links.add_job_address(nipr, idx, "10.1.0.2", 24, "10.1.0.1")
                links.add_job_address6(nipr, idx, "fd00:1::2", 64, "fd00:1::1")
                if raw:
                    assert nipr._ipr is None, "the raw path made an IPRoute"
        finally:
            os.close(fd)
    for _ in range(200):  # both ends are up: the kernel's link watch gives both carrier, a little later
        if all("state UP" in sh("ip", "-n", ns, "link", "show", "j0") for ns in pair):
            break
        time.sleep(0.01)
    results = [state(ns) for ns in pair]
    assert results[1] == results[0], f"raw {results[1]} != pyroute2 {results[0]}"
    assert "default via 10.1.0.1 dev j0 table main proto static scope global onlink" in results[1][1]
    assert "lo" in results[1][0] and "UP" in results[1][0]


def test_the_raw_path_fails_as_pyroute2_does(ns: str) -> None:
    fd = fd_of(ns)
    try:
        with netns.netlink_in(fd) as nipr:
            with pytest.raises(NetlinkError) as e:
                links.bring_up_job_side(nipr, "nonesuch")
            assert e.value.code == 19  # ENODEV
            idx = links.bring_up_job_side(nipr, "a2")
            links.add_job_address(nipr, idx, "10.2.0.2", 24, None)
            with pytest.raises(NetlinkError) as e:
                links.add_job_address(nipr, idx, "10.2.0.2", 24, None)
            assert e.value.code == 17  # EEXIST, as pyroute2's addr("add")
            # Anything else goes to the IPRoute it makes on first use, in the same netns.
            assert [a.get_attr("IFA_ADDRESS") for a in nipr.get_addr(index=idx, family=2)] == ["10.2.0.2"]
    finally:
        os.close(fd)


def test_a_raw_socket_stands_in_only_for_an_iproute_of_its_own_netns(ns: str, tmp_path) -> None:
    """larkd's host IPRoute and the thread share a netns: raw. An IPRoute of another netns, or a thread visiting
    another netns: never raw, so nothing is added to the wrong namespace (nor is a job's netns pinned)."""
    here = IPRoute()
    fd = fd_of(ns)
    try:
        with netns.entered(fd):
            there = IPRoute()
        with here, there:
            raw = links.host_rtnl(here)
            assert raw is not None and raw.cookie == rtnl.netns_cookie(here.fileno())
            assert links.host_rtnl(there) is None, "an IPRoute of another netns got this netns's raw socket"
            with netns.entered(fd):
                assert links.host_rtnl(there) is None  # a visiting thread keeps no socket of a job's netns
                assert links.host_rtnl(here) is None
            assert links.host_rtnl(here) is raw
            # The NAT mode's host side with `there`: through pyroute2, into `there`'s netns.
            cfg = Config(run_dir=f"{tmp_path}/run", state_dir=f"{tmp_path}/state", uplink="a2",
                         subnet="10.5.0.0/24").validate()
            idx = there.link_lookup(ifname="a1")[0]
            there.link("set", index=idx, state="up")
            net = JobNetwork(NetworkPlan(job_id="1.0", slot="s", key="s", network_type="nat"))
            net = net.with_addresses(ipv4="10.5.0.9", ipv4_prefix=32, gateway4=str(cfg.gateway))
            mode = NatMode(NatSection.from_config(cfg))
            mode.attach(there, idx, net, JobNames("s"))
        assert "10.5.0.9 proto static scope link" in sh("ip", "-n", ns, "route", "show", "dev", "a1")
        assert f"{cfg.gateway}/32" in sh("ip", "-n", ns, "addr", "show", "dev", "a1")
    finally:
        os.close(fd)


@pytest.mark.parametrize("route", ["none", "via_device", "mtu_metric"])
def test_the_mtu_of_the_route_out_is_what_pyroute2_reads(ns: str, route: str) -> None:
    sh("ip", "-n", ns, "link", "set", "a1", "mtu", "1450", "up")
    sh("ip", "-n", ns, "link", "set", "a2", "mtu", "9000", "up")
    sh("ip", "-n", ns, "addr", "add", "10.4.0.2/24", "dev", "a1")
    if route == "via_device":
        sh("ip", "-n", ns, "route", "add", "default", "via", "10.4.0.1", "dev", "a1")
    elif route == "mtu_metric":
        sh("ip", "-n", ns, "route", "add", "default", "via", "10.4.0.1", "dev", "a1", "mtu", "1400")
    want = {"none": 9000, "via_device": 1450, "mtu_metric": 1400}[route]
    fd = fd_of(ns)
    try:
        with netns.entered(fd):
            ipr = IPRoute()
            with ipr:  # a visiting thread: pyroute2 (larkd's host side is the raw path, tested below)
                assert mtu.route_out_mtu(ipr, "a2") == want
                assert mtu.device_mtu(ipr, "a1") == 1450
                assert mtu.device_mtu(ipr, "nonesuch") is None
        with netns.netlink_in(fd) as other:  # a JobNetlink: its own raw socket
            assert mtu.route_out_mtu(other, "a2") == want
        with netns.entered(fd):
            via_pyroute2 = IPRoute()
        with via_pyroute2:  # this thread is not in its netns: the pyroute2 path
            assert links.host_rtnl(via_pyroute2) is None
            assert mtu.route_out_mtu(via_pyroute2, "a2") == want
            assert mtu.device_mtu(via_pyroute2, "nonesuch") is None
    finally:
        os.close(fd)


def test_the_default_route_dump_is_what_pyroute2_returns_among_host_routes(ns: str) -> None:
    """A host with a /32 route per job and default routes in two tables: the raw dump (pyroute2's own
    default_routes parser on our socket) returns what IPRoute.get_default_routes returns, in the same order."""
    sh("ip", "-n", ns, "link", "set", "a1", "mtu", "1450", "up")
    sh("ip", "-n", ns, "addr", "add", "10.4.0.2/24", "dev", "a1")
    for i in range(1, 60):
        sh("ip", "-n", ns, "route", "add", f"10.9.0.{i}/32", "dev", "a1", "scope", "link")
    sh("ip", "-n", ns, "route", "add", "default", "via", "10.4.0.1", "dev", "a1", "mtu", "1400")
    sh("ip", "-n", ns, "route", "add", "default", "via", "10.4.0.3", "dev", "a1", "table", "100")
    fd = fd_of(ns)
    try:
        with netns.entered(fd):
            ipr = IPRoute()
            with ipr:
                want = [((r.get_attr("RTA_METRICS") or None) and r.get_attr("RTA_METRICS").get_attr("RTAX_MTU"),
                         r.get_attr("RTA_OIF")) for r in ipr.get_default_routes(family=2)]
        with netns.netlink_in(fd) as nipr:
            got = nipr.rtnl.default_routes()
        idx = int(json.loads(sh("ip", "-n", ns, "-j", "link", "show", "a1"))[0]["ifindex"])
        assert sorted(got, key=str) == sorted([(1400, idx), (None, idx)], key=str)
        assert got == want
    finally:
        os.close(fd)


# In a netns of the test's own (the raw path serves only larkd's home netns): one veth made through the raw socket
# into job netns j1, the same made through pyroute2 (an IPRoute of another "host" netns, h2) into j2; twice each
# (EEXIST). The job end is brought up with rtnl.link_index broken: its index must come from the create's echo.
VETH = r"""
import json, os, sys
from pyroute2 import IPRoute
from lark.errors import LarkError
from lark.kernel import links, netns, rtnl

def fd(name):
    return os.open(f"/run/netns/{name}", os.O_RDONLY)

h2, j1, j2 = sys.argv[1:4]
echoes = tuple(int(x) for x in os.uname().release.split(".")[:2]) >= (6, 3)  # NLM_F_ECHO on RTM_NEWLINK
out = {}
def no_lookup(*a):
    raise AssertionError("an index was read back")
with IPRoute() as here:
    real_link = rtnl.Rtnl._link
    if echoes:
        rtnl.Rtnl._link = no_lookup
    made = links.create_veth(here, "lk-a", "eth0", fd(j1), "1.0", "02:00:00:00:00:07", 1400)
    rtnl.Rtnl._link = real_link
    out["raw"] = list(made)
    real, rtnl.Rtnl.link_index = rtnl.Rtnl.link_index, no_lookup
    with netns.netlink_in(fd(j1)) as nipr:
        out["raw_up"] = links.bring_up_job_side(nipr, "eth0")
    rtnl.Rtnl.link_index = real
    try:
        links.create_veth(here, "lk-a", "eth0", fd(j1), "1.0")
    except LarkError as e:
        out["raw_again"] = str(e)
with netns.entered(fd(h2)):
    there = IPRoute()
with there:
    out["pyroute2"] = links.create_veth(there, "lk-a", "eth0", fd(j2), "1.0", "02:00:00:00:00:07", 1400)
    with netns.netlink_in(fd(j2)) as nipr:
        out["pyroute2_up"] = links.bring_up_job_side(nipr, "eth0")
    try:
        links.create_veth(there, "lk-a", "eth0", fd(j2), "1.0")
    except LarkError as e:
        out["pyroute2_again"] = str(e)
print(json.dumps(out))
"""


def link_view(ns: str, dev: str) -> dict:
    """`ip -d link show DEV` without what differs between two equal devices (indexes, the random MAC of the host
    end, the peer's netns id, carrier timing)."""
    d = json.loads(sh("ip", "-n", ns, "-d", "-j", "link", "show", dev))[0]
    for k in ("ifindex", "link_index", "link_netnsid", "operstate", "broadcast", "link", "altnames"):
        d.pop(k, None)
    if dev.startswith("lk-"):
        d.pop("address", None)
    d["flags"] = sorted(f for f in d["flags"] if f not in ("NO-CARRIER", "LOWER_UP"))
    return d


def test_the_veth_made_on_the_raw_socket_is_pyroute2s_and_its_indexes_come_from_the_echo() -> None:
    names = [f"lark-rtnl-{secrets.token_hex(3)}" for _ in range(4)]  # h1 (where it runs), h2, j1, j2
    for n in names:
        sh("ip", "netns", "add", n)
    try:
        h1, h2, j1, j2 = names
        cp = subprocess.run(["ip", "netns", "exec", h1, sys.executable, "-c", VETH, h2, j1, j2], capture_output=True,
                            text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
        assert cp.returncode == 0, cp.stderr
        out = json.loads(cp.stdout)
        host_idx = json.loads(sh("ip", "-n", h1, "-j", "link", "show", "lk-a"))[0]["ifindex"]
        job_idx = json.loads(sh("ip", "-n", j1, "-j", "link", "show", "eth0"))[0]["ifindex"]
        assert out["raw"] == [host_idx, job_idx] and out["raw_up"] == job_idx
        assert out["pyroute2"] is None  # made through the IPRoute: the caller looks the indexes up
        assert out["pyroute2_up"] == json.loads(sh("ip", "-n", j2, "-j", "link", "show", "eth0"))[0]["ifindex"]
        assert out["raw_again"] == out["pyroute2_again"] and "already exists" in out["raw_again"]
        assert link_view(h1, "lk-a") == link_view(h2, "lk-a")
        assert link_view(j1, "eth0") == link_view(j2, "eth0")
        raw_host = link_view(h1, "lk-a")
        assert raw_host["mtu"] == 1400 and "UP" in raw_host["flags"] and raw_host["linkinfo"]["info_kind"] == "veth"
        assert link_view(j1, "eth0")["address"] == "02:00:00:00:00:07"
    finally:
        for n in names:
            subprocess.run(["ip", "netns", "del", n])


SHAPING = r"""
import json, os, sys
from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError
from lark.errors import LarkError
from lark.kernel import links, netns, shaping

def fd(name):
    return os.open(f"/run/netns/{name}", os.O_RDONLY)

h2, j1, j2, step = sys.argv[1:5]
first, then = shaping.limit_for(100), shaping.limit_for(40_000)  # 40 Gbit/s: the 64-bit rate fields
out = {}
with IPRoute() as here:  # the raw path: larkd's host IPRoute and its thread's raw socket; netlink_in's
    assert links.host_rtnl(here) is not None
    if step == "make":
        made = links.create_veth(here, "lk-a", "eth0", fd(j1), "1.0")
        with netns.netlink_in(fd(j1)) as nipr:
            idx = links.bring_up_job_side(nipr, "eth0")
            shaping.apply(here, made.host, nipr, idx, first, "1.0")
            assert nipr._ipr is None, "the raw path made an IPRoute in the job's netns"
            try:
                shaping.apply(here, made.host, nipr, idx, first, "1.0")
            except LarkError as e:
                out["raw_again"] = str(e)
    else:
        with netns.netlink_in(fd(j1)) as nipr:
            shaping.change(here, here.link_lookup(ifname="lk-a")[0], nipr, nipr.rtnl.link_index("eth0"), then, "1.0")
with netns.entered(fd(h2)):
    there = IPRoute()
with netns.entered(fd(j2)):
    job = IPRoute()
with there, job:  # the pyroute2 path: an IPRoute of another netns each
    assert links.host_rtnl(there) is None and links.host_rtnl(job) is None
    if step == "make":
        links.create_veth(there, "lk-a", "eth0", fd(j2), "1.0")
        idx = links.bring_up_job_side(job, "eth0")
        shaping.apply(there, there.link_lookup(ifname="lk-a")[0], job, idx, first, "1.0")
        try:
            shaping.apply(there, there.link_lookup(ifname="lk-a")[0], job, idx, first, "1.0")
        except LarkError as e:
            out["pyroute2_again"] = str(e)
    else:
        shaping.change(there, there.link_lookup(ifname="lk-a")[0], job, job.link_lookup(ifname="eth0")[0], then,
                       "1.0")
print(json.dumps(out))
"""


def tc_view(ns: str, dev: str) -> list[str]:
    """What `tc -s -d` shows of a device's qdiscs, classes and filters, without the traffic counters (indented
    lines: the devices are up, so each end counts whatever IPv6 sent when, and its tokens refill meanwhile)."""
    return ["\n".join(ln for ln in sh("ip", "netns", "exec", ns, "tc", "-s", "-d", what, "show", "dev", dev)
                       .splitlines() if not ln.startswith(" "))
            for what in ("qdisc", "class", "filter")]


def test_the_limits_set_on_the_raw_socket_are_pyroute2s() -> None:
    """shaping.apply and shaping.change through larkd's raw sockets (host and job netns) leave on both veth ends
    what they leave through pyroute2's IPRoute, as `tc -s -d` shows it, and fail alike."""
    names = [f"lark-rtnl-{secrets.token_hex(3)}" for _ in range(4)]  # h1 (where it runs), h2, j1, j2
    for n in names:
        sh("ip", "netns", "add", n)
    try:
        h1, h2, j1, j2 = names
        for step in ("make", "change"):
            cp = subprocess.run(["ip", "netns", "exec", h1, sys.executable, "-c", SHAPING, h2, j1, j2, step],
                                capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
            assert cp.returncode == 0, cp.stderr
            out = json.loads(cp.stdout)
            if step == "make":
                assert out["raw_again"] == out["pyroute2_again"] and "File exists" in out["raw_again"]
            raw_host, raw_job = tc_view(h1, "lk-a"), tc_view(j1, "eth0")
            assert raw_host == tc_view(h2, "lk-a")
            assert raw_job == tc_view(j2, "eth0")
            rate = "100Mbit" if step == "make" else "40Gbit"
            for view in (raw_host, raw_job):
                assert "qdisc htb 1: root" in view[0] and "default 0x1" in view[0]
                assert "class htb 1:1 root prio 0 quantum" in view[1] and f"rate {rate} ceil {rate}" in view[1]
    finally:
        for n in names:
            subprocess.run(["ip", "netns", "del", n])


def test_index_by_name_reads_indexes_on_the_raw_socket_and_says_none_for_a_missing_device(ns: str) -> None:
    """links.index_by_name (fair share asks it for every running job at each setup): in a job's netns through its
    raw socket, without making the pyroute2 IPRoute there, and the same answers as pyroute2's link_lookup."""
    fd = fd_of(ns)
    try:
        with netns.netlink_in(fd) as nipr:
            got = (links.index_by_name(nipr, "a1"), links.index_by_name(nipr, "lo"),
                   links.index_by_name(nipr, "no-such-dev"))
            assert nipr._ipr is None   # no IPRoute was made in the job's netns
            want = tuple(hits[0] if hits else None for hits in (nipr.link_lookup(ifname=n)
                                                                for n in ("a1", "lo", "no-such-dev")))
    finally:
        os.close(fd)
    assert got == want and got[1] == 1 and got[2] is None and got[0] is not None
