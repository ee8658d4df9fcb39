"""larkd loads prometheus_client only when it serves metrics (issue 27: larkd RSS at 128 jobs at most 80 MB;
prometheus_client is ~3.5 MB of it, and most execution points are never scraped)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from lark.daemon.metrics import NoMetrics, make_metrics

REPO = Path(__file__).resolve().parents[2]


def test_larkd_modules_do_not_import_prometheus_client():
    code = ("import sys; import lark.daemon.server, lark.cli; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'prometheus_client'))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_metrics_off_keeps_nothing_and_on_counts():
    off = make_metrics("", None, None, [])  # type: ignore[arg-type]  (nothing is asked of them when off)
    assert type(off) is NoMetrics
    off.observe_setup("nat", 0.01)
    off.observe_teardown(0.02)
    off.failed("policy")
    on = make_metrics("127.0.0.1:0", None, None, [])  # type: ignore[arg-type]  (no scrape here)
    on.observe_setup("nat", 0.01)
    on.failed("no such reason")
    assert on.registry.get_sample_value("lark_setup_seconds_count", {"network_type": "nat"}) == 1  # type: ignore[attr-defined]
    assert on.registry.get_sample_value("lark_failures_total", {"reason": "internal"}) == 1  # type: ignore[attr-defined]
