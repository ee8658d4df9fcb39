"""Read back what a batch of nft JSON commands built: `lark status --verify` for nftables objects.

The drivers pass the very commands their setup applies (NftablesFirewall.job_cmds, same_ep.job_cmds), so the list
of objects checked cannot drift from the list of objects made. Each table is listed once; the kernel is not
changed. Rules are compared by count in the chains the commands flush and refill (nft prints expressions in its own
normal form, so comparing them would report drift where there is none); a chain flushed by hand shows up.
"""
from __future__ import annotations

import json
from collections.abc import Callable

from ..drift import Finding, drifted, present
from . import libnft

NFT_FIX = ("something other than larkd changed Lark's nftables tables (`nft delete/flush`, `nft flush ruleset`, a "
           "firewall manager that replaces the whole ruleset)")

Run = Callable[[str], tuple[int, str, str]]   # libnftables: command text -> (rc, output, error)


def verify_cmds(cmds: list[dict], run: Run | None = None, fix: str = NFT_FIX) -> list[Finding]:
    """One Finding per table, chain, counter, set, map, element and refilled chain's rules that `cmds` add."""
    run = run or libnft.get().run
    listings: dict[tuple[str, str], list[dict] | None] = {}
    found: list[Finding] = []
    gone_tables: set[tuple[str, str]] = set()
    expected_rules: dict[tuple[str, str, str], int] = {}
    refilled: list[tuple[str, str, str]] = []
    for cmd in cmds:
        for verb, body in cmd.items():
            kind, obj = next(iter(body.items()))
            table = (obj["family"], obj.get("table", obj.get("name")))
            if verb == "flush" and kind == "chain":
                refilled.append((*table, obj["name"]))
            if verb != "add":
                continue
            if kind == "rule":
                where = (*table, obj["chain"])
                expected_rules[where] = expected_rules.get(where, 0) + 1
                continue
            if table not in listings:
                listings[table] = _list(run, *table)
            objs = listings[table]
            if objs is None:
                if table not in gone_tables:
                    gone_tables.add(table)
                    found.append(drifted(f"nft table {' '.join(table)}", "the table is gone", fix))
                continue
            if kind != "table":
                found.append(_verify_object(kind, obj, objs, " ".join(table), fix))
    for family, name, chain in refilled:
        objs = listings.get((family, name))
        if not objs or not any(o.get("chain", {}).get("name") == chain for o in objs):
            continue  # the table's or the chain's own finding says it
        want = expected_rules.get((family, name, chain), 0)
        have = sum(1 for o in objs if o.get("rule", {}).get("chain") == chain)
        what = f"nft rules of chain {family} {name} {chain}"
        found.append(present(what) if have == want else
                     drifted(what, f"{have} rule(s) where setup put {want}", fix))
    return found


def _list(run: Run, family: str, table: str) -> list[dict] | None:
    """The table's objects, or None when it does not exist."""
    rc, out, err = run(f"list table {family} {table}")
    if rc != 0:
        if "No such file" in err or "does not exist" in err:
            return None
        raise OSError(f"nft list table {family} {table} failed: {err.strip()[:300]}")
    return json.loads(out).get("nftables", []) if out.strip() else []


def _verify_object(kind: str, obj: dict, objs: list[dict], table: str, fix: str) -> Finding:
    if kind != "element":
        what = f"nft {kind} {table} {obj['name']}"
        there = any(o.get(kind, {}).get("name") == obj["name"] for o in objs)
        return present(what) if there else drifted(what, f"the {kind} is gone", fix)
    container = next((o.get("map") or o.get("set") for o in objs
                      if (o.get("map") or o.get("set") or {}).get("name") == obj["name"]), None)
    have = [_element(e) for e in (container or {}).get("elem", [])]
    wanted = [_element(e) for e in obj["elem"]]
    keys = ", ".join(str(k) for k, _ in wanted)
    what = f"nft element {keys} of {table} {obj['name']}"
    if container is None:
        return drifted(what, f"set or map {obj['name']} is gone", fix)
    for key, value in wanted:
        match = [v for k, v in have if k == key]
        if not match:
            return drifted(what, f"element {key} is gone: the job's traffic no longer takes its rules", fix)
        if value is not None and value not in match:
            return drifted(what, f"element {key} maps to {match[0]}, setup made it {value}", fix)
    return present(what)


def _element(e) -> tuple[str, object]:
    """(key, value) of one element as written in a command or listed: `[key, verdict]` in a map, a plain value or
    `{"elem": {"val": ..., "comment": ...}}` in a set; MACs compared in lower case."""
    if isinstance(e, list):
        return _key(e[0]), e[1]
    if isinstance(e, dict) and "elem" in e:
        return _key(e["elem"].get("val")), None
    return _key(e), None


def _key(v) -> str:
    return str(v).lower()
