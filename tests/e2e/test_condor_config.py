"""larkd's configuration is HTCondor's: LARK_* knobs seen by condor_config_val, reloaded by condor_reconfig."""
import time

import pytest

from condor import as_root, testbed

pytestmark = pytest.mark.e2e
KNOBS = testbed.ROOT / "etc/condor/config.d/97-lark-reconfig.conf"
LARKD_LOG = testbed.ROOT / "var/log/condor/LarkdLog"


def wait_log(needle: str, after: int, timeout: float = 30) -> str:
    deadline = time.time() + timeout
    text = ""
    while time.time() < deadline:
        text = LARKD_LOG.read_text(errors="replace")[after:] if LARKD_LOG.exists() else ""
        if needle in text:
            return text
        time.sleep(0.5)
    raise AssertionError(f"{needle!r} not in larkd's log within {timeout} s; it has:\n{text[-3000:]}")


def larkd_pid() -> str:
    cp = as_root(["pgrep", "-f", "/opt/lark/bin/larkd"])
    return cp.stdout.split()[0] if cp.stdout.split() else ""


def test_knobs_show_in_condor_config_val_and_reconfig_reloads_larkd(pool):
    dump = as_root(["condor_config_val", "-dump", "LARK_"]).stdout
    assert "LARK_POLL_INTERVAL = 1.0" in dump and "LARK_UPLINK = up0" in dump
    assert as_root(["lark", "status"]).returncode == 0
    pid = larkd_pid()
    start = LARKD_LOG.stat().st_size if LARKD_LOG.exists() else 0
    try:
        KNOBS.write_text("LARK_POLL_INTERVAL = 2.0\nLARK_SUBNET = 10.214.0.0/24\n")
        assert as_root(["condor_reconfig"]).returncode == 0
        text = wait_log("configuration reloaded: LARK_POLL_INTERVAL 1.0 -> 2.0", start)
        assert "take effect when larkd restarts: LARK_SUBNET" in text
        assert larkd_pid() == pid  # reloaded in place, not restarted
        # A knob that does not validate changes nothing.
        start = LARKD_LOG.stat().st_size
        KNOBS.write_text("LARK_POLL_INTERVAL = soon\n")
        as_root(["condor_reconfig"])
        wait_log("configuration not reloaded, the running one stays: knob LARK_POLL_INTERVAL: 'soon' is not a "
                 "number", start)
    finally:
        KNOBS.unlink(missing_ok=True)
        start = LARKD_LOG.stat().st_size if LARKD_LOG.exists() else 0
        as_root(["condor_reconfig"])
    wait_log("LARK_POLL_INTERVAL 2.0 -> 1.0", start)
    assert as_root(["lark", "status"]).returncode == 0 and larkd_pid() == pid
