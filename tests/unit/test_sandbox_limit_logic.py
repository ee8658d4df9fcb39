"""The sandbox-transfer limit's error paths, with fakes: larkd away (lark-starter fails open), a non-root asker, the
knob off, no cgroup v2, a slot without Bandwidth. The real cgroup and nft: tests/integration/test_sandbox_limit.py."""
import asyncio
import json
import os

import classad2
import pytest
from helpers.fakekernel import fake_networker

from lark.config import Config
from lark.daemon import server as server_mod
from lark.daemon.peercred import Peer, start_time
from lark.daemon.sandbox import SandboxLimiter, slot_bandwidth
from lark.errors import LarkError
from lark.job import starter_wrapper
from lark.kernel.sandbox_police import Starter, cgroup2_mount

ME = os.getpid()
ROOT = Peer(pid=ME, uid=0, gid=0, start=start_time(ME))


class FakeNft:
    def __init__(self):
        self.cmds: list[str] = []

    def __call__(self, cmd: str):
        self.cmds.append(cmd)
        if cmd.startswith("list "):
            return 1, "", "Error: No such file or directory"
        return 0, "", ""


def _limiter(tmp_path, nft=None, **cfg) -> SandboxLimiter:
    (tmp_path / "cg").mkdir(exist_ok=True)
    return SandboxLimiter(Config(**cfg), nft=nft or FakeNft(), cg2=str(tmp_path / "cg"), nft_root=str(tmp_path))


def _daemon(tmp_path, monkeypatch, **cfg):
    net, _ = fake_networker(str(tmp_path), monkeypatch, ad_source="files", ad_dir=str(tmp_path / "ads"), **cfg)
    d = server_mod.Larkd(net.cfg)
    d.fw, d.net, d.records, d.acct, d.finished = net.fw, net, net.records, net.acct, net.finished
    return d


def _run(d, coro_fn):
    async def main():
        d.loop = asyncio.get_running_loop()
        try:
            result = await coro_fn()
            while d.tasks:   # the background policers
                await asyncio.gather(*list(d.tasks), return_exceptions=True)
            return result
        finally:
            d.sandbox.unwatch_all()   # the "starter" is this test process: do not wait for it
    return asyncio.run(main())


# -- lark-starter ------------------------------------------------------------------------------------------------
@pytest.fixture
def execs(monkeypatch):
    seen: list[list[str]] = []
    monkeypatch.setenv("LARK_REAL_STARTER", "/usr/sbin/condor_starter")
    monkeypatch.setattr(starter_wrapper.os, "execv", lambda prog, argv: seen.append(argv))
    return seen


def test_starter_starts_anyway_when_larkd_is_away(monkeypatch, tmp_path, execs, capsys):
    monkeypatch.setenv("LARK_SOCKET", str(tmp_path / "no.sock"))
    monkeypatch.delenv("LARK_SANDBOX_LIMIT", raising=False)
    starter_wrapper.main(["-f", "-a", "slot1_1", "<127.0.0.1:9618>"])
    assert execs == [["/usr/sbin/condor_starter", "-f", "-a", "slot1_1", "<127.0.0.1:9618>"]]
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "slot slot1_1: sandbox transfer not limited" in err[0] and "starts anyway" in err[0]
    assert "larkd is not running" in err[0]


def test_starter_starts_anyway_when_larkd_refuses(monkeypatch, execs, capsys):
    def refuse(op, **kw):
        raise LarkError("operation sandbox_limit is for root only", obj="larkd")
    monkeypatch.setattr(starter_wrapper, "call", refuse)
    starter_wrapper.main(["-f", "-a", "slot1_1"])
    assert len(execs) == 1 and "for root only" in capsys.readouterr().err


