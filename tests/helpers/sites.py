"""The three attach modes on the fake EP, as FakeHost keyword sets (for tests that run a site setup in each)."""
from .fakehost import WORLD_IP

BRIDGED = dict(bridge_range="198.51.100.100-198.51.100.149", bridge_prefix=24, bridge_gateway=WORLD_IP)
MODES = {
    "nat": dict(default_network_type="nat"),
    "bridge": dict(default_network_type="bridge", bridge_name="lkbr0", bridge_uplink="up0", **BRIDGED),
    "ovs_bridge": dict(ovs=True, default_network_type="ovs_bridge", ovs_bridge_name="lkovs0", ovs_uplink="up0",
                       ovs_datapath="netdev", **BRIDGED),
}
