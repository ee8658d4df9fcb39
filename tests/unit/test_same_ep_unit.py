"""larkd's side of same-EP isolation, without a kernel: the netdev rules it compiles and its errors."""
from types import SimpleNamespace

import pytest
from pyroute2.netlink.exceptions import NetlinkError

from lark.errors import LarkError
from lark.kernel.attach import isolation
from lark.kernel.firewall import same_ep
from lark.kernel.firewall.nftables import JOB_CHAINS, bridge_allowlist

MAC = "02:aa:bb:cc:dd:ee"
PLAN = SimpleNamespace(ipv4="10.77.0.100", ipv6=None)


def rules(cmds, chain):
    return [c["add"]["rule"]["expr"] for c in cmds if "rule" in c.get("add", {}) and c["add"]["rule"]["chain"] == chain]


def test_frames_for_other_jobs_of_the_ep_pass_the_allowlist_then_go_out_of_the_uplink():
    cmds = same_ep.job_cmds("lark", "eth0", "lk-slot1", "j_slot1", MAC, PLAN)
    base = next(c["add"]["chain"] for c in cmds if c.get("add", {}).get("chain", {}).get("name") == "j_slot1_hp")
    assert (base["hook"], base["dev"], base["policy"]) == ("ingress", "lk-slot1", "accept")
    hp = rules(cmds, "j_slot1_hp")
    # first: anything not for a job of this EP goes on to the bridge untouched
    assert hp[0][0]["match"] == {"op": "!=", "left": {"payload": {"protocol": "ether", "field": "daddr"}},
                                 "right": "@same_ep_jobs"} and hp[0][1] == {"accept": None}
    # then the bridge table's own allowlist, where every "accept" became "count and send up", the drops stay
    allow = bridge_allowlist(PLAN, MAC)
    assert len(hp) == 1 + len(allow)
    for got, want in zip(hp[1:], allow):
        assert got == [{"goto": {"target": "j_slot1_hpf"}} if e == {"accept": None} else e for e in want]
    assert {"accept": None} not in sum(hp[1:], []) and hp[-1] == [{"drop": None}]
    up = rules(cmds, "j_slot1_hpf")
    assert up[0][-1] == {"counter": "j_slot1_out"} and up[1] == [{"fwd": {"dev": "eth0"}}]
    # the job's MAC joins the EP's set; its chains are ones the nftables driver removes with the job
    assert {"add": {"element": {"family": "netdev", "table": "lark", "name": "same_ep_jobs", "elem": [MAC]}}} in cmds
    assert {"hp", "hpf"} <= set(JOB_CHAINS)


class FakeIPRoute:
    def __init__(self, refuse: bool = False, keeps: bool = True):
        self.refuse, self.keeps = refuse, keeps

    def brport(self, *a, **kw):
        if self.refuse:
            raise NetlinkError(95, "Operation not supported")

    def fdb(self, cmd, **kw):
        return []

    def get_links(self, idx):
        return [SimpleNamespace(get_nested=lambda *path: 1 if self.keeps else None)]


@pytest.mark.parametrize("ipr, words", [(FakeIPRoute(refuse=True), "refused port isolation"),
                                        (FakeIPRoute(keeps=False), "did not keep the port isolated")])
def test_a_kernel_without_isolation_refuses_the_job_clearly(ipr, words):
    with pytest.raises(LarkError) as e:
        isolation.isolate_port(ipr, 7, MAC, "12.0", "lkbr0")
    msg = str(e.value)
    assert words in msg and "job 12.0" in msg and "lkbr0" in msg and "bridge_isolate_jobs = false" in msg
