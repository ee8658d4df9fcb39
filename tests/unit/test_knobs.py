"""Configuration from HTCondor's LARK_* knobs: the automatic mapping, the deprecated TOML path, reload."""
import dataclasses
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lark import config
from lark.config import Config, knob_name
from lark.daemon import reload as reload_mod
from lark.errors import LarkError

ADMIN_DOC = Path(__file__).resolve().parents[2] / "docs" / "admin.md"

CHANGED = Config(socket="/run/x.sock", starter_paths=["/a/condor_starter", "/b/condor_starter"], poll_interval=2.5,
                 setup_workers=7, allow_job_to_job=True, enable_ip_forward=False, subnet="10.9.0.0/24",
                 default_bandwidth="share", bridge_range="192.0.2.100-192.0.2.199", bridge_gateway="192.0.2.1")


def test_every_field_round_trips_through_its_knob():
    lines = config.knob_lines(CHANGED, only_changed=False)
    assert len(lines) == len(dataclasses.fields(Config))
    knobs = {}
    for line in lines:
        name, _, text = line.partition(" = ")
        assert re.fullmatch(r"LARK_[A-Z0-9_]+", name)
        knobs[name[len("LARK_"):].lower()] = text
    assert config.from_knobs(knobs) == CHANGED


def test_knobs_are_read_through_a_param_table_by_field_name():
    param = {"LARK_POLL_INTERVAL": "2.5", "LARK_ALLOW_JOB_TO_JOB": "True", "LARK_STARTER_PATHS": "/a, /b",
             "LARK_BIN": "/opt/lark/bin", "LARK_HOOK_JOB_EXIT": "/x"}  # the fragment's own knobs are not fields
    knobs = config.condor_knobs(param)
    assert knobs == {"poll_interval": "2.5", "allow_job_to_job": "True", "starter_paths": "/a, /b"}
    cfg = config.from_knobs(knobs)
    assert cfg.poll_interval == 2.5 and cfg.allow_job_to_job is True and cfg.starter_paths == ["/a", "/b"]


def test_knobs_come_from_htcondors_configuration_through_the_bindings(tmp_path):
    pytest.importorskip("htcondor2")
    conf = tmp_path / "condor_config"
    conf.write_text("LARK_UPLINK = up7\nLARK_SETUP_WORKERS = 3\nLARK_DHCP_RELEASE = true\n")
    code = "from lark import config; c = config.load(); print(c.uplink, c.setup_workers, c.dhcp_release)"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("_CONDOR_", "LARK_"))}
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                        env={**env, "CONDOR_CONFIG": str(conf)}, timeout=60)
    assert cp.stdout.split() == ["up7", "3", "True"], cp.stderr


@pytest.mark.parametrize("field,text,needle", [
    ("poll_interval", "soon", "knob LARK_POLL_INTERVAL: 'soon' is not a number"),
    ("setup_workers", "2.5", "knob LARK_SETUP_WORKERS: '2.5' is not an integer"),
    ("allow_job_to_job", "maybe", "knob LARK_ALLOW_JOB_TO_JOB: 'maybe' is not a boolean"),
    ("firewall", "pf", "config key 'firewall' (knob LARK_FIREWALL): unknown backend 'pf'"),
])
def test_bad_knobs_are_refused_naming_the_knob(field, text, needle):
    with pytest.raises(LarkError, match=re.escape(needle)):
        config.from_knobs({field: text})


def test_every_field_is_documented_and_the_admin_table_is_generated_from_the_fields():
    docs = config.field_docs()
    assert set(docs) == {f.name for f in dataclasses.fields(Config)}
    assert all(docs.values()), [k for k, v in docs.items() if not v]
    text = ADMIN_DOC.read_text()
    m = re.search(r"<!-- knob-table: begin -->\n(.*?)<!-- knob-table: end -->", text, re.S)
    assert m, "docs/admin.md has no knob-table block"
    assert m.group(1) == config.knob_table(), "docs/admin.md is stale: paste `lark config knobs` into it"
    assert "| `LARK_SUBNET` | `10.213.0.0/16` | restart |" in m.group(1)
    assert "| `LARK_POLL_INTERVAL` | `5.0` | yes |" in m.group(1)


