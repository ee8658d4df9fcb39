"""`lark report` at pool scale: 1,000,000 synthetic history ads, first import and a report from the cache.

The ads are written as a schedd writes its history file (old-syntax `Attr = value` lines sorted by name length
then name, each ad ended by a `*** Offset = ... ClusterId = ...` banner), so the import measured is the real
`--history-file` path: the file reader, the row builder and the SQLite cache. Each ad is a copy of a real one
(a networked job on the testbed, HTCondor 25.14) with per-job values: 160 attributes and ~4.8 kB, expressions
(Requirements, MemoryUsage), lists, `Requestbandwidth` spelled as condor_submit writes it, and the accounting
group, batch and project attributes sites group by. Goals (issue 13): import >= 50,000 ads/s, report from the
cache <= 10 s. Prints a table, then one `key=value` line.
"""
from __future__ import annotations

import io
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lark.report import aggregate, importer, output  # noqa: E402
from lark.report.cache import Cache  # noqa: E402

N = int(os.environ.get("BENCH_ADS", "1000000"))
DAY = 86400
T0 = 1_790_812_800   # 2026-10-01 UTC: the ads spread over 60 days from here
OWNERS = [f"user{i:03d}" for i in range(300)]
GROUPS = [f"group_{g}" for g in ("atlas", "cms", "lhcb", "alice", "ligo", "icecube", "des", "dune")]
EPS = [f"ep{i:04d}.pool.example.org" for i in range(1000)]
TYPES = ["nat", "nat", "nat", "bridge", "ovs_bridge"]


SUBMIT = "submit.pool.example.org"
VERSION = '"$CondorVersion: 25.14.1 2026-10-16 PackageID: 25.14.1+dfsg-1 $"'

