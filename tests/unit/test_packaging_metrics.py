"""packaging/prometheus and packaging/grafana agree with what larkd and lark-controller export: every PromQL expression
in the rules and the dashboard names only exported metrics (read from the exporters' own registries) or a rule's
recorded series; promtool accepts the rules and their unit tests pass. Also the exporter additions they rely on:
the owner and accounting group on lark_job_info, and lark-controller's metrics."""
import json
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import promql_parser
import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from lark.controller import config as ccfg
from lark.controller.metrics import ControllerMetrics
from lark.controller.model import JobReg
from lark.controller.registry import Registry
from lark.controller.service import Controller
from lark.daemon.prom import LarkdCollector, Metrics
from lark.errors import LarkError

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "packaging" / "prometheus" / "lark-rules.yml"
RULE_TESTS = ROOT / "packaging" / "prometheus" / "lark-rules.test.yml"
DASHBOARD = ROOT / "packaging" / "grafana" / "lark-dashboard.json"
# Series Prometheus makes itself for every scrape target (the "down" alerts need them).
PROMETHEUS_OWN = {"up"}
# Grafana's interval macros, replaced by a duration before parsing (https://grafana.com/docs: "Global variables").
GRAFANA_MACROS = ("$__rate_interval", "$__interval", "$__range")
# The sample names each family type exposes (the text format's suffixes), for families with no sample right now.
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum", "_created"),
            "gaugehistogram": ("_bucket", "_gcount", "_gsum"), "summary": ("", "_count", "_sum", "_created"),
            "info": ("_info",)}


class NoRecords:
    def all(self) -> list:
        return []


def sample_names(registry) -> set[str]:
    names = set()
    for fam in registry.collect():
        names.update(fam.name + s for s in SUFFIXES.get(fam.type, ("",)))
        names.update(s.name for s in fam.samples)
    return names


def controller() -> Controller:
    cfg = ccfg.from_mapping({"switch": {"wan_ports": ["wan0"], "site_prefixes": ["10.77.0.0/16"]}})
    return Controller(cfg, Registry(cfg))


@pytest.fixture(scope="module")
def exported() -> set[str]:
    larkd = Metrics(NoRecords(), None, [])   # type: ignore[arg-type]  (no records: the accountant is not asked)
    return sample_names(larkd.registry) | sample_names(ControllerMetrics(controller().status).registry)


def rules() -> list[dict]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def dashboard_exprs() -> list[tuple[str, str]]:
    out = []

    def panels(ps):
        for p in ps:
            out.extend((p["title"], t["expr"]) for t in p.get("targets", []))
            panels(p.get("panels", []))
    panels(json.loads(DASHBOARD.read_text())["panels"])
    return out


def metric_names(expr: str) -> set[str]:
    """Every series name the expression selects, from the parsed expression (not from a text search)."""
    for macro in GRAFANA_MACROS:
        expr = expr.replace(macro, "5m")
    names: set[str] = set()

    def visit(node) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            assert node.name, f"{expr!r} selects series without naming a metric"
            names.add(node.name)
    promql_parser.walk(promql_parser.parse(expr), visit)
    return names


def test_the_name_parser_sees_every_selector_and_nothing_else():
    e = ('sum by (owner) (rate(a_total{x="b_c"}[5m]) * on (slot) group_left (job_id) b_info) / ignoring (le) c '
         'or histogram_quantile(0.9, rate(d_bucket[$__rate_interval])) > bool 0 unless absent(up{job="larkd"})')
    assert metric_names(e) == {"a_total", "b_info", "c", "d_bucket", "up"}
    with pytest.raises(AssertionError):
        metric_names('{__name__=~"lark_.*"}')