def test_starter_asks_with_its_slot_and_argv_unless_told_not_to(monkeypatch, execs):
    asked: list[tuple] = []
    monkeypatch.setattr(starter_wrapper, "call", lambda op, **kw: asked.append((op, kw)) or {"ok": True})
    starter_wrapper.main(["-f", "-local-name", "x", "-a", "slot2_3"])
    assert asked == [("sandbox_limit", {"timeout": starter_wrapper.SANDBOX_ASK_TIMEOUT, "slot": "slot2_3",
                                        "argv": ["-f", "-local-name", "x", "-a", "slot2_3"]})]
    monkeypatch.setenv("LARK_SANDBOX_LIMIT", "false")
    starter_wrapper.main(["-f", "-a", "slot2_3"])
    monkeypatch.delenv("LARK_SANDBOX_LIMIT")
    starter_wrapper.main(["-version"])   # no slot: not a job's starter
    assert len(asked) == 1 and len(execs) == 3


# -- larkd's op ---------------------------------------------------------------------------------------------------
def test_only_root_may_ask(tmp_path, monkeypatch):
    d = _daemon(tmp_path, monkeypatch)
    with pytest.raises(LarkError, match="operation sandbox_limit is for root only"):
        _run(d, lambda: d.dispatch({"op": "sandbox_limit", "slot": "slot1_1", "argv": []},
                                   Peer(pid=ME, uid=1000, gid=1000, start=start_time(ME))))


def test_knob_off_answers_at_once_and_makes_nothing(tmp_path, monkeypatch):
    d = _daemon(tmp_path, monkeypatch, sandbox_limit=False)
    d.sandbox.limiter = _limiter(tmp_path)
    a = json.loads(_run(d, lambda: d.dispatch({"op": "sandbox_limit", "slot": "slot1_1", "argv": []}, ROOT)))
    assert a["ok"] and a["limited"] is False and "LARK_SANDBOX_LIMIT" in a["reason"]
    assert os.listdir(tmp_path / "cg") == []


def test_no_cgroup2_is_refused_with_the_reason_and_the_fix(tmp_path, monkeypatch):
    d = _daemon(tmp_path, monkeypatch)
    d.sandbox.limiter = SandboxLimiter(d.cfg, nft=FakeNft(), cg2="")   # no cgroup2 mount
    with pytest.raises(LarkError, match=r"cgroup v2 is not mounted.*LARK_SANDBOX_LIMIT = false"):
        _run(d, lambda: d.dispatch({"op": "sandbox_limit", "slot": "slot1_1", "argv": []}, ROOT))
    assert cgroup2_mount(str(tmp_path / "nothing")) is None
    mi = tmp_path / "mountinfo"
    mi.write_text("31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 "
                  "cgroup2 rw\n")
    assert cgroup2_mount(str(mi)) == "/sys/fs/cgroup/unified"
    outside = SandboxLimiter(d.cfg, nft=FakeNft(), cg2="/mnt/cg2")
    assert "outside /sys/fs/cgroup" in (outside.unavailable() or "")


def test_bad_requests_are_refused(tmp_path, monkeypatch):
    d = _daemon(tmp_path, monkeypatch)
    d.sandbox.limiter = _limiter(tmp_path)
    with pytest.raises(LarkError, match="needs the slot name and the starter's argv"):
        _run(d, lambda: d.dispatch({"op": "sandbox_limit", "slot": "slot1_1"}, ROOT))
    with pytest.raises(LarkError, match="slot name"):
        _run(d, lambda: d.dispatch({"op": "sandbox_limit", "slot": "../x y", "argv": []}, ROOT))


def _ad_files(tmp_path, slot: str, bandwidth: int | None) -> None:
    ads = tmp_path / "ads"
    ads.mkdir(exist_ok=True)
    (ads / f"{slot}.machine.ad").write_text(f"Bandwidth = {bandwidth}\n" if bandwidth is not None else "Cpus = 1\n")


