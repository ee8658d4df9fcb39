"""Issue 24, configuration in typed sections: the attach modes, the firewall drivers and the DNS forwarder keep
only their section of the Config (lark/kernel/sections.py), each section takes the Config's values, and none of
their knobs is one that condor_reconfig changes in a running larkd (a section captured at start would miss it)."""
import dataclasses

import pytest

from lark import config as config_mod
from lark.config import Config
from lark.kernel import attach, dns, sections
from lark.kernel.attach import BridgeMode, NatMode, OvsMode, make_modes
from lark.kernel.firewall import make_firewall, other_firewalls
from lark.kernel.firewall.iptables import IptablesFirewall
from lark.kernel.firewall.nftables import NftablesFirewall

SECTIONS = [sections.NatSection, sections.BridgedSection, sections.BridgeSection, sections.OvsSection,
            sections.FirewallSection, sections.DnsSection, sections.Dhcp6Section, sections.MtuSection,
            sections.ForwardingSection]
CONFIG_FIELDS = {f.name: f for f in dataclasses.fields(Config)}


def _other_value(f: dataclasses.Field):
    """A value for a Config field that differs from its default, of the same type."""
    default = f.default
    if isinstance(default, bool):
        return not default
    if isinstance(default, int):
        return default + 7
    if isinstance(default, float):
        return default + 0.5
    if isinstance(default, str):
        return f"{default}-{f.name}" if default else f"v-{f.name}"
    raise AssertionError(f"no other value for Config.{f.name} ({default!r}): extend _other_value")


def _not_defaults(tmp_path) -> Config:
    """A Config whose every field some section reads is not at its default (run_dir under tmp_path)."""
    wanted = {f.name for s in SECTIONS for f in dataclasses.fields(s)} & CONFIG_FIELDS.keys()
    values = {name: _other_value(CONFIG_FIELDS[name]) for name in wanted}
    values["run_dir"] = str(tmp_path / "run")
    return Config(**values)


@pytest.mark.parametrize("section", SECTIONS, ids=lambda s: s.__name__)
def test_every_section_field_is_a_config_field_or_property_and_takes_its_value(section, tmp_path):
    cfg = _not_defaults(tmp_path)
    got = section.from_config(cfg)
    for f in dataclasses.fields(section):
        derived = isinstance(getattr(Config, f.name, None), property)
        assert f.name in CONFIG_FIELDS or derived, f"{section.__name__}.{f.name} is no Config field or property"
        assert getattr(got, f.name) == getattr(cfg, f.name), f"{section.__name__}.{f.name}"
        if not derived:
            assert getattr(got, f.name) != CONFIG_FIELDS[f.name].default, f"{f.name} was left at its default"
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(got, dataclasses.fields(section)[0].name, "changed")


@pytest.mark.parametrize("section", SECTIONS, ids=lambda s: s.__name__)
def test_no_section_reads_a_knob_that_condor_reconfig_changes_live(section):
    assert config_mod.LIVE_FIELDS, "no live field marked: the check below would prove nothing"
    live = {f.name for f in dataclasses.fields(section)} & config_mod.LIVE_FIELDS
    assert not live, (f"{section.__name__} captures live knobs {sorted(live)} at start: a reload would not reach "
                      "them; read them from the Config that lark/daemon/reload.py updates")


def test_derived_section_properties_match_the_configs():
    cfg = Config(subnet="10.9.0.0/16")
    assert sections.NatSection.from_config(cfg).gateway == cfg.gateway
    assert sections.FirewallSection.from_config(cfg).network == cfg.network


def _holds_no_config(obj) -> bool:
    return not any(isinstance(v, Config) for v in vars(obj).values())


