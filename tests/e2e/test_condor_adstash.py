"""Issue 28: Lark's figures in HTCondor's own attributes reach `condor_adstash` with no Lark-specific setup.

One job moves known bytes with file transfer on; its history must carry NetworkInputMb / NetworkOutputMb equal to
NetworkIncomingBytes / NetworkOutgoingBytes over 10^6 (HTCondor's MB), and HTCondor's own condor_adstash (Debian's
condor package, /usr/libexec/condor/adstash), run in the pool's root against the schedd's history with its JSON-file
interface, must write the job's document with those two as numbers of the type its own mapping gives them (double),
and, given Lark's field file (docs/adstash-lark-fields.json), Lark's attributes under their names and types."""
import json
import logging
import secrets
import shutil

import pytest
from condor import REPO, as_root, history, submit_script, testbed

pytestmark = pytest.mark.e2e
log = logging.getLogger(__name__)

DOWNLOAD, UPLOAD = 10_000_000, 3_000_000
JOB = """import socket, urllib.request
got = len(urllib.request.urlopen("http://{world}:8000/10M.bin").read())
s = socket.create_connection(("{world}", 7001), timeout=60)
s.sendall(b"x" * {upload})
s.shutdown(socket.SHUT_WR)
print(got, s.recv(100).decode().strip())
"""
FIGURES = ["NetworkIncomingBytes", "NetworkOutgoingBytes", "NetworkInputMb", "NetworkOutputMb"]


def run_adstash(workdir: str, *extra: str) -> tuple[dict, dict]:
    """condor_adstash once over the local schedd's history into JSON files in `workdir` (inside the pool's root):
    (the documents by GlobalJobId, the field mapping it used). adstash logs a failed history query and still exits
    0, so the test reads what it wrote, not its status."""
    host_dir = testbed.ROOT / workdir.lstrip("/")
    host_dir.mkdir(parents=True)
    argv = ["condor_adstash", "--standalone", "--schedd_history", "--schedd_history_max_ads", "20",
            "--schedd_history_timeout", "60", "--interface", "jsonfile", "--json_dir", workdir,
            "--checkpoint_file", f"{workdir}/checkpoint.json", "--log_file", f"{workdir}/adstash.log", "-q", *extra]
    cp = as_root(argv)
    adstash_log = (host_dir / "adstash.log").read_text() if (host_dir / "adstash.log").exists() else ""
    assert cp.returncode == 0, f"{' '.join(argv)} exited {cp.returncode}: {cp.stderr[-2000:]}"
    docs: dict = {}
    # Documents go to <epoch>.json, a list per post; the mapping it computed to condor_adstash_jsonfile_*.json.
    for f in sorted(host_dir.glob("*.json")):
        if f.name[0].isdigit():
            docs.update({d["GlobalJobId"]: d for d in json.loads(f.read_text())})
    mapping_file = host_dir / "condor_adstash_jsonfile_last_mappings.json"
    assert docs and mapping_file.exists(), (
        f"condor_adstash wrote no job documents or no mapping into {host_dir}: "
        f"{sorted(p.name for p in host_dir.iterdir())}; its log:\n{adstash_log[-3000:]}")
    return docs, json.loads(mapping_file.read_text())["properties"]


def test_adstash_ships_network_mb_as_numbers_and_larks_fields_by_their_types(pool):
    name = f"adstash{secrets.token_hex(2)}"
    c = submit_script(name, JOB.format(world=testbed.WORLD_IP, upload=UPLOAD))
    # history() waits for the job and requires its event log to show exactly one start (file transfer is on).
    code, mode, gjid, *figs = history(c, ["ExitCode", "LarkNetworkType", "GlobalJobId", *FIGURES], timeout=180)
    assert (code, mode) == ("0", "nat"), (c, code, mode)
    assert (testbed.ROOT / "home/alice" / name / "out.txt").read_text().split() == [str(DOWNLOAD), str(UPLOAD)]
    gjid = gjid.strip('"')
    assert "undefined" not in figs, f"job {c}.0: its history lacks figures: {dict(zip(FIGURES, figs, strict=True))}"
    in_bytes, out_bytes = int(figs[0]), int(figs[1])
    in_mb, out_mb = float(figs[2]), float(figs[3])
    # IP bytes: payload plus headers, and outgoing also carries the download's ACKs (at most one 66-byte ACK per
    # 1448-byte segment, 4.6%).
    assert DOWNLOAD <= in_bytes < DOWNLOAD * 1.02 + UPLOAD * 0.05, (in_bytes, out_bytes)
    assert UPLOAD <= out_bytes < UPLOAD * 1.02 + DOWNLOAD * 0.05, (in_bytes, out_bytes)
    # HTCondor's MB is 10^6 bytes; larkd writes six decimals, so the history's figure is the same double as the
    # division: a stale write-back (the shadow's older copy) or a MiB would make them differ.
    assert (in_mb, out_mb) == (in_bytes / 1e6, out_bytes / 1e6), dict(zip(FIGURES, figs, strict=True))

    work = f"/root/adstash-e2e-{name}"
    try:
        # Stock adstash, no Lark field file: what an existing dashboard gets.
        docs, mapping = run_adstash(f"{work}/stock")
        assert gjid in docs, f"job {c}.0 ({gjid}) not among adstash's documents: {sorted(docs)}"
        doc = docs[gjid]
        log.info("adstash, stock mapping: %s", {k: v for k, v in doc.items() if "network" in k.lower()
                                                 or "lark" in k.lower()})
        assert mapping["NetworkInputMb"] == mapping["NetworkOutputMb"] == {"type": "double"}
        assert type(doc["NetworkInputMb"]) is float and type(doc["NetworkOutputMb"]) is float, doc
        assert (doc["NetworkInputMb"], doc["NetworkOutputMb"]) == (in_mb, out_mb)
        # Attributes its mapping does not know travel too, lower-cased, as keywords (strings).
        assert "NetworkIncomingBytes" not in mapping and "LarkNetworkType" not in mapping
        assert (doc["networkincomingbytes"], doc["networkoutgoingbytes"]) == (str(in_bytes), str(out_bytes))
        assert doc["larknetworktype"] == "nat"

        # With Lark's field file (docs/report.md): Lark's attributes under their names, counters as numbers.
        fields = f"{work}/lark-adstash-fields.json"
        shutil.copy(REPO / "docs/adstash-lark-fields.json", testbed.ROOT / fields.lstrip("/"))
        docs, mapping = run_adstash(f"{work}/lark", "--custom_field_properties", fields)
        doc = docs[gjid]
        log.info("adstash, Lark's field file: %s", {k: v for k, v in doc.items() if "network" in k.lower()
                                                     or "lark" in k.lower()})
        assert mapping["NetworkIncomingBytes"] == mapping["NetworkOutgoingBytes"] == {"type": "long"}
        assert mapping["LarkNetworkType"] == {"type": "keyword"}
        assert type(doc["NetworkIncomingBytes"]) is int and type(doc["NetworkOutgoingBytes"]) is int, doc
        assert (doc["NetworkIncomingBytes"], doc["NetworkOutgoingBytes"]) == (in_bytes, out_bytes)
        assert (doc["NetworkInputMb"], doc["NetworkOutputMb"]) == (in_mb, out_mb)
        assert doc["LarkNetworkType"] == "nat"
        assert not {"networkincomingbytes", "larknetworktype"} & doc.keys(), sorted(doc)
    finally:
        shutil.rmtree(testbed.ROOT / work.lstrip("/"), ignore_errors=True)
