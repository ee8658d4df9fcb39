"""lark/kernel/sandbox_police.py's pure parts: the nft text it sends for a starter and a rate, what it reads back
from a table listing, the cgroup path nft is given. The real cgroup and nft: tests/integration/test_sandbox_limit.py;
the decisions around them (which starter, when): tests/unit/test_sandbox_limit_logic.py."""
import json

import pytest

from lark.errors import LarkError
from lark.kernel import sandbox_police as sp

S = sp.Starter(4242, 987654)


def test_the_table_has_an_output_and_an_input_chain_that_accept_by_default():
    assert sp.table_cmds("lark_sandbox").splitlines() == [
        "add table inet lark_sandbox",
        "add chain inet lark_sandbox sandbox_out { type filter hook output priority 0; policy accept; }",
        "add chain inet lark_sandbox sandbox_in { type filter hook input priority 0; policy accept; }",
    ]


def test_two_policers_one_per_chain_at_the_slots_rate_with_the_starter_in_the_comment():
    text = sp.policer_cmds("lark_sandbox", S, "slot1_1", 20, "unified/lark.sandbox/starter-4242-987654", 2)
    assert text.splitlines() == [
        f'add rule inet lark_sandbox {chain} socket cgroupv2 level 2 "unified/lark.sandbox/starter-4242-987654" '
        f'counter limit rate over 2500000 bytes/second burst 65536 bytes drop comment '
        f'"lark sandbox starter 4242 start 987654 slot slot1_1"' for chain in ("sandbox_out", "sandbox_in")]


def test_the_burst_is_64_kib_or_10_ms_of_the_rate_whichever_is_more():
    assert sp.rate_and_burst(20) == (2_500_000, 65536)
    assert sp.rate_and_burst(1000) == (125_000_000, 1_250_000)   # a fast slot: 10 ms of its rate
    assert sp.rate_and_burst(1e-9) == (1, 65536)                 # never a rate of 0 (nft would refuse it)


@pytest.mark.parametrize("slot, mbit, error", [
    ('slot1"; flush ruleset', 20, "is not valid"),
    ("slot 1", 20, "is not valid"),
    ("", 20, "is not valid"),
    ("slot1_1", 0, "is not a limit"),
    ("slot1_1", -5, "is not a limit"),
])
def test_nothing_that_could_change_the_nft_text_or_is_not_a_limit_gets_through(slot, mbit, error):
    with pytest.raises(LarkError, match=error):
        sp.policer_cmds("lark_sandbox", S, slot, mbit, "x", 1)


def test_the_policers_of_a_listing_are_found_by_their_comments():
    comment = sp.policer_comment(S, "slot1_1")
    listing = [
        {"metainfo": {"json_schema_version": 1}},
        {"table": {"family": "inet", "name": "lark_sandbox"}},
        {"rule": {"chain": "sandbox_out", "handle": 7, "comment": comment,
                  "expr": [{"counter": {"packets": 3, "bytes": 1500}}, {"drop": None}]}},
        {"rule": {"chain": "sandbox_in", "handle": 8, "comment": comment,
                  "expr": [{"counter": {"packets": 1, "bytes": 60}}, {"drop": None}]}},
        {"rule": {"chain": "sandbox_in", "handle": 9, "comment": "someone else's rule"}},
        {"rule": {"chain": "sandbox_in", "handle": 10,
                  "comment": "lark sandbox starter 5 start 6 slot slot2_1",
                  "expr": [{"counter": {"packets": 9, "bytes": 999}}]}},
    ]
    assert sp.policers_in(listing) == [sp.Policer("sandbox_out", 7, S), sp.Policer("sandbox_in", 8, S),
                                       sp.Policer("sandbox_in", 10, sp.Starter(5, 6))]
    assert sp.counters_in(listing, S) == {"sandbox_out": 1500, "sandbox_in": 60}
    assert sp.counters_in(listing, sp.Starter(4242, 1)) == {}   # same pid, another start: not this starter


def test_nft_is_given_the_cgroups_path_under_its_root_and_its_level_under_the_mount(tmp_path):
    hybrid = sp.SandboxPolice("/sys/fs/cgroup/unified", "/sys/fs/cgroup", "lark.sandbox", "lark_sandbox",
                              nft=lambda cmd: (0, "", ""))
    assert hybrid.cgroup_dir(S) == "/sys/fs/cgroup/unified/lark.sandbox/starter-4242-987654"
    assert hybrid.nft_path(S) == ("unified/lark.sandbox/starter-4242-987654", 2)
    assert hybrid.unavailable() is None
    pure = sp.SandboxPolice("/sys/fs/cgroup", "/sys/fs/cgroup", "lark.sandbox", "lark_sandbox")
    assert pure.nft_path(S) == ("lark.sandbox/starter-4242-987654", 2)
    assert "outside /sys/fs/cgroup" in (sp.SandboxPolice("/mnt/cg2", "/sys/fs/cgroup", "x", "t").unavailable() or "")
    assert "not mounted" in (sp.SandboxPolice(None, "/sys/fs/cgroup", "x", "t").unavailable() or "")


def test_what_the_police_sends_is_the_text_above_and_a_missing_table_is_no_policer(tmp_path):
    sent: list[str] = []

    def nft(cmd: str):
        sent.append(cmd)
        if cmd.startswith(("list ", "delete table ")):
            return 1, "", "Error: No such file or directory; did you mean table 'lark' in family inet?"
        return 0, "", ""
    (tmp_path / "cg").mkdir()
    police = sp.SandboxPolice(str(tmp_path / "cg"), str(tmp_path), "lark.sandbox", "lark_sandbox", nft=nft)
    assert police.policers() == []
    police.ensure_table()
    police.add_policers(S, "slot1_1", 20)
    errors: list[str] = []
    police.delete_policers(S, errors)
    assert errors == []
    assert sent == ["list table inet lark_sandbox", sp.table_cmds("lark_sandbox"),
                    sp.policer_cmds("lark_sandbox", S, "slot1_1", 20, "cg/lark.sandbox/starter-4242-987654", 2),
                    "list table inet lark_sandbox"]
    assert police.delete_table() is None   # "No such file": nothing was there, nothing to say


def test_a_failing_nft_is_an_error_naming_the_object_and_the_fix():
    def nft(cmd: str):
        if cmd.startswith("list "):
            return 0, json.dumps({"nftables": [{"rule": {"chain": "sandbox_out", "handle": 3,
                                                         "comment": sp.policer_comment(S, "slot1_1")}}]}), ""
        return 1, "", "Error: Could not process rule: Operation not supported"
    police = sp.SandboxPolice("/sys/fs/cgroup/unified", "/sys/fs/cgroup", "lark.sandbox", "lark_sandbox", nft=nft)
    with pytest.raises(LarkError, match="nft failed: Error: Could not process rule") as e:
        police.ensure_table()
    assert "nft table inet lark_sandbox" in str(e.value) and "lark doctor" in str(e.value)
    errors: list[str] = []
    police.delete_policers(S, errors)   # goes on past the failure, and says it
    assert len(errors) == 1 and "sandbox rule of starter pid 4242" in errors[0]
    assert police.delete_table() == "nft table inet lark_sandbox (incomplete: Error: Could not process rule: " \
                                    "Operation not supported)"
