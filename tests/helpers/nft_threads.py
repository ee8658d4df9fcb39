"""Run by tests/integration/test_libnft_threads.py in a child process (a heap corruption must not take pytest with
it): for `seconds`, one thread uses a shared libnftables context made in netns X (a netdev chain whose rule
forwards to a device: the device name is resolved through libnftables' process-global interface list), while two
threads make, use and free contexts in netns Y, as larkd's setups do for the jobs' in-namespace filters.
Prints the number of failed shared commands, then their distinct messages. Argv: X Y seconds."""
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from lark.kernel import netns  # noqa: E402
from lark.kernel.firewall import libnft  # noqa: E402

CMD = ('add table netdev lark_t; add chain netdev lark_t c { type filter hook ingress device "lkt1" priority 0; }; '
       'flush chain netdev lark_t c; add rule netdev lark_t c fwd to "lkt0"')


def main() -> None:
    x, y, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    fx, fy = os.open(f"/run/netns/{x}", os.O_RDONLY), os.open(f"/run/netns/{y}", os.O_RDONLY)
    stop = time.monotonic() + seconds
    errors: list[str] = []

    def shared() -> None:
        with netns.entered(fx):
            ctx = libnft.LibNft()
            while time.monotonic() < stop:
                rc, _, err = ctx.run(CMD)
                if rc:
                    errors.append(err.strip()[:200])

    def per_netns() -> None:
        while time.monotonic() < stop:
            libnft.run_in_netns(fy, "list ruleset")

    threads = [threading.Thread(target=shared), threading.Thread(target=per_netns),
               threading.Thread(target=per_netns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(len(errors))
    print(json.dumps(sorted(set(errors))))


if __name__ == "__main__":
    main()