def test_deprecated_toml_is_read_under_the_knobs_with_a_warning(tmp_path, monkeypatch, caplog):
    toml = tmp_path / "lark.toml"
    toml.write_text('[daemon]\npoll_interval = 2.0\n[network]\nuplink = "up0"\nsubnet = "10.1.0.0/24"\n')
    monkeypatch.setattr(config, "DEFAULT_PATH", str(toml))
    monkeypatch.setattr(config, "condor_knobs", lambda param=None: {"subnet": "10.2.0.0/24"})
    with caplog.at_level(logging.WARNING, logger="lark.config"):
        cfg = config.load()
    assert (cfg.poll_interval, cfg.uplink, cfg.subnet) == (2.0, "up0", "10.2.0.0/24")  # the knob wins
    warning = " ".join(r.getMessage() for r in caplog.records)
    assert f"{toml} is deprecated" in warning and "lark config migrate" in warning
    assert "LARK_POLL_INTERVAL" in warning and "LARK_UPLINK" in warning and "LARK_SOCKET" not in warning


def test_migrate_prints_knob_lines_that_give_the_same_config(tmp_path, capsys):
    from lark import cli
    toml = tmp_path / "lark.toml"
    toml.write_text(config.dump(CHANGED))
    assert cli.main(["--config", str(toml), "config", "migrate"]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("LARK_")]
    knobs = {n[len("LARK_"):].lower(): v for n, _, v in (x.partition(" = ") for x in lines)}
    assert config.from_knobs(knobs) == CHANGED
    assert "LARK_SOCKET = /run/x.sock" in lines and not any(x.startswith("LARK_UPLINK") for x in lines)


def test_reload_applies_live_knobs_and_lists_the_ones_that_need_a_restart():
    cfg = Config()
    new = dataclasses.replace(cfg, poll_interval=1.0, callout="/x", subnet="10.3.0.0/24")
    applied, restart = reload_mod.apply(cfg, new)
    assert applied == ["LARK_POLL_INTERVAL 5.0 -> 1.0", "LARK_CALLOUT '' -> '/x'"]
    assert restart == ["LARK_SUBNET"]
    assert cfg.poll_interval == 1.0 and cfg.callout == "/x" and cfg.subnet == "10.213.0.0/16"
    assert reload_mod.LIVE_FIELDS <= {f.name for f in dataclasses.fields(Config)}


def test_reload_applies_exactly_the_fields_marked_live():
    """Whether a knob changes at once or needs a restart is said on its field (config.live); reload follows it."""
    marked = {f.name for f in dataclasses.fields(Config) if f.metadata.get("live")}
    assert "poll_interval" in marked and "subnet" not in marked
    for f in dataclasses.fields(Config):
        cfg = Config()
        changed = object()     # any value unequal to the running one
        applied, restart = reload_mod.apply(cfg, dataclasses.replace(cfg, **{f.name: changed}))
        if f.name in marked:
            assert len(applied) == 1 and applied[0].startswith(knob_name(f.name) + " ") and not restart, f.name
            assert getattr(cfg, f.name) is changed, f.name
        else:
            assert restart == [knob_name(f.name)] and not applied, f.name
            assert getattr(cfg, f.name) is not changed, f.name


def test_a_bad_configuration_on_reload_keeps_the_running_one(tmp_path, monkeypatch, caplog):
    from lark.daemon import server
    toml = tmp_path / "lark.toml"
    toml.write_text('[daemon]\npoll_interval = 2.0\n')
    d = object.__new__(server.Larkd)  # only what reload_config touches
    d.cfg, d.config_path = config.load(str(toml)), str(toml)
    d.finished = type("F", (), {"keep": 1})()
    toml.write_text('[daemon]\npoll_interval = -1\nfinished_keep = 5\n')
    with caplog.at_level(logging.ERROR, logger="larkd"):
        d.reload_config()
    assert d.cfg.poll_interval == 2.0 and "configuration not reloaded" in caplog.text
    toml.write_text('[daemon]\npoll_interval = 0.5\nfinished_keep = 5\n')
    d.reload_config()
    assert d.cfg.poll_interval == 0.5 and d.finished.keep == 5