@pytest.mark.skipif(os.geteuid() != 0, reason="the files ad source trusts root-owned ads only")
def test_the_starter_joins_its_cgroup_and_gets_policers_at_the_slots_bandwidth(tmp_path, monkeypatch):
    d = _daemon(tmp_path, monkeypatch)
    nft = FakeNft()
    d.sandbox.limiter = _limiter(tmp_path, nft=nft)
    _ad_files(tmp_path, "slot1_1", 20)
    a = json.loads(_run(d, lambda: d.dispatch({"op": "sandbox_limit", "slot": "slot1_1", "argv": ["-a", "slot1_1"]},
                                              ROOT)))
    s = Starter(ME, start_time(ME))
    path = tmp_path / "cg" / "lark.sandbox" / s.name
    assert a == {"lark": 1, "ok": True, "limited": True, "cgroup": str(path)}
    fake_procs = (path / "cgroup.procs").read_text().split()
    assert fake_procs == [str(ME)]
    rules = [line for c in nft.cmds for line in c.splitlines() if line.startswith("add rule")]
    assert rules == [f'add rule inet lark_sandbox {chain} socket cgroupv2 level 2 "cg/lark.sandbox/{s.name}" counter '
                     f'limit rate over 2500000 bytes/second burst 65536 bytes drop comment '
                     f'"lark sandbox starter {ME} start {s.start} slot slot1_1"' for chain in ("sandbox_out", "sandbox_in")]


@pytest.mark.skipif(os.geteuid() != 0, reason="the files ad source trusts root-owned ads only")
def test_a_slot_without_bandwidth_gets_no_policer(tmp_path, monkeypatch, caplog):
    d = _daemon(tmp_path, monkeypatch)
    nft = FakeNft()
    d.sandbox.limiter = _limiter(tmp_path, nft=nft)
    _ad_files(tmp_path, "slot1_2", None)
    caplog.set_level("INFO")
    a = json.loads(_run(d, lambda: d.dispatch({"op": "sandbox_limit", "slot": "slot1_2", "argv": []}, ROOT)))
    assert a["ok"] and a["limited"] is True   # in its cgroup (counted by nothing, harmless) ...
    assert not [c for c in nft.cmds if c.startswith("add rule")]   # ... but not policed
    assert "slot slot1_2 (starter pid %d) not limited: the slot has no Bandwidth" % ME in caplog.text


def test_slot_bandwidth_reads_the_slot_ad_only():
    class Startd:
        def __init__(self, ad):
            self.ad = ad

        def slot_ad(self, starter):
            return self.ad
    assert slot_bandwidth(Startd(classad2.ClassAd({"Bandwidth": 20})), None) == 20.0
    for ad in ({}, {"Bandwidth": 0}, {"Bandwidth": "20"}, {"Bandwidth": True}):
        assert slot_bandwidth(Startd(classad2.ClassAd(ad)), None) is None


def test_limit_refuses_nonsense(tmp_path):
    lim = _limiter(tmp_path)
    with pytest.raises(LarkError, match="not a limit"):
        lim.limit(Starter(1, 2), "slot1", 0)
    with pytest.raises(LarkError, match="not valid"):
        lim.limit(Starter(1, 2), 'slot"; flush ruleset', 20)


def test_doctor_says_whether_the_sandbox_is_limited(monkeypatch):
    from lark import hostcheck
    from lark.kernel import sandbox_police as sandbox

    def runner(knobs):
        return lambda argv: (0, knobs[argv[1]] + "\n") if argv[1] in knobs else (1, "")
    lark_starter = {"STARTER": "/opt/lark/bin/lark-starter"}
    monkeypatch.setattr(sandbox, "cgroup2_mount", lambda: "/sys/fs/cgroup/unified")
    assert "sandbox transfer to and from the shadow limited to the slot's Bandwidth (LARK_SANDBOX_LIMIT" in \
        hostcheck.file_transfer(runner(lark_starter)).found
    off = hostcheck.file_transfer(runner(dict(lark_starter, LARK_SANDBOX_LIMIT="false"))).found
    assert "not limited (LARK_SANDBOX_LIMIT = false" in off
    assert "not limited (STARTER is not lark-starter" in hostcheck.file_transfer(runner({})).found
    monkeypatch.setattr(sandbox, "cgroup2_mount", lambda: None)
    assert "not limited (no cgroup v2 mount" in hostcheck.file_transfer(runner(lark_starter)).found


