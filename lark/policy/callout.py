"""The admin callout: job ad, a separator line, the machine ad on stdin; a ClassAd of overrides on stdout."""
from __future__ import annotations

import subprocess

import classad2

from ..errors import LarkError
from .classads import parse_ad

SEPARATOR = "------"
MAX_OUTPUT = 1 << 16


def run_callout(path: str, job: classad2.ClassAd, machine: classad2.ClassAd, timeout: float,
                job_id: str = "?") -> classad2.ClassAd:
    stdin = old_ad_text(job, job_id) + f"{SEPARATOR}\n" + old_ad_text(machine, job_id)
    what = f"callout {path}"
    try:
        cp = subprocess.run([path], input=stdin, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise LarkError("does not exist", job=job_id, obj=what, fix="fix LARK_CALLOUT") from None
    except PermissionError:
        raise LarkError("is not executable", job=job_id, obj=what, fix="chmod +x it") from None
    except subprocess.TimeoutExpired:
        raise LarkError(f"did not finish within {timeout:g} s", job=job_id, obj=what,
                        fix="make it faster or raise callout_timeout") from None
    if cp.returncode != 0:
        raise LarkError(f"exited with {cp.returncode}: {cp.stderr.strip()[:200]}", job=job_id, obj=what)
    if len(cp.stdout) > MAX_OUTPUT:
        raise LarkError(f"printed more than {MAX_OUTPUT} bytes", job=job_id, obj=what)
    try:
        return parse_ad(cp.stdout, f"output of {what}")
    except LarkError as e:
        raise LarkError(e.what, job=job_id, obj=f"output of {what}", fix="print `Name = value` lines") from None


def old_ad_text(ad: classad2.ClassAd, job_id: str = "?") -> str:
    """One `Name = expression` line per attribute. Not printOld(): it writes string values with their newlines
    raw, so a job attribute holding "\n------\nVLAN = 7" would forge the separator and machine attributes.
    Unparsed expressions escape them (\\n)."""
    lines = []
    for name in ad:
        line = f"{name} = {ad.lookup(name)}"
        if "\n" in line or "\r" in line:
            raise LarkError("an attribute does not fit on one line", job=job_id, obj=f"attribute {name[:40]}",
                            fix="remove line breaks from the attribute")
        lines.append(line + "\n")
    return "".join(lines)


def apply_overrides(machine: classad2.ClassAd, overrides: classad2.ClassAd) -> classad2.ClassAd:
    merged = classad2.ClassAd()
    merged.update(machine)
    merged.update(overrides)
    return merged
