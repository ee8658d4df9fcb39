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
    # both controllers of the pool (HA), one URL each
    assert cfg.controller_url == ",".join(f"https://{pool.ADDRESS['cm']}:{pool.REGISTRATION_PORT + i}"
                                          for i in range(pool.CONTROLLERS))
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


# The event log HTCondor 25.14 wrote for a file-transfer job on the one-machine testbed while a JOB_EXIT hook was
# configured (tests/e2e/test_condor_transfer.py): evicted during output transfer, started again.
REAL_LOG = """\
000 (007.000.000) 2026-11-25 17:56:29 Job submitted from host: <127.0.0.1:9618?sock=schedd_18771_ec54>
...
040 (007.000.000) 2026-11-25 17:56:37 Started transferring input files
\tTransferring to host: <127.0.0.1:9618?sock=slot1_1_18828_c777_9>
...
040 (007.000.000) 2026-11-25 17:56:37 Finished transferring input files
...
001 (007.000.000) 2026-11-25 17:56:38 Job executing on host: <127.0.0.1:9618?sock=startd_18771_ec54>
\tSlotName: slot1_1@127-0-0-1.lark.test
\tBandwidth = 0
\tCondorScratchDir = "/var/lib/condor/execute/dir_18981/scratch"
\tCpus = 1
\tDisk = 1048576
\tGPUs = 0
\tMemory = 128
...
006 (007.000.000) 2026-11-25 17:56:38 Image size of job updated: 175
\t6  -  MemoryUsage of job (MB)
\t5244  -  ResidentSetSize of job (KB)
...
040 (007.000.000) 2026-11-25 17:56:38 Started transferring output files
...
040 (007.000.000) 2026-11-25 17:56:38 Finished transferring output files
...
022 (007.000.000) 2026-11-25 17:56:38 Job disconnected, attempting to reconnect
    Socket between submit and execute hosts closed unexpectedly
    Trying to reconnect to slot1_1@127-0-0-1.lark.test <127.0.0.1:9618?sock=startd_18771_ec54>
...
024 (007.000.000) 2026-11-25 17:56:38 Job reconnection failed
    Job not found at execution machine
    Can not reconnect to slot1_1@127-0-0-1.lark.test, rescheduling job
...
004 (007.000.000) 2026-11-25 17:56:38 Job was evicted. Code 1008 Subcode 0
\t(0) CPU times
\t\tUsr 0 00:00:00, Sys 0 00:00:00  -  Run Remote Usage
\t\tUsr 0 00:00:00, Sys 0 00:00:00  -  Run Local Usage
\t0  -  Run Bytes Sent By Job
\t2  -  Run Bytes Received By Job
\tReason: Job not found at execution machine
\tPartitionable Resources :    Usage  Request Allocated
\t   Bandwidth            :                           0
\t   Cpus                 :        0        1         1
\t   Disk (KB)            :       16  1048576   1048576
\t   GPUs                 :                           0
\t   Memory (MB)          :        6      128       128
\t   TimeExecute (s)      :        0
\t   TimeSlotBusy (s)     :        2
...
040 (007.000.000) 2026-11-25 17:56:47 Started transferring input files
\tTransferring to host: <127.0.0.1:9618?sock=slot1_1_18828_c777_12>
...
040 (007.000.000) 2026-11-25 17:56:47 Finished transferring input files
...
001 (007.000.000) 2026-11-25 17:56:48 Job executing on host: <127.0.0.1:9618?sock=startd_18771_ec54>
\tSlotName: slot1_1@127-0-0-1.lark.test
\tBandwidth = 0
\tCondorScratchDir = "/var/lib/condor/execute/dir_19001/scratch"
\tCpus = 1
\tDisk = 1048576
\tGPUs = 0
\tMemory = 128
...
"""
# Then, on the pool: another job started on ep1 and ended; job 7.0 is being evicted again (no `...` yet).
MORE_EVENTS = """\
001 (008.000.000) 2026-11-25 17:56:49 Job executing on host: <10.77.0.11:9618?addrs=10.77.0.11-9618&noUDP>
\tSlotName: slot2@ep1.lark.test
\tCondorScratchDir = "/var/lib/condor/execute/dir_19002/scratch"
...
005 (008.000.000) 2026-11-25 17:56:50 Job terminated.
\t(1) Normal termination (return value 0)
...
004 (007.000.000) 2026-11-25 17:56:51 Job was evicted. Code 1008 Subcode 0
"""