def test_purge_removes_the_table_and_the_parent_only_when_no_live_starter_holds_them(tmp_path):
    nft = FakeNft()
    lim = _limiter(tmp_path, nft)
    live = Starter(ME, start_time(ME))
    os.makedirs(lim.cgroup_dir(live))
    kept = lim.purge()   # this process is a live "starter": nothing goes, and purge says why
    assert kept == [f"nft table inet lark_sandbox and cgroup {lim.parent} (kept: 1 live starter(s) limited, e.g. "
                    f"pid {ME})"] and nft.cmds == ["list table inet lark_sandbox"]
    os.rmdir(lim.cgroup_dir(live))
    gone = Starter(ME, start_time(ME) + 1)   # same pid, another start: a starter that is gone
    os.makedirs(lim.cgroup_dir(gone))
    assert lim.purge() == ["nft table inet lark_sandbox", f"cgroup {lim.parent} (kept: Directory not empty)"]
    os.rmdir(lim.cgroup_dir(gone))
    assert lim.purge()[-1] == f"cgroup {lim.parent}" and not os.path.exists(lim.parent)
    assert lim.purge() == ["nft table inet lark_sandbox"]   # again: nothing left to remove but what nft says


def test_limit_adds_nothing_for_a_starter_whose_removal_came_first(tmp_path):
    """The policers come after the slot ad, in the background; the starter may have exited and been removed by
    then. Its cgroup is gone: no rule is added that nothing would remove."""
    nft = FakeNft()
    lim = _limiter(tmp_path, nft)
    gone = Starter(ME, start_time(ME) + 1)
    assert lim.remove(gone) == []
    lim.limit(gone, "slot1_1", 20)
    assert not [c for c in nft.cmds if "add rule" in c]


def test_limit_refuses_to_add_a_second_pair_when_the_first_cannot_be_deleted(tmp_path):
    class StuckNft(FakeNft):
        def __call__(self, cmd: str):
            self.cmds.append(cmd)
            if cmd.startswith("list "):
                s = Starter(ME, start_time(ME))
                rule = {"rule": {"chain": "sandbox_out", "handle": 7,
                                 "comment": f"lark sandbox starter {s.pid} start {s.start} slot slot1_1"}}
                return 0, json.dumps({"nftables": [rule]}), ""
            if cmd.startswith("delete rule"):
                return 1, "", "Error: Could not process rule: Device or resource busy"
            return 0, "", ""
    nft = StuckNft()
    lim = _limiter(tmp_path, nft)
    s = Starter(ME, start_time(ME))
    os.makedirs(lim.cgroup_dir(s))
    with pytest.raises(LarkError, match="cannot replace the sandbox policers of starter pid"):
        lim.limit(s, "slot1_1", 20)
    assert not [c for c in nft.cmds if "add rule" in c]


def test_on_a_pure_cgroup_v2_host_the_starter_is_not_moved(tmp_path, monkeypatch, caplog):
    """HTCondor on cgroup v2 makes each job's cgroup under the parent of its starter's: a starter moved into
    lark.sandbox/ would take its jobs' cgroups out of HTCondor's tree. The starter starts unlimited, told why."""
    d = _daemon(tmp_path, monkeypatch)
    d.sandbox.limiter = _limiter(tmp_path)
    assert d.sandbox.limiter.moves_job_cgroups() is None   # a hybrid host's /sys/fs/cgroup has no cgroup.procs
    (tmp_path / "cgroup.procs").write_text("")             # nft_root (tmp_path) is now a pure v2 root
    caplog.set_level("WARNING")
    for _ in range(2):
        a = json.loads(_run(d, lambda: d.dispatch({"op": "sandbox_limit", "slot": "slot1_1", "argv": []}, ROOT)))
        assert a["ok"] and a["limited"] is False and "pure cgroup v2 host" in a["reason"]
    assert os.listdir(tmp_path / "cg") == []
    assert caplog.text.count("sandbox transfers not limited: this is a pure cgroup v2 host") == 1
