"""Reading ClassAds in the forms HTCondor writes them: new format, old format, condor_q -l / condor_status -l."""
from __future__ import annotations

import classad2

from ..errors import LarkError

MAX_AD_BYTES = 1 << 20


def parse_ad(text: str, what: str) -> classad2.ClassAd:
    """Parse one ad; `what` names its source in errors."""
    if len(text) > MAX_AD_BYTES:
        raise LarkError(f"ClassAd is larger than {MAX_AD_BYTES} bytes", obj=what, fix="pass a single ad")
    stripped = text.strip()
    if not stripped:
        return classad2.ClassAd()
    try:
        if stripped.startswith("["):
            return _parse_new(stripped)
        # Old format. classad2's old-format parser returns an empty ad on a syntax error instead of failing,
        # so each `Name = expr` line is checked and the ad is parsed as new format, which does fail loudly.
        # condor_q -l separates ads with blank lines: keep only the first one.
        first = stripped.split("\n\n", 1)[0]
        lines = [ln for ln in first.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
        for n, ln in enumerate(lines, 1):
            if "=" not in ln:
                raise LarkError(f"line {n} is not `Name = expression`: {ln[:80]!r}", obj=what,
                                fix="check the syntax of the ad")
        return _parse_new("[" + ";\n".join(lines) + "]")
    except (classad2.ClassAdException, ValueError, RuntimeError, SyntaxError) as e:
        raise LarkError(f"not a valid ClassAd: {e}", obj=what, fix="check the syntax of the ad") from None


def _parse_new(text: str) -> classad2.ClassAd:
    # parseOne returns an empty ad for some syntax errors; parseNext returns None for all of them.
    ad = classad2.parseNext(text, classad2.ParserType.New)
    if ad is None:
        if "".join(text.split()) == "[]":
            return classad2.ClassAd()
        raise ValueError("syntax error")
    return ad


def read_ad(path: str) -> classad2.ClassAd:
    try:
        with open(path, errors="replace") as f:
            text = f.read(MAX_AD_BYTES + 1)
    except OSError as e:
        raise LarkError(f"cannot read: {e.strerror}", obj=f"ClassAd file {path}") from None
    return parse_ad(text, f"ClassAd file {path}")
