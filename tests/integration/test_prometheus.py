"""A real Prometheus (Debian's `prometheus`, a child process of the test) scrapes a fake EP's larkd and a real
lark-controller with packaging/prometheus/lark-rules.yml loaded, and its HTTP API answers the questions the rules and
the dashboard ask: a job's bytes, per-group totals, setup-time quantiles, refused jobs; every rule evaluates.

Everything runs in the fake EP's own network namespace, on its loopback: larkd's and the controller's metrics,
Prometheus's listener (a fresh namespace, so its ports are free) and the test's queries."""
import json
import os
import shutil
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from helpers.fakehost import WORLD_IP
from helpers.sdn import SdnPool
from helpers.waits import wait_ready, wait_until

from lark.kernel import netns as nsutil

pytestmark = [pytest.mark.skipif(not shutil.which("prometheus"), reason="Prometheus is not installed (Debian "
                                 "package prometheus; make deps installs it)"),
              pytest.mark.skipif(not shutil.which("ovs-vswitchd"), reason="Open vSwitch is not installed")]
RULES = Path(__file__).resolve().parents[2] / "packaging" / "prometheus" / "lark-rules.yml"
LARKD_METRICS = "127.0.0.1:9813"
CONTROLLER_METRICS = "127.0.0.1:9814"
PROMETHEUS = "127.0.0.1:9090"
# Two jobs of two accounting groups download known sizes; a third is refused by its slot's policy.
JOBS = {"slot1": ("alice", "cms", 4_000_000), "slot2": ("bob", "atlas", 2_000_000)}


class MeteredPool(SdnPool):
    """The tests' controller pool with lark-controller's Prometheus metrics on."""

    def write_config(self) -> None:
        super().write_config()
        with open(self.cfg_path, "a") as f:
            f.write(f'\n[metrics]\naddress = "{CONTROLLER_METRICS}"\n')


class Prometheus:
    """Debian's prometheus binary as a child process in a netns: temp config and TSDB, 1 s scrapes and rules."""

    def __init__(self, tmp: Path, netns: str):
        self.tmp, self.netns = tmp, netns
        cfg = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
               "rule_files": [str(RULES)],
               "scrape_configs": [{"job_name": "larkd", "static_configs": [{"targets": [LARKD_METRICS]}]},
                                  {"job_name": "lark-controller",
                                   "static_configs": [{"targets": [CONTROLLER_METRICS]}]}]}
        (tmp / "prometheus.yml").write_text(json.dumps(cfg))   # JSON is YAML
        with open(tmp / "prometheus.log", "w") as log:   # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                ["nsenter", f"--net=/run/netns/{netns}", "prometheus", f"--config.file={tmp / 'prometheus.yml'}",
                 f"--storage.tsdb.path={tmp / 'tsdb'}", f"--web.listen-address={PROMETHEUS}"],
                stdout=log, stderr=log)

    def get(self, path: str, **params) -> dict:
        url = f"http://{PROMETHEUS}{path}?{urllib.parse.urlencode(params)}"
        fd = os.open(f"/run/netns/{self.netns}", os.O_RDONLY)
        try:
            with nsutil.entered(fd), urllib.request.urlopen(url, timeout=5) as r:
                body = json.load(r)
        finally:
            os.close(fd)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> dict:
        """Instant query: {frozenset of labels: value}."""
        result = self.get("/api/v1/query", query=expr)["result"]
        return {frozenset(s["metric"].items()): float(s["value"][1]) for s in result}

    def value(self, expr: str) -> float | None:
        got = self.query(expr)
        assert len(got) <= 1, (expr, got)
        return next(iter(got.values()), None)

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited with {self.proc.returncode}:\n{self.logs()}")
        try:
            return self.get("/api/v1/status/buildinfo") is not None
        except OSError:
            return False

    def logs(self) -> str:
        return (self.tmp / "prometheus.log").read_text()[-4000:]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@pytest.fixture
def pool_and_prometheus(fakehost_factory, tmp_path):
    host = fakehost_factory(metrics_address=LARKD_METRICS, bandwidth_mbit=1000)
    pool = MeteredPool(str(tmp_path / "sdn"), core_ns=host.host_ns)
    prom = None
    try:
        pool.start()
        prom = Prometheus(tmp_path, host.host_ns)
        yield host, prom
    finally:
        if prom is not None:
            prom.close()   # by its PID, before the namespace it runs in goes
        pool.close()


