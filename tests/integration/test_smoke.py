import json

from helpers.fakehost import WORLD_IP


def test_job_downloads_through_nat(host):
    (host.www / "f.bin").write_bytes(b"z" * 5_000_000)
    cp = host.run_job("slot1", ["download", f"http://{WORLD_IP}:8000/f.bin"])
    assert cp.returncode == 0, cp.stderr + host.larkd_log()
    assert json.loads(cp.stdout)["downloaded"] == 5_000_000
