"""The sandbox transfer (starter <-> shadow) limited to the slot's Bandwidth (issue 22, LARK_SANDBOX_LIMIT, on by
default): lark-starter puts each starter into a cgroup of its own and larkd polices it in the EP's netns. In the
single-EP testbed the shadow and the starter talk over 127.0.0.1 in the EP's netns, so those policers see it.

The transfer's time comes from the job's event log (the shadow's file-transfer events, 1 s resolution)."""
import pytest

from condor import SUBMITTED, JobEventLog, JobEventType, history, job, submit, testbed

pytestmark = pytest.mark.e2e

SIZE = 50_000_000
MBIT = 20


def transfer_seconds(cluster: int) -> dict[str, float]:
    """Input and output transfer times (s) from the event log's FILE_TRANSFER events."""
    import htcondor2
    at: dict[str, float] = {}
    names = {htcondor2.FileTransferEventType.IN_STARTED: "in_start",
             htcondor2.FileTransferEventType.IN_FINISHED: "in_end",
             htcondor2.FileTransferEventType.OUT_STARTED: "out_start",
             htcondor2.FileTransferEventType.OUT_FINISHED: "out_end"}
    for event in JobEventLog(str(SUBMITTED[cluster] / "log.txt")).events(stop_after=0):
        if event.cluster == cluster and event.type == JobEventType.FILE_TRANSFER:
            name = names.get(htcondor2.FileTransferEventType(event["Type"]))
            if name:
                at[name] = event.timestamp
    return {"input": at["in_end"] - at["in_start"], "output": at["out_end"] - at["out_start"]}


def test_sandbox_transfer_is_limited_to_the_slots_bandwidth_both_ways(pool):
    d = testbed.ROOT / "home/alice/ft-sandbox-limit"
    d.mkdir(parents=True, exist_ok=True)
    with open(d / "big.in", "wb") as f:
        f.truncate(SIZE)  # sparse on the submit side; every byte still crosses the wire
    c = submit("ft-sandbox-limit", job(exe="/bin/sh", args=f"-c 'head -c {SIZE} /dev/urandom > big.out; wc -c < big.in'",
                                       inputs=("big.in",),
                                       extra=f"transfer_output_files = big.out\nrequest_bandwidth = {MBIT}"))
    code, recvd, sent = history(c, ["ExitCode", "BytesRecvd", "BytesSent"], timeout=300)  # and: it ran once
    assert code == "0" and (d / "big.out").stat().st_size == SIZE
    assert (d / "out.txt").read_text().strip() == str(SIZE)
    ideal = SIZE * 8 / (MBIT * 1e6)
    took = transfer_seconds(c)
    ratios = {way: ideal / s if s > 0 else float("inf") for way, s in took.items()}
    print(f"sandbox at {MBIT} Mbit/s, {SIZE} bytes each way (BytesRecvd {recvd}, BytesSent {sent}): ideal "
          f"{ideal:.1f} s; input {took['input']:.0f} s (goodput ratio {ratios['input']:.3f}), output "
          f"{took['output']:.0f} s (goodput ratio {ratios['output']:.3f})")
    for way in ("input", "output"):
        assert ratios[way] <= 1.3, f"{way} sandbox moved at {ratios[way]:.2f}x the slot's {MBIT} Mbit/s: not limited"
        assert took[way] >= 0.7 * ideal
    (d / "big.out").unlink()
