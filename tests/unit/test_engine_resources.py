"""Issue 24: the engine that builds a job's network from one list of resources, against fake resources, and the
shape of the real list (teardown order keeps the dependencies teardown had: counters before the veth, processes
in the netns before the netns, addresses back last)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from lark.config import Config
from lark.daemon.engine import Engine, Phase, TeardownErrors
from lark.daemon.profiles import BRIDGED, NETWORKED, NO_NETWORK, make_profiles
from lark.daemon.resources import resources
from lark.kernel.attach.nat import NatMode
from lark.kernel.sections import NatSection


class Fake:
    """A resource whose objects are (name, key) pairs in a shared set; any step can be told to fail."""

    def __init__(self, name: str, world: set, log: list, phase: Phase = Phase.UNLINK, fail: str = ""):
        self.name, self.phase, self.world, self.log, self.fail = name, phase, world, log, fail

    def add(self, ctx) -> None:
        self.log.append(f"add {self.name}")
        if self.fail == "add":
            self.world.add((self.name, ctx.key))  # half-built, as a real failing step may leave it
            raise OSError(f"injected failure adding {self.name}")
        self.world.add((self.name, ctx.key))

    def remove(self, ctx, errors: TeardownErrors) -> None:
        errors.run(f"remove {self.name}", self._remove, ctx.key)

    def _remove(self, key: str) -> None:
        self.log.append(f"remove {self.name}")
        if self.fail == "remove":
            raise OSError(f"injected failure removing {self.name}")
        self.world.discard((self.name, key))

    def keys(self):
        return [(key, f"{self.name} of {key}") for name, key in sorted(self.world) if name == self.name]


def _engine(fail: dict[str, str] | None = None, phases: dict[str, Phase] | None = None):
    world: set = set()
    log: list = []
    names = ["a", "b", "c", "d"]
    res = [Fake(n, world, log, (phases or {}).get(n, Phase.UNLINK), (fail or {}).get(n, "")) for n in names]
    return Engine(res), world, log


def test_a_resource_failing_mid_setup_leaves_nothing_behind_every_added_one_removed_in_reverse():
    engine, world, log = _engine(fail={"c": "add"})
    ctx = SimpleNamespace(key="slot1")
    saves: list[list] = []
    errors = TeardownErrors("slot1")
    with pytest.raises(OSError, match="injected failure adding c"):
        engine.build(ctx, ["a", "b", "c", "d"], lambda c: saves.append(sorted(world)),
                     lambda: engine.teardown(ctx, errors))
    assert world == set() and not errors
    assert log == ["add a", "add b", "add c", "remove d", "remove c", "remove b", "remove a"]
    assert saves == [[("a", "slot1")], [("a", "slot1"), ("b", "slot1")]]  # saved after each completed step


def test_build_adds_only_the_profiles_resources_in_the_engines_order():
    engine, world, log = _engine()
    engine.build(SimpleNamespace(key="k"), ["d", "b"], lambda c: None, lambda: None)
    assert log == ["add b", "add d"] and world == {("b", "k"), ("d", "k")}
    with pytest.raises(ValueError, match="no such resources"):
        engine.select(["b", "nope"])


def test_teardown_goes_on_past_failing_removes_and_reports_every_error():
    engine, world, log = _engine(fail={"b": "remove", "d": "remove"})
    ctx = SimpleNamespace(key="slot1")
    engine.build(ctx, ["a", "b", "c", "d"], lambda c: None, lambda: None)
    errors = TeardownErrors("slot1")
    engine.teardown(ctx, errors)
    assert log[-4:] == ["remove d", "remove c", "remove b", "remove a"]
    assert world == {("b", "slot1"), ("d", "slot1")}
    err = errors.error("7.0")
    assert str(err).startswith("job 7.0: job key slot1: teardown finished with 2 error(s): ")
    assert "could not remove d: injected failure removing d" in str(err)
    assert "could not remove b: injected failure removing b" in str(err) and "lark gc" in str(err)


def test_a_remove_that_raises_instead_of_reporting_does_not_stop_the_others():
    engine, world, log = _engine()

    def boom(ctx, errors):
        raise RuntimeError("bug")

    engine.by_name["c"].remove = boom  # type: ignore[method-assign]
    errors = TeardownErrors("k")
    engine.build(SimpleNamespace(key="k"), ["a", "b", "c", "d"], lambda c: None, lambda: None)
    engine.teardown(SimpleNamespace(key="k"), errors)
    assert world == {("c", "k")} and errors.failed == ["could not remove the c: bug"]


def test_teardown_runs_phase_by_phase_and_reverse_within_a_phase():
    engine, _, log = _engine(phases={"a": Phase.POOLS, "b": Phase.RELEASE, "c": Phase.COUNT, "d": Phase.RELEASE})
    engine.teardown(SimpleNamespace(key="k"), TeardownErrors("k"))
    assert log == ["remove d", "remove b", "remove c", "remove a"]


def test_gc_keys_are_the_union_of_every_resources_keys():
    engine, world, _ = _engine()
    world |= {("a", "x"), ("c", "x"), ("d", "y")}
    assert engine.keys() == {"x": ["a of x", "c of x"], "y": ["d of y"]}


def test_resource_names_are_unique():
    world: set = set()
    with pytest.raises(ValueError, match="unique"):
        Engine([Fake("a", world, []), Fake("a", world, [])])


# The real list.

def _real_engine() -> Engine:
    return Engine(resources(SimpleNamespace()))  # type: ignore[arg-type]  (constructing reads nothing of it)


def test_every_profile_names_resources_of_the_list_and_builds_netns_first():
    engine = _real_engine()
    for names in (NETWORKED, BRIDGED, NO_NETWORK.resources):
        chosen = [r.name for r in engine.select(names)]
        assert chosen[0] == "netns" and set(chosen) == set(names)
    built = [r.name for r in engine.select(NETWORKED)]
    # Addresses reserved before the veth; the controller answers before the firewall (it may revoke DNS).
    assert built.index("reservations") < built.index("veth") < built.index("attach") < built.index("address")
    assert built.index("controller") < built.index("firewall") == len(built) - 1


def test_the_real_teardown_order_keeps_teardowns_dependencies():
    order = [r.name for r in _real_engine().teardown_order()]
    # The firewall's and the veth's counters are read before the veth goes.
    assert order.index("firewall") < order.index("veth")
    # The mode lets go of the host end before the veth is deleted.
    assert order.index("attach") < order.index("veth")
    # The DHCPv6 client and the IPv6 DNS relay stop and the fireflies finish before the netns goes.
    for before_netns in ("address", "dns", "scitags"):
        assert order.index(before_netns) < order.index("netns")
    # The lease is released while the job's link exists to send the RELEASE.
    assert order.index("dhcp-lease") < order.index("veth")
    assert order.index("dhcp-lease") < order.index("controller")   # the RELEASE crosses the pool switch
    assert order[-1] == "reservations"  # addresses back last


def test_profiles_carry_what_the_orchestrator_used_to_branch_on(tmp_path):
    cfg = Config(run_dir=str(tmp_path / "run"), state_dir=str(tmp_path / "state"), subnet="10.77.0.0/29").validate()
    profiles = make_profiles({"nat": NatMode(NatSection.from_config(cfg))})
    assert set(profiles) == {"nat", "none"}
    nat = profiles["nat"]
    assert not nat.bridged and not nat.counts_by_link and not nat.bridge_table
    assert "dhcp-lease" not in nat.resources and nat.resources == NETWORKED
    assert profiles["none"].mode is None and profiles["none"].resources == ("netns", "job-side")


# The real list on the fake kernel (tests/helpers/fakekernel.py): a failure at any step leaves nothing.

@pytest.mark.parametrize("step", ["netns.attach", "links.create_veth", "mode.attach", "links.bring_up",
                                  "dns.setup_job", "shaping.apply", "job_netns.secure", "nftables.add_job"])
def test_a_failure_at_any_step_of_a_nat_job_leaves_nothing_behind(tmp_path, monkeypatch, step):
    import os

    from helpers.fakekernel import fake_networker

    from lark.errors import LarkError
    from lark.plan import NetworkPlan

    net, k = fake_networker(str(tmp_path), monkeypatch)
    k.fail.add(step)
    with pytest.raises(LarkError, match=f"job 7.0: slot slot1: setup failed: injected failure of {step}"):
        net.setup(NetworkPlan(job_id="7.0", slot="slot1", key="slot1", inbound=True, rate_limit_mbit=10.0),
                  os.getpid(), 1, os.getpid(), 99)
    assert step in k.calls
    assert k.of_key("slot1") == set() and net.records.keys() == []
    assert list(net.modes["nat"].pool.entries()) == [] and list(net.ports.entries()) == []
    assert net.engine.keys() == {}  # gc finds nothing either


def test_a_label_the_jobs_port_cannot_carry_refuses_the_job():
    """A job can ask for a RequestedVLAN port, where the EP's switch cannot tag it with the controller's label:
    untagged, its frames would pass a label-scheme core as host traffic, outside the controller's policy. The
    registration step refuses it (the engine then undoes the job) instead of running it unlabelled."""
    from types import SimpleNamespace

    import pytest

    from lark.daemon.resources import ControllerRegistration
    from lark.errors import LarkError

    applied: list[tuple] = []

    class Mode:
        def __init__(self, can: bool):
            self.can = can

        def apply_label(self, net, names, vid, pcp) -> bool:
            applied.append((vid, pcp))
            return self.can

    controller = SimpleNamespace(register=lambda net, mac: {"label": {"vid": 4094, "pcp": 0}, "blocked_by": "p"})
    step = ControllerRegistration(SimpleNamespace(controller=controller))
    net = SimpleNamespace(plan=SimpleNamespace(job_id="7.0"), dns_revoked_by="p", with_addresses=lambda **kw: net)

    def ctx(can: bool):
        return SimpleNamespace(net=net, names=SimpleNamespace(job_mac="02:00:00:00:00:01", host_if="lkh0"),
                               profile=SimpleNamespace(bridged=True, mode=Mode(can), network_type="ovs_bridge"),
                               set_net=lambda n: None)
    with pytest.raises(LarkError, match="label cannot be applied"):
        step.add(ctx(False))
    step.add(ctx(True))     # a port that can carry it: tagged, no refusal
    assert applied == [(4094, 0), (4094, 0)]
