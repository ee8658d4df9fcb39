"""lark-controller run | status | certs."""
from __future__ import annotations

import argparse
import http.client
import json
import logging
import os
import signal
import ssl
import sys

from ..errors import LarkError
from . import certs as certs_mod
from .config import ControllerConfig, load

log = logging.getLogger("lark.controller")


def run(cfg: ControllerConfig) -> int:
    # os-ken's app manager and OpenFlow server read oslo.config options; set them from our file, then start the
    # app manager ourselves (os-ken ships no launcher).
    from os_ken import cfg as oscfg
    from os_ken.base.app_manager import AppManager

    from . import ofapp
    from .api import ApiServer
    from .metrics import ControllerMetrics
    from .registry import Registry
    from .service import Controller

    # isort: split
    # Only after app_manager: os-ken's controller module and app_manager import each other, and only this order
    # works ("cannot import name 'Datapath' from partially initialized module" otherwise).
    import os_ken.controller.controller  # noqa: F401  (registers the ofp-* options)
    oscfg.CONF(args=[], project="os_ken", default_config_files=[])
    oscfg.CONF.set_override("ofp_listen_host", cfg.openflow_host)
    # A connected switch is never replaced by another connection with its datapath id (ofapp), so a connection
    # that died silently must be found: echo requests, disconnected after 3 unanswered (os-ken's default is never).
    oscfg.CONF.set_override("echo_request_interval", 5.0)
    oscfg.CONF.set_override("maximum_unreplied_echo_requests", 3)
    if cfg.insecure_plain_openflow:
        log.warning("[openflow] insecure_plain_openflow = true: OpenFlow on %s:%d is plain TCP, and anyone who "
                    "reaches that port can act as the switch (replace it, or stall every registration); remove "
                    "the knob and give the switch a certificate (docs/controller.md)", cfg.openflow_host,
                    cfg.openflow_port)
        oscfg.CONF.set_override("ofp_tcp_listen_port", cfg.openflow_port)
    else:   # TLS only: with a key and certificate os-ken starts no plain listener; switches must present a cert
        oscfg.CONF.set_override("ofp_ssl_listen_port", cfg.openflow_port)
        oscfg.CONF.set_override("ofp_tcp_listen_port", 0)
        oscfg.CONF.set_override("ctl_privkey", cfg.key)
        oscfg.CONF.set_override("ctl_cert", cfg.cert)
        oscfg.CONF.set_override("ca_certs", cfg.ca)
    registry = Registry(cfg)
    ofapp.CONFIG, ofapp.REGISTRY = cfg, registry
    controller = Controller(cfg, registry)
    metrics = None
    if cfg.metrics_address:
        metrics = ControllerMetrics(controller.status)
        metrics.serve(cfg.metrics_address)
    api = ApiServer(cfg, controller, metrics)
    api.start()
    log.info("lark-controller: OpenFlow on %s:%d (%s), registration API (mutual TLS) on %s:%d, %d policies, "
             "WAN ports %s", cfg.openflow_host, cfg.openflow_port,
             "plain TCP" if cfg.insecure_plain_openflow else "TLS", cfg.api_host, api.server_address[1],
             len(cfg.policies), cfg.wan_ports or "-")
    def stop(signum: int, _frame) -> None:
        # os-ken's hub threads are not daemon threads, so a normal exit would wait for them forever. Nothing needs
        # saving: the flows stay on the switches and the registry comes back from the EPs' resyncs.
        log.info("lark-controller stopping on signal %d; switches keep their flows", signum)
        logging.shutdown()
        os._exit(0)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    AppManager.run_apps(["lark.controller.ofapp"])
    return 0


def api_request(cfg: ControllerConfig, method: str, path: str, body: object = None, timeout: float = 10.0,
                host: str | None = None) -> tuple[int, dict]:
    """A request to a controller's API with the controller's own certificate (operator tools on its host)."""
    ctx = ssl.create_default_context(cafile=cfg.ca)
    ctx.load_cert_chain(cfg.cert, cfg.key)
    ctx.check_hostname = False  # local operator call; the CA still authenticates the server
    h = host or ("127.0.0.1" if cfg.api_host in ("0.0.0.0", "::") else cfg.api_host)
    conn = http.client.HTTPSConnection(h, cfg.api_port, context=ctx, timeout=timeout)
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"{}")
    finally:
        conn.close()


