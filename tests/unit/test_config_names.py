import pytest
from hypothesis import given
from hypothesis import strategies as st

from lark import config
from lark.errors import LarkError
from lark.names import (KEY_MAX, NFT_JOB_PREFIX, JobNames, host_mac_seed, is_job_key, job_key,
                        key_from_host_if, set_process_mac_seed)


def test_defaults_are_valid():
    cfg = config.Config().validate()
    assert str(cfg.gateway) == "10.213.0.1"
    assert cfg.port_range == (20000, 20999)


@pytest.mark.parametrize("key,value,needle", [
    ("uplink", "eth0; rm -rf /", "not a valid interface name"),
    ("subnet", "10.0.0.0/31", "too small"),
    ("subnet", "banana", "subnet"),
    ("firewall", "pf", "unknown backend"),
    ("nft_table", "lark; flush ruleset", "safe table name"),
    ("inbound_ports", "9-2", "out of 1-65535"),
    ("inbound_ports", "a-b", "not a range"),
])
def test_bad_config_is_named(key, value, needle):
    with pytest.raises(LarkError) as e:
        config.Config(**{key: value}).validate()
    assert needle in str(e.value) and key in str(e.value)


def test_toml_roundtrip_and_unknown_key(tmp_path):
    cfg = config.Config(uplink="up0", poll_interval=0.5, starter_paths=["/x/starter"])
    p = tmp_path / "c.toml"
    p.write_text(config.dump(cfg))
    assert config.load(str(p)) == cfg
    p.write_text("[daemon]\nsockett = 1\n")
    with pytest.raises(LarkError, match="unknown key daemon.sockett"):
        config.load(str(p))
    p.write_text("[daemon\n")
    with pytest.raises(LarkError, match="not valid TOML"):
        config.load(str(p))


def test_job_key_is_safe_for_kernel_names():
    assert job_key("slot1_2") == "slot1_2"
    long = job_key("slot1_2@very.long.host.name")
    assert long.startswith("h") and len(long) == 12 and long.isalnum()
    assert job_key("slot1_2@very.long.host.name") == long  # stable
    n = JobNames(long)
    assert len(n.host_if) <= 15 and key_from_host_if(n.host_if) == long
    for bad in ("", "a/b", "x" * 200, "slot1;reboot", "eth0\n"):
        with pytest.raises(LarkError):
            job_key(bad)


@pytest.mark.parametrize("name", ["eth0\n", "up0\n; reboot", "a" * 16, "", "br0 eth1", "../x"])
def test_trailing_newline_and_hostile_interface_names_rejected(name):
    with pytest.raises(LarkError, match="uplink"):
        config.Config(uplink=name).validate()


@given(st.from_regex(r"\A[A-Za-z0-9_.@-]{1,128}\Z"))
def test_every_job_key_round_trips_through_every_name_that_carries_it(slot):
    from lark.kernel.firewall.iptables import JOB_CHAIN_RE
    key = job_key(slot)
    assert is_job_key(key) and len(key) <= KEY_MAX
    n = JobNames(key)
    assert len(n.host_if) <= 15  # IFNAMSIZ - 1
    assert key_from_host_if(n.host_if) == key
    assert JOB_CHAIN_RE.fullmatch(f"LARK-{key}-OUT").group(1) == key
    assert n.nft_id == NFT_JOB_PREFIX + key


def test_names_that_no_job_key_can_have_are_not_taken_for_jobs():
    assert key_from_host_if("lk-") is None
    assert key_from_host_if("lk-" + "a" * (KEY_MAX + 1)) is None
    assert key_from_host_if("lk-a.b") is None
    assert key_from_host_if("eth0") is None
    assert not is_job_key("") and not is_job_key("a-b")
def test_job_macs_differ_between_eps_for_the_same_slot(tmp_path):
    # Every EP has a slot1: on one bridged network their jobs must not share a MAC.
    ep1, ep2 = JobNames("slot1", mac_seed="ep1"), JobNames("slot1", mac_seed="ep2")
    assert ep1.job_mac != ep2.job_mac
    assert ep1.job_mac == JobNames("slot1", mac_seed="ep1").job_mac  # teardown recomputes the same one
    assert int(ep1.job_mac.split(":")[0], 16) & 0b11 == 0b10  # locally administered, unicast
    mid = tmp_path / "machine-id"
    mid.write_text("0123456789abcdef\n")
    assert host_mac_seed("", str(mid)) == "0123456789abcdef"
    assert host_mac_seed("rack7-ep3", str(mid)) == "rack7-ep3"
    assert host_mac_seed("", str(tmp_path / "none")) == ""
    # JobNames made from a key alone (e.g. by the controller client's resync) use the process's seed.
    set_process_mac_seed("ep2")
    try:
        assert JobNames("slot1").job_mac == ep2.job_mac
    finally:
        set_process_mac_seed("")
    assert JobNames("slot1").job_mac == JobNames("slot1", mac_seed="").job_mac != ep1.job_mac
    with pytest.raises(LarkError, match="job_mac_seed"):
        config.Config(job_mac_seed="a b").validate()
