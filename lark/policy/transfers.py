"""A submitter's own transfer plugin: what Lark refuses on the execution point (issue 22; docs/admin.md).

`transfer_plugins = name=script` in a submit file becomes the job ad's TransferPlugins ("name=script;..."). The
starter runs that script itself, as the job's user, in the execution point's own network namespace, before the
job starts (inputs) and after it ends (outputs): outside the network Lark builds, limits, counts and filters for
the job. The access point refuses such jobs at submit (SUBMIT_REQUIREMENT_LarkOwnPlugins in
condor_config.d/55-lark-access-point.conf); this is the execution point's own check for a job that reaches it
anyway (a schedd without that requirement, or an ad edited by a queue super user). larkd runs it in every
pre-flight check (PREPARE_JOB, after input transfer) and at setup, so such a job is held before it runs and an
output plugin is never reached; an input plugin is kept out earlier by 50-lark.conf (START never matches such a
job; HTCondor's STARTER_DISABLE_USER_SUPPLIED_TRANSFER_PLUGINS).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import classad2

from ..errors import LarkError

ATTR = "TransferPlugins"


def own_plugins(job_ad: Mapping[str, Any]) -> str | None:
    """The job's own plugins ("name=script;...") as the starter would read them, else None. The attribute is
    evaluated (an expression such as strcat(...) is what the starter sees too); undefined or an empty string is
    no plugin; any other value, an error included, counts: what Lark cannot read is refused, not guessed at."""
    if ATTR not in job_ad:
        return None
    evaluate = getattr(job_ad, "eval", None)
    try:
        value = evaluate(ATTR) if evaluate is not None else job_ad.get(ATTR)
    except Exception:  # an expression the bindings cannot evaluate
        return "<unreadable>"
    if value is None or value is classad2.Value.Undefined:
        return None
    if value is classad2.Value.Error:
        return "<error>"
    text = str(value).strip()
    return text or None


def check_transfer_plugins(job_ad: Mapping[str, Any], job_id: str | None) -> None:
    """Raise a LarkError naming the job, the attribute and the fix when the job brings its own transfer plugin."""
    plugins = own_plugins(job_ad)
    if plugins is None:
        return
    raise LarkError("the job brings its own transfer plugin, which HTCondor's starter would run with this "
                    "execution point's network, outside the job's bandwidth limit, accounting and filters",
                    job=job_id, obj=f"{ATTR} = {plugins[:200]}",
                    fix="remove transfer_plugins from the submit file and use a URL scheme the pool's plugins "
                        "handle (condor_status -af HasFileTransferPluginMethods); the access point should refuse "
                        "such jobs at submit (SUBMIT_REQUIREMENT_LarkOwnPlugins, 55-lark-access-point.conf)")
