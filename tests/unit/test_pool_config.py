"""The pool testbed writes larkd and lark-controller configs: they must pass the real loaders (a renamed key or a
broken policy expression shows up here, not as a pool that never gets ready)."""
import ipaddress
import sys
import tomllib
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "testbed"))
import pool  # noqa: E402

from lark import config  # noqa: E402


@pytest.mark.parametrize("ep", pool.EPS)
def test_each_eps_larkd_config_loads_and_keeps_jobs_apart(ep, monkeypatch):
    monkeypatch.setattr(pool, "controller_available", lambda: True)
    lines = [line for line in pool.lark_knobs(ep).splitlines() if line.startswith("LARK_")]
    knobs = {name[len("LARK_"):].lower(): value for name, _, value in (line.partition(" = ") for line in lines)}
    cfg = config.from_knobs(knobs)
    assert cfg.default_network_type == "bridge" and cfg.job_mac_seed == ep
    assert cfg.controller_url == f"https://{pool.ADDRESS['cm']}:{pool.REGISTRATION_PORT}"
    assert cfg.controller_cert.endswith(f"/{ep}.pem") and cfg.controller_failure == "closed"


def test_job_ranges_are_disjoint_inside_the_site_subnet_and_miss_every_machine():
    site = ipaddress.ip_network(f"{pool.GATEWAY}/{pool.SITE_PREFIX}", strict=False)
    ranges = []
    for ep in pool.EPS:
        lo, hi = (ipaddress.ip_address(x) for x in pool.JOB_RANGE[ep].split("-"))
        assert lo in site and hi in site
        ranges.append((lo, hi))
    ranges.sort()
    assert all(a[1] < b[0] for a, b in zip(ranges, ranges[1:]))
    fixed = [ipaddress.ip_address(a) for a in [pool.GATEWAY, *pool.ADDRESS.values()]]
    assert not any(lo <= a <= hi for a in fixed for lo, hi in ranges)


def test_controller_config_and_policies_load():
    from lark.controller.config import from_mapping
    cfg = from_mapping(tomllib.loads(pool.controller_config()), base_dir=str(pool.POOL))
    assert cfg.wan_ports == ["wan0", "wan1"]
    assert {p.kind for p in cfg.policies} == {"drop", "slice", "wan_drop", "wan_steer"}
    assert cfg.cert == str(pool.CERTS / "controller.pem")
    assert ipaddress.ip_address(pool.WAN_SERVER) not in ipaddress.ip_network(cfg.site_prefixes[0])


def test_condor_config_gives_each_machine_its_role():
    cm, ep = pool.condor_config("cm"), pool.condor_config("ep1")
    assert "DAEMON_LIST = MASTER COLLECTOR NEGOTIATOR SCHEDD\n" in cm and "LARKD" not in cm
    assert "DAEMON_LIST = MASTER STARTD LARKD\n" in ep and 'LarkPoolEP = "ep1"' in ep
    assert f"NETWORK_INTERFACE = {pool.ADDRESS['ep1']}" in ep
    assert all(f"CONDOR_HOST = {pool.ADDRESS['cm']}" in c for c in (cm, ep))


def test_controller_certificates_pass_strict_x509_verification(tmp_path):
    # The pool's EPs run larkd on Python 3.14, whose default TLS context verifies strictly (VERIFY_X509_STRICT,
    # Python >= 3.13): certificates without key identifiers were refused there.
    import shutil
    import subprocess
    if not shutil.which("openssl"):
        pytest.skip("no openssl")
    from lark.controller.certs import make
    make(str(tmp_path), ["controller=10.77.0.2", "ep1"])
    cp = subprocess.run(["openssl", "verify", "-x509_strict", "-CAfile", str(tmp_path / "ca.pem"),
                         str(tmp_path / "controller.pem"), str(tmp_path / "ep1.pem")], capture_output=True, text=True)
    assert cp.returncode == 0, cp.stdout + cp.stderr


def test_demo_pool_checks_what_the_jobs_saw_against_the_policies():
    """make demo-pool exits 1 when a job saw something the policies forbid (or missed what they allow)."""
    import pool_probe
    jobs = pool_probe.policy_jobs()
    right = {
        "alice@ep1": {"alice2@ep1": "reached", "bob@ep1": "blocked (timed out)", "alice@ep2": "reached",
                      "bob@ep2": "blocked (timed out)", "carol@ep2": "blocked (timed out)", "wan": "wan0"},
        "alice2@ep1": {"alice@ep1": "reached", "bob@ep1": "blocked (x)", "alice@ep2": "reached", "bob@ep2": "blocked",
                       "carol@ep2": "blocked", "wan": "wan0"},
        "bob@ep1": {"alice@ep1": "blocked", "alice2@ep1": "blocked", "alice@ep2": "blocked", "bob@ep2": "reached",
                    "carol@ep2": "blocked", "wan": "wan1"},
        "alice@ep2": {"alice@ep1": "reached", "alice2@ep1": "reached", "bob@ep1": "blocked", "bob@ep2": "blocked",
                      "carol@ep2": "blocked", "wan": "blocked (timed out)"},
        "bob@ep2": {"alice@ep1": "blocked", "alice2@ep1": "blocked", "bob@ep1": "reached", "alice@ep2": "blocked",
                    "carol@ep2": "blocked", "wan": "wan1"},
        "carol@ep2": {"alice@ep1": "blocked", "alice2@ep1": "blocked", "bob@ep1": "blocked", "alice@ep2": "blocked",
                      "bob@ep2": "blocked", "wan": "blocked"},
    }
    for j in jobs:
        j.seen = dict(right[j.label])
    assert pool_probe.policy_mismatches(jobs) == []
    jobs[5].seen["alice@ep1"] = "reached"          # carol got through
    jobs[2].seen["wan"] = "wan0"                   # bob not steered
    del jobs[0].seen["bob@ep2"]                    # a probe that never reported
    assert pool_probe.policy_mismatches(jobs) == [
        "alice@ep1 -> bob@ep2: expected blocked, saw no result",
        "bob@ep1 -> wan: expected wan1, saw wan0",
        "carol@ep2 -> alice@ep1: expected blocked, saw reached"]
