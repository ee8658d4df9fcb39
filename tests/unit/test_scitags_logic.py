"""SciTags: the flow label layout, the admin's rule table, the job netns rule's bit offsets, fireflies against the
specification's JSON schema (vendored in tests/helpers/firefly.schema.json with its source)."""
import json
import re
import socket
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lark import scitags
from lark.config import Config
from lark.errors import LarkError
from lark.kernel import scitags as kernel_scitags
from lark.policy.classads import parse_ad
from lark.policy.engine import decide

SCHEMA = json.loads((Path(__file__).parent.parent / "helpers" / "firefly.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
RULES = '2 3 AcctGroup == "group_atlas"\n# a comment\n\n3 1 Owner == "cmsuser"\n5 0 true'


def spec_label(experiment: int, activity: int, entropy: tuple[int, int, int]) -> int:
    """The specification's layout spelled out as flowd builds it, as a string of bits: 2 entropy bits, the
    experiment's 9 bits least significant first, 1 entropy bit, the activity's 6 bits, 2 entropy bits."""
    e1, e2, e3 = entropy
    bits = f"{e1:02b}" + f"{experiment:09b}"[::-1] + f"{e2:01b}" + f"{activity:06b}" + f"{e3:02b}"
    assert len(bits) == 20
    return int(bits, 2)


@given(st.integers(1, 511), st.integers(0, 63), st.tuples(st.integers(0, 3), st.integers(0, 1), st.integers(0, 3)))
def test_label_bits_are_the_specifications_layout(experiment, activity, entropy):
    label = spec_label(experiment, activity, entropy)
    assert scitags.label_bits(experiment, activity) == label & scitags.TAG_MASK
    assert scitags.tag_of_label(label) == (experiment, activity)
    assert scitags.split(scitags.combined(experiment, activity)) == (experiment, activity)


def test_entropy_is_five_bits_at_19_18_8_1_0():
    assert scitags.ENTROPY_MASK == 0b11_000000000_1_000000_11
    assert bin(scitags.TAG_MASK).count("1") == 15 and scitags.TAG_MASK & scitags.ENTROPY_MASK == 0
    # ATLAS (2), activity 3: experiment 000000010 reversed = 010000000
    assert scitags.label_bits(2, 3) == 0b00_010000000_0_000011_00


def apply_nft_writes(header: bytes, rule_text: str) -> bytes:
    """What `@nh,OFFSET,LEN set VALUE` does to a packet: replace LEN bits at bit OFFSET of the network header."""
    value = int.from_bytes(header, "big")
    width = len(header) * 8
    writes = re.findall(r"@nh,(\d+),(\d+) set (0x[0-9a-f]+)", rule_text)
    assert writes, rule_text
    for offset, length, v in writes:
        shift = width - int(offset) - int(length)
        mask = ((1 << int(length)) - 1) << shift
        value = (value & ~mask) | (int(v, 16) << shift)
    return value.to_bytes(len(header), "big")


@given(st.integers(1, 511), st.integers(0, 63), st.integers(0, 0xFFFFF), st.integers(0, 255))
def test_job_netns_rule_writes_only_the_tag_bits(experiment, activity, job_label, traffic_class):
    """The offsets in the rule put the tag where the spec says and keep the job's entropy bits, version and
    traffic class (modelled on the rule's own text, so a wrong offset fails here before any kernel test)."""
    first_word = (6 << 28) | (traffic_class << 20) | job_label
    header = first_word.to_bytes(4, "big") + bytes(36)
    out = apply_nft_writes(header, kernel_scitags.rules(scitags.combined(experiment, activity), fireflies=False))
    word = int.from_bytes(out[:4], "big")
    assert word >> 20 == (6 << 8) | traffic_class and out[4:] == header[4:]
    label = word & 0xFFFFF
    assert scitags.tag_of_label(label) == (experiment, activity)
    assert label & scitags.ENTROPY_MASK == job_label & scitags.ENTROPY_MASK


def test_fireflies_turn_conntrack_on_in_the_rule_table():
    assert "ct state new" in kernel_scitags.rules(130, fireflies=True)
    assert "ct " not in kernel_scitags.rules(130, fireflies=False)


def test_rules_parse_and_refuse_what_the_label_cannot_carry():
    rules = scitags.parse_rules(RULES)
    assert [(r.experiment, r.activity, r.line) for r in rules] == [(2, 3, 1), (3, 1, 4), (5, 0, 5)]
    for bad in ("512 1 true", "0 1 true", "2 64 true", "atlas 1 true", "2 1"):
        with pytest.raises(LarkError, match="LARK_SCITAGS"):
            scitags.parse_rules(bad)
    with pytest.raises(LarkError, match="SCITAGS"):
        Config(scitags="2 99 true").validate()


def test_collector_addresses():
    assert scitags.parse_collector("collector.example.org") == ("collector.example.org", 10514)
    assert scitags.parse_collector("192.0.2.7:9999") == ("192.0.2.7", 9999)
    assert scitags.parse_collector("[2001:db8::7]:10515") == ("2001:db8::7", 10515)
    assert scitags.parse_collector("2001:db8::7") == ("2001:db8::7", 10514)
    for bad in ("a b", "host:0", "host:70000"):
        with pytest.raises(LarkError, match="SCITAGS_COLLECTOR"):
            scitags.parse_collector(bad)


def tagged_plan(job: str):
    cfg = Config(bandwidth_mbit=1000, scitags=RULES)
    return decide(parse_ad(job, "job"), parse_ad("", "machine"), cfg, "slot1", "slot1")


def test_first_true_rule_tags_the_job():
    p = tagged_plan('ClusterId = 1\nProcId = 0\nAcctGroup = "group_atlas"\nOwner = "cmsuser"')
    assert scitags.split(p.scitag) == (2, 3) and "line 1" in p.decided_by["scitag"]
    p = tagged_plan('ClusterId = 1\nProcId = 0\nOwner = "cmsuser"')   # no AcctGroup: line 1 is undefined
    assert scitags.split(p.scitag) == (3, 1)
    assert tagged_plan('ClusterId = 1\nProcId = 0\nInboundConnectivity = false\nOutboundConnectivity = false'
                       ).scitag == 0   # no network, no flows
    off = decide(parse_ad("ClusterId = 1\nProcId = 0", "job"), parse_ad("", "machine"), Config(bandwidth_mbit=1000),
                 "slot1", "slot1")
    assert off.scitag == 0 and "scitag" not in off.decided_by


def test_a_broken_rule_tags_nothing_and_never_holds_the_job():
    cfg = Config(bandwidth_mbit=1000, scitags='2 1 AcctGroup == == "x"\n4 2 AcctGroup + 1 > 0')
    p = decide(parse_ad('ClusterId = 1\nProcId = 0\nAcctGroup = "a"', "job"), parse_ad("", "machine"), cfg,
               "slot1", "slot1")
    assert p.scitag == 0


FLOW6 = scitags.Flow(socket.AF_INET6, "tcp", "2001:db8::5", 40000, "2001:db8:ffff::1", 7001)
FLOW4 = scitags.Flow(socket.AF_INET, "udp", "10.213.0.5", 40000, "192.0.2.1", 53)


@pytest.mark.parametrize("flow", [FLOW6, FLOW4])
def test_fireflies_are_valid_against_the_specifications_schema(flow):
    assert "date-time" in VALIDATOR.format_checker.checkers   # else formats would go unchecked
    start = scitags.firefly("start", flow, scitags.combined(2, 3), 1700000000.0, 1700000000.5)
    end = scitags.firefly("end", flow, scitags.combined(2, 3), 1700000000.0, 1700000001.0, end=1700000000.9,
                          sent=12345, received=678)
    for msg in (start, end):
        data = scitags.datagram(msg, "ep1.example.org", 1700000001.0)
        assert re.match(rb"<134>1 \S+ ep1\.example\.org lark - firefly-json - \{", data), data
        VALIDATOR.validate(scitags.firefly_of_datagram(data))
    assert end["usage"] == {"sent": 12345, "received": 678}
    assert end["context"] == {"experiment-id": 2, "activity-id": 3, "application": "lark"}


def test_the_schema_check_can_fail():
    """The validator rejects what the spec forbids: an end without end-time, IPv4 text under afi ipv6."""
    end = scitags.firefly("end", FLOW6, 130, 1.0, 2.0, end=2.0)
    del end["flow-lifecycle"]["end-time"]
    assert not VALIDATOR.is_valid(end)
    wrong = scitags.firefly("start", FLOW6, 130, 1.0, 2.0)
    wrong["flow-id"]["src-ip"] = "10.0.0.1"
    assert not VALIDATOR.is_valid(wrong)
