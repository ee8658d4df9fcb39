"""Where larkd gets the job and slot ads it trusts.

`files`: ads in a root-owned directory (<ad_dir>/<slot>.job.ad and <slot>.machine.ad) written by something
root runs, never the job's sandbox copies (the job's user can edit those). Used by the test harness and by
sites that publish ads from a root hook. `startd` (lark/startd.py) is what an HTCondor EP uses.
"""
from __future__ import annotations

import os
import stat

import classad2

from ..errors import LarkError
from .classads import read_ad


class FileAdSource:
    def __init__(self, directory: str):
        self.dir = directory

    def _trusted(self, path: str, slot: str) -> classad2.ClassAd | None:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        if st.st_uid != 0 or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise LarkError("ad file is not owned by root or is writable by others", job=f"slot {slot}",
                            obj=path, fix="only root may write the ads larkd trusts")
        return read_ad(path)

    def ads(self, starter) -> tuple[classad2.ClassAd, classad2.ClassAd]:
        slot = starter.slot
        job = self._trusted(os.path.join(self.dir, f"{slot}.job.ad"), slot)
        if job is None:
            raise LarkError("no job ad published for this slot", job=f"slot {slot}", obj=self.dir,
                            fix="the harness must write <slot>.job.ad before starting the job")
        machine = self._trusted(os.path.join(self.dir, f"{slot}.machine.ad"), slot) or classad2.ClassAd()
        return job, machine

    def identity(self, job: classad2.ClassAd, machine: classad2.ClassAd) -> None:
        """No claim vouches for these ads (root wrote them), and larkd pushes nothing to a schedd with them."""
        return None


def make_ad_source(cfg):
    if cfg.ad_source == "startd":
        from .startd import StartdAdSource
        return StartdAdSource(cfg)
    return FileAdSource(cfg.ad_dir)