def test_every_mode_of_make_modes_holds_only_its_section(tmp_path, monkeypatch):
    monkeypatch.setattr(attach.shutil, "which", lambda name: f"/usr/bin/{name}")  # offer ovs_bridge too
    cfg = Config(run_dir=str(tmp_path), bridge_range="192.0.2.10-192.0.2.20", bridge_gateway="192.0.2.1",
                 bridge_range6="2001:db8::10-2001:db8::20", bridge_gateway6="2001:db8::1", subnet6="fd00:213::/64",
                 ovs_db=f"unix:{tmp_path}/no-ovsdb.sock")
    modes = make_modes(cfg)
    assert set(modes) == {"nat", "bridge", "ovs_bridge"}
    for t, mode in modes.items():
        assert _holds_no_config(mode), f"mode {t} keeps the whole Config"
        assert type(mode.cfg) is type(mode).section and mode.cfg == type(mode).section.from_config(cfg), t
    assert modes["bridge"].gateway == "192.0.2.1" and modes["ovs_bridge"].gateway6 == "2001:db8::1"
    assert modes["nat"].gateway == "10.213.0.1" and modes["nat"].pool6 is not None


def test_modes_take_only_their_section_and_refuse_a_config_or_another_section(tmp_path):
    cfg = Config(run_dir=str(tmp_path), bridge_range="192.0.2.10-192.0.2.20", ovs_db=f"unix:{tmp_path}/none.sock")
    for cls in (NatMode, BridgeMode, OvsMode):
        section = cls.section.from_config(cfg)
        mode = cls(section)
        assert _holds_no_config(mode) and mode.cfg is section, cls.__name__
        with pytest.raises(TypeError, match=f"{cls.section.__name__} expected, not Config: build the section with "
                                            f"{cls.section.__name__}.from_config"):
            cls(cfg)
    with pytest.raises(TypeError, match="BridgeSection expected, not BridgedSection"):
        BridgeMode(sections.BridgedSection.from_config(cfg))


@pytest.mark.parametrize("backend", ["nftables", "iptables"])
def test_both_firewall_drivers_hold_only_their_section(backend, tmp_path):
    cfg = Config(run_dir=str(tmp_path), firewall=backend, nft_table="larksec")
    fw = make_firewall(cfg)
    assert fw.name == backend
    drivers = [fw, *other_firewalls(cfg)]
    assert {d.name for d in drivers} == {"nftables", "iptables"}
    for d in drivers:
        assert _holds_no_config(d), f"{d.name} keeps the whole Config"
        assert d.cfg == sections.FirewallSection.from_config(cfg)
    for cls in (NftablesFirewall, IptablesFirewall):
        assert _holds_no_config(cls(sections.FirewallSection.from_config(cfg)))
        with pytest.raises(TypeError, match="FirewallSection expected, not Config"):
            cls(cfg)


def test_the_dns_forwarder_holds_only_its_section(tmp_path):
    cfg = Config(run_dir=str(tmp_path), dns_address="169.254.53.54")
    fwd = dns.Forwarder(sections.DnsSection.from_config(cfg))
    assert _holds_no_config(fwd) and fwd.cfg == sections.DnsSection.from_config(cfg)
    assert fwd.pid_file == str(tmp_path / "dns-forwarder.pid")
    with pytest.raises(TypeError, match="DnsSection expected, not Config"):
        dns.Forwarder(cfg)


def test_the_job_networkers_sections_are_its_configs_and_hold_no_config(tmp_path):
    cfg = _not_defaults(tmp_path)
    got = sections.JobSections.from_config(cfg)
    assert got.dns == sections.DnsSection.from_config(cfg) and got.dhcp6 == sections.Dhcp6Section.from_config(cfg)
    assert got.mtu == sections.MtuSection.from_config(cfg) and got.mtu.job_mtu == cfg.job_mtu != 0
    assert _holds_no_config(got)
    for f in dataclasses.fields(got):
        assert type(getattr(got, f.name)) in SECTIONS, f"JobSections.{f.name} is no section listed here"


def test_no_kernel_function_or_constructor_takes_the_whole_config():
    """Issue 24: each kernel class and function takes only its section; only the wiring (make_modes,
    make_firewall, other_firewalls, available_types) and sections.py itself still name Config."""
    import pathlib

    import lark.kernel
    wiring = {"attach/__init__.py", "firewall/__init__.py", "sections.py"}
    root = pathlib.Path(lark.kernel.__file__).parent
    offenders = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel in wiring:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if "cfg: Config" in line or "Config |" in line:
                offenders.append(f"lark/kernel/{rel}:{n}: {line.strip()}")
    assert not offenders, offenders
