"""Issue 24: whether a job registers with the pool controller (bridged) and is tagged with a label is its attach
mode's answer, asked through the JobNetworker's profiles, not a list of network types in controller_client.py.
A new mode (here a fake "macvlan") needs no change there."""
import os

from helpers.fakekernel import FakeAttach, FakeKernel, fake_networker

from lark.config import Config
from lark.daemon.controller_client import builtin_traits
from lark.daemon.records import JobRecord
from lark.kernel.attach.base import BridgedMode
from lark.kernel.attach.nat import NatMode


class FakeMacvlan(FakeAttach, BridgedMode):
    """A new bridged mode the client has never heard of; `tags_labels` set per test."""
    name, kind, step_prefix = "macvlan", "macvlan-port", "macvlan"

    def __init__(self, cfg: Config, kernel: FakeKernel, tags_labels: bool):
        BridgedMode.__init__(self, self.section.from_config(cfg))
        self.k = kernel
        self.tags_labels = tags_labels


class RoutedBridge(FakeAttach, NatMode):
    """A mode under a bridged-sounding name that is not bridged: the name must not decide."""
    name, kind, step_prefix, makes_shared, filters = "bridge", "route", "mode", False, False

    def __init__(self, cfg: Config, kernel: FakeKernel):
        NatMode.__init__(self, self.section.from_config(cfg))
        self.k = kernel


def ready(net, key: str, network_type: str) -> None:
    net.records.save(JobRecord(key=key, slot=key, job_id=f"{key}.0", starter_pid=os.getpid(), starter_start=1,
                               job_pid=os.getpid(), netns_inode=1, netns=f"lark-{key}", host_if=f"lk-{key}",
                               phase="ready", plan={"key": key, "job_id": f"{key}.0", "network_type": network_type,
                                                    "ipv4": "192.0.2.10"}))


def test_a_new_modes_traits_decide_registration_and_tagging(tmp_path):
    for tags in (True, False):
        net, k = fake_networker(str(tmp_path / str(tags)), modes=("nat", "bridge"))
        net.modes = {"nat": net.modes["nat"], "bridge": RoutedBridge(net.cfg, k),
                     "macvlan": FakeMacvlan(net.cfg, k, tags_labels=tags)}
        for key, network_type in (("slot1", "macvlan"), ("slot2", "bridge"), ("slot3", "nat"), ("slot4", "gone")):
            ready(net, key, network_type)
        jobs = net.controller.jobs()
        assert [(j["key"], j["tagged"]) for j in jobs] == [("slot1", tags)]
        assert net.controller.traits("macvlan").bridged and net.controller.traits("macvlan").tags_labels is tags
        assert not net.controller.traits("bridge").bridged and net.controller.traits("gone") is None


def test_a_client_without_profiles_asks_the_attach_mode_classes():
    assert builtin_traits("bridge").bridged and not builtin_traits("bridge").tags_labels
    assert builtin_traits("ovs_bridge").bridged and builtin_traits("ovs_bridge").tags_labels
    assert not builtin_traits("nat").bridged and builtin_traits("none") is None