def print_status(st: dict) -> None:
    t = st["totals"]
    print(f"switches connected: {len(st['switches'])}   jobs: {t['jobs']}   job flows: {t['job_flows']}   "
          f"base flows: {t['base_flows']}   flows per switch: {t['flows_per_switch']}   RSS: {st['rss_kib']} KiB")
    for s in st["switches"]:
        print(f"  switch {s['dpid']} from {s['address']} ready={s['ready']} wan_ports={s['wan_ports']}")
    if st.get("wan_groups"):   # issue 12: per group and WAN port an OpenFlow meter or a queue, counted at the switch
        print(f"{'WAN group':<16} {'limit':>6} {'limit Mbit/s':>12} {'jobs':>5} {'now Mbit/s':>11} {'bytes total':>14}")

        def row(name: str, r: dict) -> None:
            limit = f"{r['meter']:#6x}" if "meter" in r else f"{'q' + str(r.get('queue', '?')):>6}"
            print(f"{name:<16} {limit} {r['rate_mbit']:>12g} {r['jobs']:>5} {r['rate_now_mbit']:>11.2f} "
                  f"{r['bytes']:>14}")
        for g in st["wan_groups"]:
            row(g["group"], g)
            ports = g.get("ports", [])
            for p in ports if len(ports) > 1 else []:   # per WAN port, when there are several
                row(f"  @{p['port']}", p)
    if st["jobs"]:
        print(f"{'job':<12} {'owner':<12} {'group':<12} {'ep':<10} {'addresses':<26} {'flows':>5}  policy")
    for j in st["jobs"]:
        pol = ", ".join(x for x in (f"drop:{j['blocked_by']}" if j["blocked_by"] else "",
                                     f"slice:{j['slice']}" if j["slice"] else "",
                                     f"wan:{j['wan_policy']}" if j["wan_policy"] else "") if x) or "-"
        print(f"{j['job_id']:<12} {j['owner']:<12} {j['accounting_group'] or '-':<12} {j['ep']:<10} "
              f"{','.join(j['addresses']):<26} {j['flows']:>5}  {pol}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="lark-controller", description="Lark's job-aware OpenFlow controller")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the controller in the foreground")
    r.add_argument("--config", required=True)
    r.add_argument("--log-file")
    r.add_argument("--log-level", default="INFO")
    s = sub.add_parser("status", help="jobs, flows per job, totals and switches of the running controller")
    s.add_argument("--config", required=True)
    s.add_argument("--json", action="store_true")
    c = sub.add_parser("certs", help="make a CA and a key/certificate per NAME (NAME=host,... adds addresses; "
                       "switch:DPID makes a switch's, bound to its datapath id)")
    c.add_argument("--dir", required=True)
    c.add_argument("names", nargs="+")
    args = ap.parse_args(argv)
    logging.basicConfig(level=getattr(args, "log_level", "WARNING").upper(), filename=getattr(args, "log_file", None),
                        format="%(asctime)s lark-controller[%(process)d] %(levelname)s %(name)s %(message)s")
    logging.getLogger("os_ken").setLevel(logging.WARNING)
    try:
        if args.cmd == "certs":
            for name in certs_mod.make(args.dir, args.names):
                print(f"{args.dir}/{name}.pem {args.dir}/{name}.key")
            print(f"{args.dir}/ca.pem")
            return 0
        cfg = load(args.config)
        if args.cmd == "run":
            return run(cfg)
        try:
            code, st = api_request(cfg, "GET", "/v1/status")
        except (OSError, ssl.SSLError) as e:
            raise LarkError(f"cannot reach the controller's API: {e}", obj=f"{cfg.api_host}:{cfg.api_port}",
                            fix="is `lark-controller run` running with this config?") from None
        if code != 200:
            raise LarkError(st.get("error", f"HTTP {code}"), obj="controller status")
        if args.json:
            print(json.dumps(st, indent=1))
        else:
            print_status(st)
        return 0
    except LarkError as e:
        log.error("%s", e)
        print(f"lark-controller: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