# Attributes of a real history ad of a job Lark networked (the testbed's, HTCondor 25.14), with their
# literal text; {name} fields vary per job.
AD = {
    "In": '"/dev/null"', "Cmd": '"/home/{owner}/analysis/run.sh"', "Err": '"_condor_stderr"', "Iwd": '"/home/{owner}/analysis/{batch}"',
    "Out": '"_condor_stdout"', "Rank": "0.0", "User": '"{owner}@{submit}"', "Owner": '"{owner}"', "QDate": "{qdate}",
    "MyType": '"Job"', "ProcId": "{proc}", "JobPrio": "0", "UserLog": '"/home/{owner}/analysis/{batch}/log.txt"',
    "ExitCode": "0", "MaxHosts": "1", "MinHosts": "1", "NumCkpts": "0", "Arguments": '"--seed {seed} --events 10000"',
    "BytesSent": "{sent}.0", "ClusterId": "{cluster}", "CpusUsage": "0.97", "DiskUsage": "{disk}", "ImageSize": "{image}",
    "JobStatus": "4", "StreamErr": "false", "StreamOut": "false", "BlockReads": "{blocks}", "BytesRecvd": "{recvd}.0",
    "ExitStatus": "0", "TargetType": '"Machine"', "TransferIn": "false", "BlockWrites": "{blocks}", "Environment": '""',
    "GlobalJobId": '"{submit}#{cluster}.{proc}#{qdate}"', "JobRunCount": "1", "JobUniverse": "5",
    "MemoryUsage": "((ResidentSetSize + 1023) / 1024)", "NumRestarts": "0", "RequestCpus": "1",
    "RequestDisk": "MAX({{ 1024,(TransferInputSizeMB + 1) * 1.25 }}) * 1024", "CurrentHosts": "0",
    "ExitBySignal": "false", "JobStartDate": "{start}", "NumCkpts_RAW": "0", "NumJobStarts": "1", "OrigMaxHosts": "1",
    "RemoteSysCpu": "{sys}.0",
    "Requirements": '(TARGET.Arch == "X86_64") && (TARGET.OpSys == "LINUX") && (versionGE(split(TARGET.CondorVersion)[1],"25.12.0") || (TARGET.Disk >= RequestDisk)) && (TARGET.Memory >= RequestMemory) && (TARGET.bandwidth >= Requestbandwidth) && (TARGET.FileSystemDomain == MY.FileSystemDomain)',
    "CommittedTime": "{wall}", "CondorVersion": VERSION, "DiskUsage_RAW": "{disk}", "ImageSize_RAW": "{image}",
    "JobSubmitFile": '"job.sub"', "LastJobStatus": "2", "LastMatchTime": "{start}", "NumJobMatches": "1",
    "RemoteUserCpu": "{user}.0", "RequestMemory": "2048", "SubmitVersion": VERSION, "CompletionDate": "{done}",
    "CondorPlatform": '"$CondorPlatform: X86_64-Debian_ $"', "ExecutableSize": "10000",
    "LastRemoteHost": '"slot1_{slot}@{ep}"', "NumSystemHolds": "0", "BlockReadKbytes": "{kb}",
    "CpusProvisioned": "1", "DiskProvisioned": "1048576", "GPUsProvisioned": "0", "JobNotification": "0",
    "JobSubmitMethod": "0", "LarkIPv4Address": '"10.{a}.{b}.{c}"', "LarkNetworkType": '"{ntype}"',
    "LarkFiguresBy": '"{ep}"',   # larkd's mark: `lark report` counts only the figures it wrote
    "LeaveJobInQueue": "false", "NumShadowStarts": "1", "ResidentSetSize": "{rss}",
    "StartdPrincipal": '"execute-side@matchsession/{ip}"', "BlockWriteKbytes": "{kb}",
    "FileSystemDomain": '"{submit}"', "JobLeaseDuration": "2400", "MachineAttrCpus0": "1", "RecentBlockReads": "0",
    "TotalSubmitProcs": "10", "TotalSuspensions": "0", "CommittedSlotTime": "{wall}.0",
    "FirstJobMatchDate": "{start}",
    "LastPublicClaimId": '"<{ip}:9618?addrs={ip}-9618&alias={ep}&noUDP&sock=startd_20801_5596>#1795539551#{seed}#..."',
    "MemoryProvisioned": "2048", "NumJobCompletions": "1", "RecentBlockWrites": "0", "ActivationDuration": "{wall}",
    "CumulativeSlotTime": "{wall}.0", "ExecutableSize_RAW": "8123", "LastSuspensionTime": "0",
    "TerminationPending": "true", "TransferInputStats": "[  ]", "InitialWaitDuration": "2",
    "JobCurrentStartDate": "{start}", "JobFinishedHookDone": "{done}", "LastJobLeaseRenewal": "{done}",
    "RemoteWallClockTime": "{wall}.0", "ResidentSetSize_RAW": "{rss}", "ShouldTransferFiles": '"YES"',
    "TransferInputSizeMB": "8", "TransferOutputStats": "[  ]", "BandwidthProvisioned": "{limit}",
    "EnteredCurrentStatus": "{done}", "NetworkIncomingBytes": "{b_in}", "NetworkOutgoingBytes": "{b_out}",
    "StatsLifetimeStarter": "{wall}", "RecentBlockReadKbytes": "0", "CumulativeRemoteSysCpu": "{sys}.0",
    "ExecuteDirWasEncrypted": "false", "MachineAttrSlotWeight0": "1", "NetworkIncomingAvgRate": "{avg_in}",
    "NetworkIncomingPackets": "{p_in}", "NetworkOutgoingAvgRate": "{avg_out}", "NetworkOutgoingPackets": "{p_out}",
    "RecentBlockWriteKbytes": "0", "ActivationSetupDuration": "0", "CommittedSuspensionTime": "0",
    "CumulativeRemoteUserCpu": "{user}.0", "LastRemoteWallClockTime": "{wall}.0",
    "NetworkIncomingPeakRate": "{peak_in}", "NetworkOutgoingPeakRate": "{peak_out}",
    "TransferInputFileCounts": "[ CEDAR = 1 ]", "CumulativeSuspensionTime": "0", "ActivationTeardownDuration": "0",
    "JobCurrentReconnectAttempt": "undefined", "RecentStatsLifetimeStarter": "{wall}",
    "ActivationExecutionDuration": "{wall}", "JobCurrentStartExecutingDate": "{start}",
    # Accounting group, batch name, OSG-style project: what sites group by.
    "AcctGroup": '"{group}"', "AcctGroupUser": '"{owner}"', "AccountingGroup": '"{group}.{owner}"',
    "JobBatchName": '"{batch}"', "ProjectName": '"{project}"', "NumHolds": "0", "NumVacates": "0",
    "NumHoldsByReason": "[  ]", "OutboundConnectivity": "true", "InboundConnectivity": "false",
    "NetworkAccounting": "true", "TransferOutput": '"out.root,summary.json"',
    "TransferInput": '"/home/{owner}/analysis/input.tar.gz"', "x509UserProxyVOName": '"{group}"',
    "JobLastStartDate": "{start}", "OnExitRemove": "true", "PeriodicHold": "false", "PeriodicRelease": "false",
    "PeriodicRemove": "false", "WantRemoteIO": "true", "WhenToTransferOutput": '"ON_EXIT"',
    "LastJobRouterName": '"Local"', "ExitBySignal_RAW": "false", "NiceUser": "false", "CoreSize": "0",
    "KillSig": '"SIGTERM"', "BufferSize": "524288", "BufferBlockSize": "32768", "WantCheckpoint": "false",
}
LIMITED = {"Requestbandwidth": "{limit}", "LarkBandwidthLimit": "{limit}"}


