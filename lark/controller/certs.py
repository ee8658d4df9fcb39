"""`lark-controller certs`: a private CA and one key/certificate pair per name (controller, each EP, each switch).

Every certificate carries its role in the subject's organizational unit (OU): `lark-controller`, `lark-ep` or
`lark-switch`, so one CA serves all three and the OpenFlow listener can tell a switch from an EP. A switch's
certificate also binds its OpenFlow datapath id: its common name is `switch-<16 hex digits>`."""
from __future__ import annotations

import datetime
import ipaddress
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ..errors import LarkError

VALID_DAYS = 825
ROLE_CONTROLLER, ROLE_EP, ROLE_SWITCH = "lark-controller", "lark-ep", "lark-switch"
SWITCH_SPEC = "switch:"      # `switch:<dpid>` on the command line: a switch's certificate
SWITCH_PREFIX = "switch-"    # its common name: switch-<dpid as 16 hex digits>


def parse_dpid(text: str) -> int:
    """A datapath id as OVS (`other-config:datapath-id`) and switch vendors write it: hex, optionally with 0x or
    colons between bytes."""
    digits = text.lower().removeprefix("0x").replace(":", "")
    if not digits or len(digits) > 16 or not all(c in "0123456789abcdef" for c in digits):
        raise LarkError(f"{text!r} is not a datapath id", obj=f"switch certificate {SWITCH_SPEC}{text}",
                        fix="give the switch's datapath id as up to 16 hex digits, e.g. switch:0000000000000a01")
    return int(digits, 16)


def switch_name(dpid: int) -> str:
    return f"{SWITCH_PREFIX}{dpid:016x}"


def role_of(cert: x509.Certificate) -> str:
    """The certificate's role (its subject's OU), "" when it has none (made before roles existed)."""
    units = cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)
    return str(units[0].value) if len(units) == 1 else ""


def switch_dpid(der: bytes) -> int:
    """The datapath id a switch's certificate (DER, as the TLS peer presented it) is bound to. Raises ValueError
    saying why the certificate is not a switch's: another role, or no datapath id in its name."""
    cert = x509.load_der_x509_certificate(der)
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    cn = str(names[0].value) if names else ""
    role = role_of(cert)
    if role != ROLE_SWITCH:
        raise ValueError(f"certificate CN={cn} has role {role or 'none'!r}, not {ROLE_SWITCH!r}")
    digits = cn.removeprefix(SWITCH_PREFIX)
    if not cn.startswith(SWITCH_PREFIX) or len(digits) != 16 or not all(c in "0123456789abcdef" for c in digits):
        raise ValueError(f"switch certificate CN={cn} does not name a datapath id ({SWITCH_PREFIX}<16 hex digits>)")
    return int(digits, 16)


def _write_key(path: Path, key) -> None:
    data = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _load_or_make_ca(d: Path):
    ca_pem, ca_key = d / "ca.pem", d / "ca.key"
    if ca_pem.exists() and ca_key.exists():
        return (x509.load_pem_x509_certificate(ca_pem.read_bytes()),
                serialization.load_pem_private_key(ca_key.read_bytes(), None))
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Lark controller CA")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
            # Python >= 3.13 verifies strictly (VERIFY_X509_STRICT): key identifiers are required.
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    _write_key(ca_key, key)
    ca_pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert, key


def make(directory: str, specs: list[str]) -> list[str]:
    """specs: NAME or NAME=host,host,... (extra DNS names or IP addresses the certificate is valid for; the
    controller's certificate must name the address larkd connects to), or switch:DPID for a switch. NAME
    `controller` gets the controller's role, other NAMEs an EP's. Reuses an existing CA in the directory; returns
    the names of the files made (NAME.pem, NAME.key)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    ca, ca_key = _load_or_make_ca(d)
    made = []
    for spec in specs:
        if spec.startswith(SWITCH_SPEC):
            name, extra, role = switch_name(parse_dpid(spec.removeprefix(SWITCH_SPEC))), "", ROLE_SWITCH
        else:
            name, _, extra = spec.partition("=")
            role = ROLE_CONTROLLER if name == "controller" else ROLE_EP
        if not name or not all(c.isalnum() or c in "._-" for c in name):
            raise LarkError(f"{name!r} is not a plain name", obj=f"certificate {spec!r}",
                            fix="use e.g. controller, ep1 or switch:0000000000000a01")
        sans: list[x509.GeneralName] = [x509.DNSName(name)]
        for h in filter(None, extra.split(",")):
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(h)))
            except ValueError:
                sans.append(x509.DNSName(h))
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role),
                                        x509.NameAttribute(NameOID.COMMON_NAME, name)]))
                .issuer_name(ca.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.SubjectAlternativeName(sans), critical=False)
                .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                               critical=False)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                      ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
                .sign(ca_key, hashes.SHA256()))
        _write_key(d / f"{name}.key", key)
        (d / f"{name}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        made.append(name)
    return made
