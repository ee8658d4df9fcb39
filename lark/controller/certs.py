"""`lark-controller certs`: a private CA and one key/certificate pair per name (controller, each EP)."""
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
    controller's certificate must name the address larkd connects to). Reuses an existing CA in the directory."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    ca, ca_key = _load_or_make_ca(d)
    made = []
    for spec in specs:
        name, _, extra = spec.partition("=")
        if not name or not all(c.isalnum() or c in "._-" for c in name):
            raise LarkError(f"{name!r} is not a plain name", obj=f"certificate {spec!r}",
                            fix="use e.g. controller or ep1")
        sans: list[x509.GeneralName] = [x509.DNSName(name)]
        for h in filter(None, extra.split(",")):
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(h)))
            except ValueError:
                sans.append(x509.DNSName(h))
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
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