def _template(attrs: dict[str, str]) -> str:
    # HTCondor writes a history ad's attributes sorted by name length, then name.
    lines = [f"{k} = {v}\n" for k, v in sorted(attrs.items(), key=lambda kv: (len(kv[0]), kv[0]))]
    return "".join(lines)


def write_history(path: str, n: int) -> None:
    rnd = random.Random(13)
    plain, limited = _template(AD), _template({**AD, **LIMITED})
    offset = 0
    with open(path, "w", buffering=1 << 22) as f:
        for i in range(n):
            cluster, proc = 1000 + i // 10, i % 10
            owner = OWNERS[int(rnd.paretovariate(1.2)) % len(OWNERS)]
            done = T0 + int(i * 60 * DAY / n)
            wall = rnd.randint(60, 36000)
            limit = rnd.choice((0, 0, 10, 100, 1000))
            b_in = rnd.randint(0, 10**10)
            b_out = rnd.randint(0, 10**9)
            ep = EPS[i % len(EPS)]
            ad = (limited if limit else plain).format(
                owner=owner, group=GROUPS[OWNERS.index(owner) % len(GROUPS)], batch=f"batch{cluster % 97}",
                project=f"proj{cluster % 23}", submit=SUBMIT, cluster=cluster, proc=proc, seed=i,
                qdate=done - wall - 300, start=done - wall, done=done, wall=wall, user=int(wall * 0.9),
                sys=wall // 50, sent=rnd.randint(0, 10**6), recvd=rnd.randint(0, 10**7), disk=rnd.randint(10, 10**6),
                image=rnd.randint(10**4, 10**6), rss=rnd.randint(10**4, 10**6), blocks=i % 1000, kb=i % 5000,
                slot=i % 32, ep=ep, ip=f"10.1.{i % 250}.{i % 200}", a=i % 250, b=i // 250 % 250, c=i % 200,
                ntype=TYPES[i % len(TYPES)], limit=limit, b_in=b_in, b_out=b_out, p_in=b_in // 1448,
                p_out=b_out // 1448, avg_in=f"{b_in * 8 / wall:.1f}", avg_out=f"{b_out * 8 / wall:.1f}",
                peak_in=f"{b_in * 16 / wall:.1f}", peak_out=f"{b_out * 16 / wall:.1f}")
            banner = (f'*** Offset = {offset} ClusterId = {cluster} ProcId = {proc} Owner = "{owner}" '
                      f"CompletionDate = {done} CurrentTime = {done}\n")
            f.write(ad)
            f.write(banner)
            offset += len(ad) + len(banner)


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="lark-bench-report-") as d:
        hist = os.path.join(d, "history")
        t = time.perf_counter()
        write_history(hist, N)
        gen_s = time.perf_counter() - t
        size_mb = os.path.getsize(hist) / 1e6

        cache = Cache(os.path.join(d, "cache.sqlite"))
        t, c, ch = time.perf_counter(), time.process_time(), os.times()
        importer.import_history_file(cache, hist)
        import_s = time.perf_counter() - t
        after = os.times()   # CPU time of this process and of the parsing workers it waited for
        import_cpu_s = time.process_time() - c + (after.children_user + after.children_system
                                                  - ch.children_user - ch.children_system)
        workers = importer._workers()
        rows = cache.count()
        assert rows == N, (rows, N)

        t = time.perf_counter()
        importer.import_history_file(cache, hist)   # nothing new: the mark skips the whole file
        again_s = time.perf_counter() - t
        assert cache.count() == N

        # Every limited job's request was found although condor_submit spells it `Requestbandwidth`.
        requested = cache.db.execute("SELECT count(request_mbit) FROM jobs WHERE limit_mbit > 0").fetchone()[0]
        assert requested == cache.db.execute("SELECT count(*) FROM jobs WHERE limit_mbit > 0").fetchone()[0] > 0

        timings = []
        for by in (["Owner", "AcctGroup"], ["EP"], ["day"], ["NetworkType", "month"], ["projectname", "week"]):
            t, c = time.perf_counter(), time.process_time()
            rep = aggregate.summarise(cache.db, by)
            output.write_csv(rep, io.StringIO())
            timings.append((f"report --by {','.join(by)} --csv", time.perf_counter() - t, len(rep.rows),
                            time.process_time() - c))
            assert rep.totals()["jobs"] == N
        t, c = time.perf_counter(), time.process_time()
        rep = aggregate.summarise(cache.db, ["Owner"])
        output.write_html(rep, aggregate.per_day_by(cache.db, "Owner", None, None), os.path.join(d, "html"))
        timings.append(("report --by Owner --html (3 charts)", time.perf_counter() - t, len(rep.rows),
                        time.process_time() - c))
        cache.close()

    # "Summarised" is the report itself (table, CSV, JSON share the query); the HTML page adds charts.
    query_s = max(s for name, s, _, _ in timings if "--html" not in name)
    load = os.getloadavg()[0]
    # Wall time is what a user waits; CPU time is what this process used, which a shared machine's load
    # inflates less (both are printed; the goals are on wall time).
    print(f"{'step':<44} {'wall s':>8} {'cpu s':>8} {'rows':>8}   (2-core machine shared by other work, "
          f"load average {load:.1f})")
    print(f"{'write synthetic history file (' + f'{size_mb:.0f} MB)':<44} {gen_s:>8.2f} {'':>8} {N:>8}")
    print(f"{'first import into the cache':<44} {import_s:>8.2f} {import_cpu_s:>8.2f} {rows:>8}   "
          f"{N / import_s:,.0f} ads/s wall, {N / import_cpu_s:,.0f} ads per cpu-s, {workers} processes "
          f"(goal >= 50,000/s)")
    print(f"{'second import (nothing new)':<44} {again_s:>8.3f} {'':>8} {0:>8}")
    for name, s, n, cpu in timings:
        print(f"{name:<44} {s:>8.2f} {cpu:>8.2f} {n:>8}")
    print(f"slowest summary from the cache: {query_s:.2f} s (goal <= 10 s)")
    print(f"ads={N} import_ads_per_s={N / import_s:.0f} query_s={query_s:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
