"""Container jobs: what Lark refuses before an Apptainer job starts (issue 25; docs/admin.md "Container jobs").

The starter runs `apptainer exec` in the job's own network namespace, after USER_JOB_WRAPPER had larkd build the
job's network there, so the container shares that network: its limit, counters and policy hold unchanged. The
one way out is Apptainer making a network namespace of its own (`--net`, `-n`, `--network`): the container then
sees only `lo` and the network Lark built and accounts for goes unused (verified on HTCondor 25.14.1 with
apptainer 1.4.5: a job with SINGULARITY_EXTRA_ARGUMENTS = --net --network none found its network unreachable).
The execution point's SINGULARITY_EXTRA_ARGUMENTS is where that is asked (a job's own `environment` does not
reach apptainer's command line), so a container job on an EP configured so is refused with the reason.
"""
from __future__ import annotations

import logging
import shlex
from collections.abc import Mapping
from typing import Any

from ..errors import LarkError

log = logging.getLogger(__name__)
CONTAINER_UNIVERSE = 14
# apptainer exec's options that give the container a network namespace of its own.
OWN_NETNS_LONG = ("--net", "--network", "--network-args")


def own_netns_option(extra_arguments: str | None) -> str | None:
    """The option in SINGULARITY_EXTRA_ARGUMENTS that would give the container its own netns, else None."""
    if not extra_arguments:
        return None
    text = extra_arguments.strip()
    if len(text) >= 2 and text[0] == text[-1] == '"':  # written as a ClassAd string literal
        text = text[1:-1]
    try:
        words = shlex.split(text)
    except ValueError:
        words = text.split()
    for word in words:
        if word == "--":
            break
        name = word.split("=", 1)[0]
        if name in OWN_NETNS_LONG:
            return word
        # Shorthand flags may be combined (-Cn); a value never follows a single-dash group of letters here.
        if word.startswith("-") and not word.startswith("--") and word[1:].isalpha() and "n" in word[1:]:
            return word
    return None


def is_container_job(job_ad: Mapping[str, Any], site_forces_container: bool = False) -> bool:
    """Whether the starter will run this job under Apptainer: the container universe, an image named in the ad
    (ContainerImage, SingularityImage), or an EP whose SINGULARITY_JOB puts every job in one."""
    if site_forces_container:
        return True
    try:
        if int(job_ad.get("JobUniverse", 0) or 0) == CONTAINER_UNIVERSE:
            return True
    except (TypeError, ValueError):
        pass
    return any(job_ad.get(attr) not in (None, "") for attr in ("ContainerImage", "SingularityImage"))


def site_apptainer_knobs() -> tuple[str | None, bool]:
    """This EP's SINGULARITY_EXTRA_ARGUMENTS and whether SINGULARITY_JOB is set to anything but false; (None,
    False) where HTCondor's configuration cannot be read (a larkd run from a --config file on a test host)."""
    try:
        import htcondor2
        extra = htcondor2.param.get("SINGULARITY_EXTRA_ARGUMENTS")
        forced = htcondor2.param.get("SINGULARITY_JOB")
    except Exception as e:  # no HTCondor configuration: nothing to refuse on
        log.debug("apptainer knobs not read: %s", e)
        return None, False
    forced_on = forced is not None and str(forced).strip().lower() not in ("", "false", "0", "no")
    return (str(extra) if extra is not None else None), forced_on


def check_container_network(job_ad: Mapping[str, Any], job_id: str | None,
                            knobs: tuple[str | None, bool] | None = None) -> None:
    """Raise a LarkError naming the job, the knob and the fix when this Apptainer job would leave its network."""
    extra, forced = site_apptainer_knobs() if knobs is None else knobs
    option = own_netns_option(extra)
    if option is None or not is_container_job(job_ad, forced):
        return
    raise LarkError(f"Apptainer would run this container job in a network namespace of its own ({option}), "
                    "cut off from the network Lark builds, limits and accounts for it",
                    job=job_id, obj=f"SINGULARITY_EXTRA_ARGUMENTS = {extra.strip() if extra else ''}",
                    fix="remove --net/--network from SINGULARITY_EXTRA_ARGUMENTS on this execution point: "
                        "Lark gives every job its own network namespace already")