def test_prometheus_scrapes_larkd_and_the_controller_and_the_rules_answer(pool_and_prometheus):
    host, prom = pool_and_prometheus
    wait_until(prom.ready, "Prometheus's API", detail=prom.logs)
    # Both targets scraped before any job, so each series' first value is the one before the jobs (rate() sees them).
    wait_until(lambda: prom.value('sum(up{job=~"larkd|lark-controller"})') == 2, "both targets up",
               detail=lambda: json.dumps(prom.get("/api/v1/targets"))[:3000] + prom.logs())

    jobs = {}
    for n, (slot, (owner, group, size)) in enumerate(JOBS.items()):
        (host.www / f"{slot}.bin").write_bytes(os.urandom(size))
        ad = f'ClusterId = {80 + n}\nProcId = 0\nOwner = "{owner}"\nAcctGroup = "{group}"'
        host.publish_ad(slot, ad, "Bandwidth = 200")
        jobs[slot] = host.spawn_job(slot, ["download-then-sleep", f"http://{WORLD_IP}:8000/{slot}.bin", "30"],
                                    job_ad=ad)
    for slot, p in jobs.items():
        assert json.loads(p.stdout.readline())["downloaded"] == JOBS[slot][2], p.stderr.read() if p.poll() else ""
        wait_ready(host, slot)
    # A job its slot's policy refuses (a network type that does not exist): counted as a policy failure.
    host.publish_ad("slot3", 'ClusterId = 90\nProcId = 0\nOwner = "carol"', 'NetworkType = "bogus"')
    refused = host.run_job("slot3", ["env"], job_ad='ClusterId = 90\nProcId = 0\nOwner = "carol"')
    assert refused.returncode != 0 and "job 90.0" in refused.stderr, refused.stderr

    def larkd_bytes() -> dict:
        return {j["slot"]: j["usage"]["bytes_in"] for j in host.status() if j.get("phase") == "ready"}
    # larkd polls its counters every 0.5 s and Prometheus scrapes every 1 s: wait for a scrape after the download.
    wait_until(lambda: all(larkd_bytes().get(s, 0) >= JOBS[s][2] for s in JOBS), "larkd counting both downloads",
               detail=host.larkd_log)
    wait_until(lambda: all((prom.value(f'lark_job_bytes_total{{slot="{s}", direction="in"}}') or 0) >= JOBS[s][2]
                           for s in JOBS), "Prometheus seeing both downloads", detail=prom.logs)
    counted = larkd_bytes()

    # A job's bytes: what larkd counts, within 1 %
    got = prom.value('lark_job_bytes_total{slot="slot1", direction="in"} '
                     '* on (job, instance, slot) group_left (job_id) lark_job_info{job_id="80.0"}')
    assert got == pytest.approx(counted["slot1"], rel=0.01)

    # Per-group totals (recording rule): each group's one job. The rule is evaluated on its own interval, so its
    # series can exist before an evaluation has seen the finished downloads (a CI run read 2.9 of 4.0 MB): wait for
    # the evaluation that has, then compare.
    def per_group() -> dict:
        return {dict(k)["accounting_group"]: v
                for k, v in prom.query('accounting_group_direction:lark_job_bytes:sum{direction="in"}').items()}
    wait_until(lambda: len(per_group()) == 2 and all(per_group().get(g, 0) >= counted[s] * 0.99
                                                     for g, s in (("cms", "slot1"), ("atlas", "slot2"))),
               "the per-group recording rule seeing both downloads",
               detail=lambda: json.dumps(per_group()) + json.dumps(prom.get("/api/v1/rules"))[:3000])
    assert per_group() == {"cms": pytest.approx(counted["slot1"], rel=0.01),
                           "atlas": pytest.approx(counted["slot2"], rel=0.01)}

    # Setup time: the NAT quantiles exist and are positive
    def quantiles() -> dict:
        return {dict(k)["quantile"]: v
                for k, v in prom.query('network_type:lark_setup_seconds:quantile5m{network_type="nat"}').items()}
    wait_until(lambda: len(quantiles()) == 3 and all(v > 0 for v in quantiles().values()),
               "setup-time quantiles", detail=lambda: str(quantiles()))
    assert quantiles()["0.5"] <= quantiles()["0.9"] <= quantiles()["0.99"] < 10

    # The refused job: counted, and its alert pending (it fires after its `for:` minute)
    wait_until(lambda: (prom.value('instance_reason:lark_failures:increase1h{reason="policy"}') or 0) > 0,
               "the refused job in lark_failures", detail=host.larkd_log)
    wait_until(lambda: prom.query('ALERTS{alertname="LarkJobsRefused", reason="policy"}'), "LarkJobsRefused pending")

    # The controller: its switch, and the API requests the pool made while it waited for it
    assert prom.value('lark_controller_switches{state="ready"}') == 1
    assert prom.value('lark_controller_requests_total{operation="status", code="200"}') >= 1

    # Every rule loaded and evaluated without error (a join that matched many-to-many would fail here)
    groups = prom.get("/api/v1/rules")["groups"]
    rules = [r for g in groups for r in g["rules"]]
    assert {r["name"] for r in rules if r["type"] == "alerting"} == {"LarkdDown", "LarkControllerDown",
                                                                      "LarkJobsRefused", "LarkJobAtLimit"}
    assert [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"] == []

    for p in jobs.values():
        p.kill()   # the starters; the jobs end at their own sleep's end, and the fixture removes the rest
        p.wait(10)
