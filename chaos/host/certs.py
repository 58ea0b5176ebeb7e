"""A run's own certificates: a throwaway CA and a server certificate it signed for the loopback names.

What serves TLS in a run the run itself started (the builtin stack's ``--tls``, a stream hop or a
gateway with ``tls: true``) uses one of these, and the run's clients trust the CA (``chaos.host.tls.trust``):
nothing is added to the host's trust store, and no other process trusts it (a process that runs several
runs, a test session, keeps trusting each run's CA it has seen: a fresh key each, harmless). The
keys are EC P-256 (a handshake costs a fraction of RSA's), written owner-only; the certificates are
valid for a day around now, enough for any run, too short to matter if one leaks.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import threading
from dataclasses import dataclass
from pathlib import Path

__all__ = ["LOCAL_NAMES", "CertPair", "certs_for_run", "make_local_certs"]

LOCAL_NAMES = ("127.0.0.1", "::1", "localhost")
_VALID = datetime.timedelta(days=1)
_RUN_LOCK = threading.Lock()


@dataclass(frozen=True)
class CertPair:
    """A server certificate (``cert``: its PEM chain, leaf then CA), its key, and the CA that signed it (``ca``)."""

    cert: Path
    key: Path
    ca: Path


def make_local_certs(directory: Path, names: tuple[str, ...] = LOCAL_NAMES, *, label: str = "streamchaos") -> CertPair:
    """Write ``ca.pem``, ``cert.pem`` and ``key.pem`` (0600) under ``directory`` (made 0700 if new): a
    CA made for this call and a server certificate for ``names`` (IP addresses and DNS names)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    not_before, not_after = now - datetime.timedelta(minutes=5), now + _VALID
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{label} run CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(not_before).not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                     crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    alt_names: list[x509.GeneralName] = []
    for name in names:
        try:
            alt_names.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alt_names.append(x509.DNSName(name))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(not_before).not_valid_after(not_after)
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    ca_path, cert_path, key_path = directory / "ca.pem", directory / "cert.pem", directory / "key.pem"
    ca_path.write_bytes(ca_cert.public_bytes(pem))
    cert_path.write_bytes(cert.public_bytes(pem) + ca_cert.public_bytes(pem))
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return CertPair(cert=cert_path, key=key_path, ca=ca_path)


def certs_for_run(run_dir: Path) -> CertPair:
    """The run's one certificate pair, under ``run_dir/tls``: made by the first caller (the target, a hop
    or a gateway, whichever starts first; thread-safe), the same files for every later one. Its CA is
    trusted from then on by every client of this process (``chaos.host.tls.trust``); the load process
    learns it from ``chaos.host.tls.trusted()``, passed on in ``LoadTarget.ca_pems``."""
    from chaos.host.tls import trust

    directory = run_dir / "tls"
    with _RUN_LOCK:
        pair = CertPair(cert=directory / "cert.pem", key=directory / "key.pem", ca=directory / "ca.pem")
        if not (pair.cert.is_file() and pair.key.is_file() and pair.ca.is_file()):
            pair = make_local_certs(directory)
        trust(pair.ca)
    return pair
