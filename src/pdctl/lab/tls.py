"""The lab's TLS: a CA and a server certificate for the front-door hosts, under .lab/tls.

Production takes the front door's certificate and key from Ansible Vault; the lab makes its own CA
(ca.pem, which the lab tests and the gates trust) and signs a certificate for every front-door
address and name in the plan. Made again when the plan's front-door hosts change.
"""
from __future__ import annotations

import datetime
import ipaddress
import json
import os
from pathlib import Path


def _write(path: Path, data: bytes, mode: int) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)


def _names(inventory_dir: Path) -> list[str]:
    from pdctl import inventory
    fd = inventory.plan(inventory_dir)["frontdoor"]
    vip = [fd["vip"]["address"]] if fd.get("vip") else []
    return sorted(set(fd["hosts"]) | set(fd["addresses"]) | set(vip) | {"localhost", "127.0.0.1"})


def ensure(lab_dir: Path, inventory_dir: Path) -> Path:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    d = lab_dir / "tls"
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    names = _names(inventory_dir)
    stamp = d / "names.json"
    if (d / "frontdoor.pem").exists() and stamp.exists() and json.loads(stamp.read_text()) == names:
        return d
    now = datetime.datetime.now(datetime.timezone.utc)
    pem = serialization.Encoding.PEM
    ca_path = d / "ca.pem"
    if not ca_path.exists() or not (d / "ca-key.pem").exists():
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "pdctl-lab CA")])
        ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
              .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
              .not_valid_before(now - datetime.timedelta(minutes=5))
              .not_valid_after(now + datetime.timedelta(days=3650))
              .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
              .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                           content_commitment=False, key_encipherment=False,
                                           data_encipherment=False, key_agreement=False,
                                           encipher_only=False, decipher_only=False), critical=True)
              .sign(ca_key, hashes.SHA256()))
        _write(d / "ca-key.pem", ca_key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                                      serialization.NoEncryption()), 0o600)
        _write(ca_path, ca.public_bytes(pem), 0o644)
    ca = x509.load_pem_x509_certificate(ca_path.read_bytes())
    ca_key = serialization.load_pem_private_key((d / "ca-key.pem").read_bytes(), None)
    key = ec.generate_private_key(ec.SECP256R1())
    sans = []
    for name in names:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            sans.append(x509.DNSName(name))
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "pdctl-lab front door")]))
            .issuer_name(ca.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=825))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    _write(d / "frontdoor-key.pem", key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                                      serialization.NoEncryption()), 0o600)
    _write(d / "frontdoor.pem", cert.public_bytes(pem) + ca.public_bytes(pem), 0o644)
    stamp.write_text(json.dumps(names))
    return d
