"""Live demo on a fake execution point: a few jobs get networked, move real traffic, and Lark reports them.

Builds a host netns with an uplink to a world netns (HTTP and sink servers), runs larkd inside the host, starts
jobs through a stand-in starter that clones each into an empty netns, shows `lark status` while they run and
the final accounting after, then removes everything it made.
"""
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from helpers.fakehost import HOST_IP, WORLD_IP, FakeHost, build_starter, sh  # noqa: E402

log = logging.getLogger("demo")


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="demo: %(message)s")
    if os.geteuid() != 0:
        log.error("run as root: the demo creates network namespaces")
        return 2
    base = tempfile.mkdtemp(prefix="lark-demo-", dir="/tmp")
    os.chmod(base, 0o755)
    starter = build_starter(base)
    hostdir = os.path.join(base, "host")
    os.makedirs(hostdir, mode=0o755)
    host = FakeHost(hostdir, starter)
    try:
        host.start()
        log.info("fake execution point %s up, uplink %s -> world %s; larkd running", host.host_ns, HOST_IP, WORLD_IP)
        (host.www / "dataset.bin").write_bytes(os.urandom(40_000_000))
        jobs = {
            "slot1": (["download-for", f"http://{WORLD_IP}:8000/dataset.bin", "4"], 'ClusterId = 101\nProcId = 0\nOwner = "alice"'),
            "slot2": (["upload", WORLD_IP, "7001", "25000000"], 'ClusterId = 102\nProcId = 0\nOwner = "bob"'),
            "slot3": (["listen", "0", "6"], 'ClusterId = 103\nProcId = 0\nOwner = "carol"\nInboundConnectivity = true'),
            "slot4": (["connect", WORLD_IP, "8000"], 'ClusterId = 104\nProcId = 0\nOwner = "dave"\n'
                      'InboundConnectivity = false\nOutboundConnectivity = false'),
            "slot5": (["sleep", "3"], 'ClusterId = 105\nProcId = 0\nOwner = "erin"'),
        }
        procs = {slot: host.spawn_job(slot, argv, job_ad=ad) for slot, (argv, ad) in jobs.items()}
        time.sleep(2.5)
        print("\n$ lark status   (while the jobs run)")
        print(host.lark("status").stdout)
        port = next((j["plan"]["inbound_port"] for j in host.status() if j["slot"] == "slot3"), None)
        if port:
            reply = sh(host.in_world(["python3", "-c", f"import socket;print(socket.create_connection(('{HOST_IP}',{port}),"
                                      "timeout=3).recv(100).decode().strip())"]), check=False).stdout.strip()
            print(f"world -> {HOST_IP}:{port} (slot3's inbound port) answered: {reply!r}\n")
        for slot, p in procs.items():
            out, err = p.communicate(timeout=120)
            print(f"{slot} job output: {out.strip() or err.strip()}")
        host.wait_clean()
        print("\nFinal accounting (taken by larkd just before each job's teardown):")
        print(f"{'job':<7} {'owner':<6} {'mode':<5} {'address':<13} {'bytes in':>11} {'bytes out':>11} "
              f"{'avg in Mbit/s':>14} {'avg out Mbit/s':>15}")
        fin = Path(host.cfg.state_dir) / "finished"
        for f in sorted(fin.iterdir()):
            s = json.loads(f.read_text())
            print(f"{s['job_id']:<7} {s['owner']:<6} {s['network_type']:<5} {s['ipv4'] or '-':<13} {s['bytes_in']:>11} "
                  f"{s['bytes_out']:>11} {s['avg_in_bps'] / 1e6:>14.1f} {s['avg_out_bps'] / 1e6:>15.1f}")
        print("\n(job 104 asked for no network: it had only `lo`, so it has no address and no counters)")
        residue = host.residue()
        print(f"kernel residue after the jobs: {residue}")
        return 0 if not any(residue.values()) else 1
    finally:
        host.close()
        sh(["rm", "-rf", base], check=False)
        log.info("fake execution point removed")


if __name__ == "__main__":
    sys.exit(main())