def test_every_rule_names_only_exported_metrics(exported):
    recorded = {r["record"] for r in rules() if "record" in r}
    unknown = {}
    for r in rules():
        missing = metric_names(r["expr"]) - exported - recorded - PROMETHEUS_OWN
        if missing:
            unknown[r.get("record") or r["alert"]] = sorted(missing)
    assert unknown == {}, f"rules name metrics that larkd and lark-controller do not export: {unknown}"
    assert {r["alert"] for r in rules() if "alert" in r} == {"LarkdDown", "LarkControllerDown", "LarkJobsRefused",
                                                              "LarkJobAtLimit"}
    for r in rules():
        if "alert" in r:
            assert r.get("for") and r["annotations"]["summary"] and r["annotations"]["description"], r["alert"]


def test_every_dashboard_expression_names_an_exported_or_recorded_metric(exported):
    recorded = {r["record"] for r in rules() if "record" in r}
    exprs = dashboard_exprs()
    assert len(exprs) >= 10
    unknown = {title: sorted(metric_names(e) - exported - recorded - PROMETHEUS_OWN) for title, e in exprs}
    assert {t: m for t, m in unknown.items() if m} == {}, "dashboard panels name metrics nobody exports"
    # and it shows what the issue asks for: bytes per job/owner/group, setup latency, refusals, jobs at limit
    used = set().union(*(metric_names(e) for _, e in exprs))
    assert {"lark_job_bytes_total", "owner_direction:lark_job_bytes:rate5m",
            "accounting_group_direction:lark_job_bytes:rate5m", "network_type:lark_setup_seconds:quantile5m",
            "instance_reason:lark_failures:increase1h", "job_instance_slot:lark_job_limit_utilisation:ratio5m"} <= used
    ids = [p["id"] for p in json.loads(DASHBOARD.read_text())["panels"]]
    assert len(ids) == len(set(ids))


def test_a_misspelt_metric_is_caught(exported):
    assert metric_names("rate(lark_job_byte_total[5m])") - exported == {"lark_job_byte_total"}


@pytest.mark.skipif(not shutil.which("promtool"), reason="promtool is not installed (Debian package prometheus; "
                    "make deps installs it)")
def test_promtool_checks_the_rules_and_runs_their_unit_tests():
    cp = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True, text=True)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    cp = subprocess.run(["promtool", "test", "rules", RULE_TESTS.name], capture_output=True, text=True,
                        cwd=RULE_TESTS.parent)
    assert cp.returncode == 0, cp.stdout + cp.stderr


@pytest.mark.skipif(not shutil.which("promtool"), reason="promtool is not installed (Debian package prometheus; "
                    "make deps installs it)")
def test_promtool_lints_both_exporters_output():
    c = controller()
    c.register(JobReg.from_wire({"key": "slot1", "job_id": "1.0", "owner": "alice", "addresses": ["10.77.1.1"],
                                 "mac": "02:00:00:00:00:01"}, "ep1"))
    larkd = Metrics(NoRecords(), None, [])   # type: ignore[arg-type]
    larkd.setup_seconds.labels("nat").observe(0.02)
    for registry in (larkd.registry, ControllerMetrics(c.status).registry):
        cp = subprocess.run(["promtool", "check", "metrics"], input=generate_latest(registry), capture_output=True)
        assert cp.returncode == 0, (cp.stdout + cp.stderr).decode()


def scrape(registry) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(generate_latest(registry).decode()) for s in fam.samples}


def test_larkd_job_info_names_owner_and_accounting_group():
    rec = SimpleNamespace(phase="ready", slot="slot1", key="k1", job_id="5.0",
                          plan={"owner": "alice", "accounting_group": "cms", "network_type": "nat",
                                "global_job_id": "s#5.0#1", "rate_limit_mbit": 100}, rate_limit_mbit=100)
    setting_up = SimpleNamespace(phase="setting-up", slot="slot2", key="k2", job_id="6.0", plan={"owner": "bob"})
    acct = SimpleNamespace(summary=lambda key: {"bytes_in": 1000, "bytes_out": 10} if key == "k1" else None)
    from prometheus_client import CollectorRegistry
    reg = CollectorRegistry()
    reg.register(LarkdCollector(SimpleNamespace(all=lambda: [rec, setting_up]), acct, []))  # type: ignore[arg-type]
    got = scrape(reg)
    info = {k: v for k, v in got.items() if k[0] == "lark_job_info"}
    assert info == {("lark_job_info", (("accounting_group", "cms"), ("global_job_id", "s#5.0#1"), ("job_id", "5.0"),
                                       ("network_type", "nat"), ("owner", "alice"), ("slot", "slot1"))): 1.0}
    assert got[("lark_job_bytes_total", (("direction", "in"), ("slot", "slot1")))] == 1000


