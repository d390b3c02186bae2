"""A self-signed certificate and its key in one PEM file, as HAProxy's `bind ... ssl crt` reads it: for tests
that check or run the front door's configuration without the lab's CA."""
from __future__ import annotations

import datetime


def self_signed(path):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .sign(key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    path.write_bytes(cert.public_bytes(pem) + key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                                                serialization.NoEncryption()))
