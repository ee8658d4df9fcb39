"""`lark status --verify` on the real kernel: a running job's objects removed by hand are reported, exit status 1."""
import json

from helpers.fakehost import sh
from helpers.waits import wait_ready

from lark.names import JobNames

BRIDGE_CFG = dict(default_network_type="bridge", bridge_name="lkbr0", bridge_uplink="up0",
                  bridge_range="198.51.100.100-198.51.100.149", bridge_prefix=24, bridge_gateway="198.51.100.1",
                  bridge_isolate_jobs=True)


def _verify(host) -> tuple[int, dict]:
    cp = host.lark("status", "--verify", "--json", check=False)
    assert cp.returncode in (0, 1), cp.stderr + host.larkd_log()
    return cp.returncode, json.loads(cp.stdout)


def test_a_running_nat_jobs_qdisc_and_chain_removed_by_hand_are_reported(host):
    host.publish_ad("slot1", "ClusterId = 61\nProcId = 0", "Bandwidth = 20")
    host.spawn_job("slot1", ["sleep", "60"], job_ad="ClusterId = 61\nProcId = 0")
    job = wait_ready(host, "slot1")
    rc, got = _verify(host)
    assert rc == 0 and got["drift"] == [] and got["jobs"] == 1 and got["objects"] > 10, got
    text = host.lark("status", "--verify").stdout
    assert text.startswith("no drift: 1 running job(s), ") and "kernel objects as their records say" in text

    host_if, nft = job["host_if"], JobNames(job["key"]).nft_id
    table = host.cfg.nft_table
    sh(host.in_host(["tc", "qdisc", "del", "dev", host_if, "root"]))
    # The job's forward chain hangs on its element in the fwd_from_job verdict map: both go.
    sh(host.in_host(["nft", "delete", "element", "inet", table, "fwd_from_job", "{", host_if, "}"]))
    sh(host.in_host(["nft", "delete", "chain", "inet", table, f"{nft}_out"]))
    rc, got = _verify(host)
    assert rc == 1, got
    rows = {r["object"]: r for r in got["drift"]}
    assert set(rows) == {f"tc htb on {host_if} (toward the job)", f"nft chain inet {table} {nft}_out",
                         f"nft element {host_if} of inet {table} fwd_from_job"}, got
    assert "limit is off" in rows[f"tc htb on {host_if} (toward the job)"]["problem"]
    assert all(r["job"] == "61.0" and r["slot"] == "slot1" and "condor_vacate_job 61.0" in r["fix"]
               for r in rows.values())
    cp = host.lark("status", "--verify", check=False)
    assert cp.returncode == 1 and f"{nft}_out" in cp.stdout and "3 object(s) drifted" in cp.stderr


def test_iptables_backend_a_flushed_job_chain_is_reported(fakehost_factory):
    host = fakehost_factory(firewall="iptables")
    host.spawn_job("slot1", ["sleep", "60"], job_ad="ClusterId = 63\nProcId = 0")
    key = wait_ready(host, "slot1")["key"]
    rc, got = _verify(host)
    assert rc == 0 and got["drift"] == [], got
    sh(host.in_host(["iptables", "-F", f"LARK-{key}-IN"]))
    rc, got = _verify(host)
    assert rc == 1 and [(r["object"], r["problem"]) for r in got["drift"]] == [
        (f"iptables chain filter LARK-{key}-IN", "0 rule(s) where setup put 2")], got


def test_a_bridged_job_taken_off_its_bridge_is_reported(fakehost_factory):
    host = fakehost_factory(**BRIDGE_CFG)
    host.spawn_job("slot1", ["sleep", "60"], job_ad="ClusterId = 62\nProcId = 0")
    job = wait_ready(host, "slot1")
    rc, got = _verify(host)   # with its isolated port, pinned MAC and same-EP chains (bridge_isolate_jobs)
    assert rc == 0 and got["drift"] == [], got
    sh(host.in_host(["ip", "link", "set", job["host_if"], "nomaster"]))
    rc, got = _verify(host)
    assert rc == 1 and [r["object"] for r in got["drift"]] == [f"port {job['host_if']} of bridge lkbr0"], got
