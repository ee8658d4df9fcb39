"""Callouts, `lark policy explain`, the shipped policies/ files, and hostile ads (hypothesis)."""
import json
import re
import stat
import subprocess
import sys
from pathlib import Path

import classad2
import pytest
from hypothesis import given, settings, strategies as st

from lark.policy.classads import parse_ad, read_ad
from lark.config import Config
from lark.errors import LarkError
from lark.plan import NETWORK_TYPES
from lark.policy.engine import decide

ROOT = Path(__file__).resolve().parents[2]
VLAN_CALLOUT = str(ROOT / "callouts" / "vlan_by_name.py")


def script(tmp_path, body):
    p = tmp_path / "callout"
    p.write_text(f"#!{sys.executable}\n{body}\n")
    p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return str(p)


def run(job, machine="", callout="", timeout=5.0):
    cfg = Config(callout=callout, callout_timeout=timeout, bandwidth_mbit=1000)
    return decide(parse_ad(job, "job"), parse_ad(machine, "machine"), cfg, "slot1", "slot1")


def test_vlan_callout_maps_name_to_id():
    p = run('ClusterId = 1\nProcId = 0\nRequestedVLAN = "physics"', callout=VLAN_CALLOUT)
    assert p.vlan == 100 and "callout" in p.decided_by["vlan"]
    with pytest.raises(LarkError, match="vlan_by_name.py.*unknown VLAN name 'biology'"):
        run('RequestedVLAN = "biology"', callout=VLAN_CALLOUT)
    assert run("", callout=VLAN_CALLOUT).vlan is None


def test_callout_sees_job_separator_machine(tmp_path):
    out = tmp_path / "seen"
    c = script(tmp_path, f"import sys; open({str(out)!r}, 'w').write(sys.stdin.read()); print('NetworkType = \"none\"')")
    p = run("ClusterId = 9\nProcId = 1", 'AddressType = "static"', callout=c)
    seen = out.read_text()
    job_part, machine_part = seen.split("\n------\n")
    assert "ClusterId = 9" in job_part and 'AddressType = "static"' in machine_part
    assert p.network_type == "none" and p.decided_by["network_type"].startswith("callout")


@pytest.mark.parametrize("body,needle", [
    ("import sys; sys.exit(3)", "exited with 3"),
    ("import time; time.sleep(5)", "did not finish within 0.5 s"),
    ("print('this is = = not an ad')", "output of callout"),
])
def test_callout_failures_name_the_callout(tmp_path, body, needle):
    c = script(tmp_path, body)
    with pytest.raises(LarkError) as e:
        run("ClusterId = 2\nProcId = 0", callout=c, timeout=0.5)
    assert needle in str(e.value) and c in str(e.value) and "job 2.0" in str(e.value)


def test_missing_callout(tmp_path):
    with pytest.raises(LarkError, match="does not exist"):
        run("", callout=str(tmp_path / "nope"))


def test_explain_cli_reads_condor_q_output_and_new_format(tmp_path):
    job = tmp_path / "job.ad"
    job.write_text('ClusterId = 3\nProcId = 0\nInboundConnectivity = true\nOutboundConnectivity = true\n\n'
                   'ClusterId = 4\nProcId = 0\n')
    machine = tmp_path / "machine.ad"
    machine.write_text("[ TotalBandwidth = 1000; " + (ROOT / "policies/network_type_by_connectivity.ad").read_text()
                       .split("\n")[-2] + " ]")
    cp = subprocess.run([sys.executable, "-m", "lark.cli", "policy", "explain", "--job", str(job), "--machine",
                         str(machine), "--json"], capture_output=True, text=True, cwd=ROOT)
    assert cp.returncode == 0, cp.stderr
    out = json.loads(cp.stdout)
    assert out["plan"]["network_type"] == "bridge"
    assert "NetworkType" in out["decided_by"]["network_type"]
    bad = tmp_path / "bad.ad"
    bad.write_text("InboundConnectivity = = true")
    cp = subprocess.run([sys.executable, "-m", "lark.cli", "policy", "explain", "--job", str(bad), "--machine",
                         str(machine)], capture_output=True, text=True, cwd=ROOT)
    assert cp.returncode == 1 and "bad.ad" in cp.stderr and "Traceback" not in cp.stderr


def pol(name):
    return read_ad(str(ROOT / "policies" / name))


