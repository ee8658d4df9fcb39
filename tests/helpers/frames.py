"""Hand-made Ethernet frames from a job's namespace (the label scheme's tests, issue 26): a UDP datagram in a frame,
802.1Q-tagged with any VLAN id the test names, sent as given from the job's eth0 through an AF_PACKET socket. This
machine's kernel has no 802.1Q devices (`ip link add ... type vlan` fails: "Unknown device type") nor tc's vlan
action, and scapy is not installed, so the frame is built here and the kernel only sends it."""
import json
import subprocess

SEND_FRAME_PY = """import socket,struct,sys
dst, src, vid, sip, dip, port = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5], int(sys.argv[6])
mac = lambda m: bytes.fromhex(m.replace(":", ""))
body = b"hand-made-frame"
udp = struct.pack("!HHHH", 40000, port, 8 + len(body), 0) + body
ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 1, 0, 64, 17, 0, socket.inet_aton(sip), socket.inet_aton(dip))
c = sum(struct.unpack("!10H", ip)); c = (c & 0xFFFF) + (c >> 16); c = (c & 0xFFFF) + (c >> 16)
ip = ip[:10] + struct.pack("!H", ~c & 0xFFFF) + ip[12:]
tag = struct.pack("!HH", 0x8100, vid) if vid else b""
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind(("eth0", 0))
for _ in range(3):
    s.send(mac(dst) + mac(src) + tag + b"\\x08\\x00" + ip + udp)
"""
RECV_PY = """import socket,sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("0.0.0.0", int(sys.argv[1]))); s.settimeout(3)
print("ready", flush=True)
try: print(s.recvfrom(100)[0].decode(), flush=True)
except OSError: print("nothing", flush=True)
"""


def sh(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, check=True)


def job_addr(ns: str) -> tuple[str, str]:
    """The MAC and IPv4 address of eth0 in a job's namespace."""
    link = json.loads(sh(["ip", "-j", "-n", ns, "addr", "show", "eth0"]).stdout)[0]
    return link["address"], next(a["local"] for a in link["addr_info"] if a["family"] == "inet")


def frame_arrives(src_ns: str, dst_ns: str, vid: int, port: int = 7777) -> bool:
    """Whether a UDP datagram in a frame from src_ns's own MAC and address to dst_ns's (tagged with VLAN id `vid`
    unless 0) reaches a socket in dst_ns within 3 s."""
    (smac, sip), (dmac, dip) = job_addr(src_ns), job_addr(dst_ns)
    rx = subprocess.Popen(["ip", "netns", "exec", dst_ns, "python3", "-c", RECV_PY, str(port)],
                          stdout=subprocess.PIPE, text=True)
    try:
        assert rx.stdout is not None and rx.stdout.readline().strip() == "ready"
        sh(["ip", "netns", "exec", src_ns, "python3", "-c", SEND_FRAME_PY, dmac, smac, str(vid), sip, dip,
            str(port)])
        got = rx.stdout.readline().strip()
    finally:
        rx.kill()
        rx.wait()
        if rx.stdout is not None:
            rx.stdout.close()
    return got == "hand-made-frame"