def test_controller_metrics_follow_its_registry_and_api():
    c = controller()
    m = ControllerMetrics(c.status)
    assert scrape(m.registry)[("lark_controller_jobs", ())] == 0
    # No switch is connected here, so the registration answers 503, but the job is registered (and counted).
    code, _ = c.register(JobReg.from_wire({"key": "slot1", "job_id": "1.0", "owner": "alice", "accounting_group": "cms",
                                           "addresses": ["10.77.1.1"], "mac": "02:00:00:00:00:01"}, "ep1"))
    m.observe("POST", code, 0.003)
    m.observe("BREW", 404, 0.001)   # a made-up method cannot mint a label value
    got = scrape(m.registry)
    assert got[("lark_controller_jobs", ())] == 1 and got[("lark_controller_eps", ())] == 1
    assert got[("lark_controller_job_flows", ())] > 0
    assert got[("lark_controller_switches", (("state", "ready"),))] == 0
    assert got[("lark_controller_requests_total", (("code", "503"), ("operation", "register")))] == 1
    assert got[("lark_controller_requests_total", (("code", "404"), ("operation", "other")))] == 1
    assert got[("lark_controller_request_seconds_count", (("operation", "register"),))] == 1
    assert {k[1] for k in got if k[0] == "lark_controller_requests_total"} >= {
        (("code", "200"), ("operation", op)) for op in ("register", "unregister", "sync", "status")}


def test_controller_wan_group_series_come_from_its_status():
    st = {"totals": {"jobs": 2, "job_flows": 9, "eps": ["ep1"]}, "switches": [{"connected": True, "ready": True}],
          "wan_groups": [{"group": "cms", "ports": [{"port": "wan0", "rate_mbit": 50.0, "jobs": 2, "bytes": 4096},
                                                    {"port": "wan1", "rate_mbit": 20.0, "jobs": 0, "bytes": 0}]}]}
    got = scrape(ControllerMetrics(lambda: st).registry)
    assert got[("lark_controller_wan_group_bytes_total", (("group", "cms"), ("port", "wan0")))] == 4096
    assert got[("lark_controller_wan_group_limit_bps", (("group", "cms"), ("port", "wan1")))] == 20e6
    assert got[("lark_controller_wan_group_jobs", (("group", "cms"), ("port", "wan0")))] == 2
    assert got[("lark_controller_switches", (("state", "connected"),))] == 1


def test_controller_metrics_address_is_checked():
    assert ccfg.from_mapping({"metrics": {"address": "127.0.0.1:9814"}}).metrics_address == "127.0.0.1:9814"
    with pytest.raises(LarkError) as e:
        ccfg.from_mapping({"metrics": {"address": "9814"}})
    assert "metrics.address" in str(e.value) and "127.0.0.1:9814" in str(e.value)


def test_larkd_setup_histogram_has_every_network_type_before_the_first_setup():
    """rate() needs a series' earlier value: a type's first setup after larkd starts must count in the quantiles."""
    got = scrape(Metrics(NoRecords(), None, []).registry)   # type: ignore[arg-type]
    assert {dict(k[1])["network_type"] for k, v in got.items() if k[0] == "lark_setup_seconds_count" and v == 0} \
        == {"nat", "bridge", "ovs_bridge", "none"}