def test_vlan_mutual_requirements_match_only_same_vlan():
    machine = pol("vlan_machine.ad")  # VLAN "chemistry"
    physics_job = pol("vlan_job.ad")
    assert not physics_job.symmetricMatch(machine)
    chem_job = classad2.ClassAd()
    chem_job.update(physics_job)
    chem_job["RequestedVLAN"] = "chemistry"
    assert chem_job.symmetricMatch(machine)
    plain_job = classad2.parseOne("[Requirements = true]")
    # x.matches(y) evaluates y's Requirements against x: no VLAN asked, the machine accepts the job.
    assert plain_job.matches(machine) and plain_job.symmetricMatch(machine)


def test_ip_protocol_requirements():
    job = pol("ip_protocol_job.ad")
    assert classad2.parseOne('[IPProtocol = "IPv4"]').matches(job)
    assert not classad2.parseOne('[IPProtocol = "IPv6"]').matches(job)
    assert not classad2.parseOne("[]").matches(job)


def test_shipped_network_type_policy_and_accounting():
    machine = pol("network_type_by_connectivity.ad")
    cfg = Config(bandwidth_mbit=1000)
    assert decide(pol("accounting_optional_job.ad"), machine, cfg, "slot1", "slot1").network_type == "nat"
    assert decide(pol("accounting_optional_job.ad"), machine, cfg, "slot1", "slot1").accounting is True


# -- property-based: random and hostile ads never crash, always a valid plan or a clear LarkError ----------
ATTRS = ["IPProtocol", "RequestBandwidth", "NetworkAccounting", "InboundConnectivity", "OutboundConnectivity",
         "RequestedVLAN", "NetworkType", "AddressType", "BridgeInterface", "VLAN", "InternalInterface"]
hostile_strings = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["eth0; reboot", "$(rm -rf /)", "`id`", "br0\n", "../../etc", "a" * 5000, "NAT", "null",
                     "ovs_bridge", "IPv4+IPv6", "physics", "\x00", "' OR 1=1"]),
)
values = st.one_of(
    st.booleans(), st.integers(-10**12, 10**12), st.floats(allow_nan=True, allow_infinity=True),
    hostile_strings.filter(lambda s: "\x00" not in s).map(lambda s: classad2.quote(s)),
    st.sampled_from(["undefined", "error", "{1,2}", "[a=1]", "TARGET.InboundConnectivity", "MY.NetworkType",
                     "ifThenElse(TARGET.OutboundConnectivity, \"bridge\", \"null\")", "1/0",
                     "strcat(\"a\", \"b\")", "(" * 50 + "1" + ")" * 50]),
)


def _expr(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v) if v == v and abs(v) != float("inf") else "real(\"INF\")"
    return str(v)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(ATTRS), values, max_size=8),
       st.dictionaries(st.sampled_from(ATTRS), values, max_size=8))
def test_random_ads_give_valid_plan_or_clear_error(job_attrs, machine_attrs):
    try:
        job = parse_ad("\n".join(f"{k} = {_expr(v)}" for k, v in job_attrs.items()), "job")
        machine = parse_ad("\n".join(f"{k} = {_expr(v)}" for k, v in machine_attrs.items()), "machine")
    except LarkError as e:
        assert e.obj in ("job", "machine") and e.fix  # an ad that does not parse: named, with a fix
        return
    try:
        p = decide(job, machine, Config(bandwidth_mbit=1000), "slot1", "slot1")
    except LarkError as e:
        # A refusal names the job, the attribute it refused (on which side), and a fix.
        assert e.job and e.fix, str(e)
        m = re.match(r"(job|machine) attribute (\w+) = ", e.obj or "")
        assert (m and m.group(2) in ATTRS) or e.obj in ("IPProtocol", "RequestedVLAN", "VLAN"), e.obj
        return
    assert p.network_type in NETWORK_TYPES
    assert isinstance(p.inbound, bool) and isinstance(p.outbound, bool)
    assert p.vlan is None or (isinstance(p.vlan, int) and 1 <= p.vlan <= 4094)
    assert p.address_type in ("static", "dhcp")
    if not p.inbound and not p.outbound:
        assert p.network_type == "none"


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=2000))
def test_arbitrary_text_gives_an_ad_or_a_clear_error(text):
    try:
        ad = parse_ad(text, "job")
    except LarkError as e:
        assert e.obj == "job", e.obj
        return
    assert isinstance(ad, classad2.ClassAd)


def test_deeply_nested_and_huge_ads():
    deep = "A = " + "(" * 2000 + "1" + ")" * 2000
    with pytest.raises(LarkError, match="job: not a valid ClassAd"):
        parse_ad(deep, "job")
    assert parse_ad("A = " + "(" * 50 + "1" + ")" * 50, "job").eval("A") == 1
    with pytest.raises(LarkError, match="larger than"):
        parse_ad("A = 1\n" * 300000, "job")
