"""Certificates for TLS: a certificate authority, and server and client certificates it
signs (X.509 v3, ECDSA P-256, SHA-256), written as PEM files. `shadowtopic standalone
--secure` makes its own with these, and the tests do; a deployment brings its own (any CA).

- a server certificate names the hosts it serves in its subjectAltName (DNS names and IP
  addresses: a client checks the one it dialled), and is usable for client authentication
  too: brokers dial each other with the same cluster certificate (mutual TLS);
- a client certificate's subject common name names the client.
"""
from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from shadowtopic.security.files import write_private

DAYS = 365


@dataclass(frozen=True)
class Pem:
    """A certificate and its private key, PEM."""
    cert: bytes
    key: bytes


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _valid(builder: x509.CertificateBuilder, days: int) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (builder.not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .serial_number(x509.random_serial_number()))


def make_ca(common_name: str = "shadowtopic CA", days: int = DAYS) -> Pem:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (_valid(x509.CertificateBuilder(), days)
            .subject_name(_name(common_name)).issuer_name(_name(common_name))
            .public_key(key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                         crl_sign=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    return Pem(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def issue(ca: Pem, common_name: str, hosts: list[str] | None = None,
          days: int = DAYS) -> Pem:
    """A certificate signed by `ca` for `common_name`; with `hosts` (DNS names or IP
    addresses) a server certificate for them (usable as a client's too), without a client
    certificate only."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert)
    ca_key = serialization.load_pem_private_key(ca.key, password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
    builder = (_valid(x509.CertificateBuilder(), days)
               .subject_name(_name(common_name)).issuer_name(ca_cert.subject)
               .public_key(key.public_key())
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True))
    if hosts:
        usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        names: list[x509.GeneralName] = []
        for h in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(h)))
            except ValueError:
                names.append(x509.DNSName(h))
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = (builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return Pem(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def write(pem: Pem, directory: str, name: str) -> tuple[str, str]:
    """`<name>.crt` and `<name>.key` (mode 0600) in `directory`; their paths. Each file is
    written whole, then renamed into place (a reader never sees half a certificate)."""
    os.makedirs(directory, exist_ok=True)
    paths = (os.path.join(directory, f"{name}.crt"), os.path.join(directory, f"{name}.key"))
    for path, data in zip(paths, (pem.cert, pem.key), strict=True):
        write_private(path, data)
    return paths


def common_name(cert_pem: bytes) -> str | None:
    """The subject common name of a PEM certificate (a client certificate's role)."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    value = names[0].value if names else None
    return value if isinstance(value, str) else None