def test_event_log_starts_count_each_start_and_every_unasked_end(tmp_path):
    import eventlog
    log = tmp_path / "log.txt"
    log.write_text(REAL_LOG + MORE_EVENTS)
    # the last eviction has no `...` yet: half-written, left out until it is complete
    assert eventlog.starts(log) == {
        "7.0": ["execute", "disconnected", "reconnect failed", "evicted", "execute"], "8.0": ["execute"]}
    assert eventlog.not_once(log, ["7.0", "8.0", "9.0"]) == {
        "7.0": ["execute", "disconnected", "reconnect failed", "evicted", "execute"], "9.0": []}
    assert eventlog.describe("7.0", ["execute", "evicted", "execute"]) == (
        "job 7.0: started 2 times; its event log shows execute, evicted, execute")
    assert eventlog.starts(tmp_path / "missing.txt") == {}
    where = eventlog.last_execute(log, "7.0")
    assert (where.host, where.scratch) == ("127.0.0.1", "/var/lib/condor/execute/dir_19001/scratch")
    assert eventlog.last_execute(log, "9.0") is None
    log.write_text('<c>\n    <a n="MyType"><s>ExecuteEvent</s></a>\n</c>\n')
    with pytest.raises(ValueError, match="not a text job event log"):
        eventlog.starts(log)


def test_event_log_starts_agree_with_htcondors_own_reader(tmp_path):
    htcondor2 = pytest.importorskip("htcondor2")
    import eventlog
    log = tmp_path / "log.txt"
    log.write_text(REAL_LOG)
    names = {htcondor2.JobEventType.EXECUTE: "execute", htcondor2.JobEventType.JOB_EVICTED: "evicted",
             htcondor2.JobEventType.SHADOW_EXCEPTION: "shadow exception",
             htcondor2.JobEventType.JOB_DISCONNECTED: "disconnected",
             htcondor2.JobEventType.JOB_RECONNECT_FAILED: "reconnect failed"}
    theirs: dict = {}
    for e in htcondor2.JobEventLog(str(log)).events(stop_after=0):
        if e.type in names:
            theirs.setdefault(f"{e.cluster}.{e.proc}", []).append(names[e.type])
    assert eventlog.starts(log) == theirs


def test_a_running_jobs_scratch_directory_is_found_on_the_ep_its_execute_event_names(tmp_path, monkeypatch):
    monkeypatch.setattr(pool, "POOL", tmp_path)
    log = tmp_path / "log.txt"
    log.write_text(REAL_LOG + MORE_EVENTS)
    assert pool.job_scratch(log, "7.0") is None                   # its directory is gone: not running any more
    on_ep2 = tmp_path / "ep2/root/var/lib/condor/execute/dir_19001/scratch"
    on_ep2.mkdir(parents=True)
    assert pool.job_scratch(log, "7.0") == on_ep2                 # not an EP's address: whichever EP has it
    assert pool.job_scratch(log, "9.0") is None                   # not started
    on_ep1 = tmp_path / "ep1/root/var/lib/condor/execute/dir_19002/scratch"
    (tmp_path / "ep2/root/var/lib/condor/execute/dir_19002/scratch").mkdir(parents=True)
    assert pool.job_scratch(log, "8.0") is None                   # ep1's address: only ep1 counts
    on_ep1.mkdir(parents=True)
    assert pool.job_scratch(log, "8.0") == on_ep1


def test_probe_jobs_use_file_transfer_and_a_restart_is_reported():
    import pool_probe
    jobs = pool_probe.policy_jobs()
    sub = pool_probe.submit_file(jobs[0])
    for line in ("executable = /usr/bin/python3", "transfer_executable = false", "should_transfer_files = YES",
                 "when_to_transfer_output = ON_EXIT", "transfer_input_files = probe.py", "log = log.txt"):
        assert line + "\n" in sub
    assert pool_probe.start_problems(jobs) == []                  # not run: nothing read, nothing to report
    for n, j in enumerate(jobs):
        j.cluster, j.starts = 20 + n, ["execute"]
    jobs[1].starts = ["execute", "evicted", "execute"]
    jobs[3].starts = []
    assert pool_probe.start_problems(jobs) == [
        "alice2@ep1: job 21.0: started 2 times; its event log shows execute, evicted, execute",
        "alice@ep2: job 23.0: its event log shows no start"]
