"""``stack serve --tls``: which certificate and key the server uses, checked before it starts.

Given (``--tls-cert`` and ``--tls-key``), both files must be readable, the certificate a PEM chain
and the key an unencrypted PEM key that matches it: each problem is one line naming the file
(``TlsUnusable``, exit 2), found here rather than as a traceback from the server's start, and
never a passphrase prompt on the terminal. Not given, a throwaway CA and a certificate for the
loopback names are made (``chaos.host.certs.make_local_certs``) under a new 0700 directory that
``TlsFiles.remove`` deletes at exit; a client trusts ``TlsFiles.ca`` to verify it.
"""

from __future__ import annotations

import shutil
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["TlsFiles", "TlsUnusable", "resolve_tls"]


class TlsUnusable(ValueError):
    """The TLS options cannot be used as given (exit 2, one line)."""


@dataclass(frozen=True)
class TlsFiles:
    """The server's certificate chain and key; ``ca`` and ``made`` only for a pair made here."""

    cert: str
    key: str
    ca: str | None = None  # the CA a client must trust (a pair made here; None for given files)
    made: str | None = None  # the directory made for the pair, removed by ``remove``

    def context(self, alpn: tuple[str, ...]) -> ssl.SSLContext:
        """A server context offering ``alpn`` (in order)."""
        from chaos.host.tls import server_context

        return server_context(self.cert, self.key, alpn)

    def remove(self) -> None:
        if self.made is not None:
            shutil.rmtree(self.made, ignore_errors=True)


def resolve_tls(tls: bool, cert: str | None, key: str | None) -> TlsFiles | None:
    """The files ``--tls``/``--tls-cert``/``--tls-key`` name (None: plain HTTP); ``TlsUnusable`` when unusable."""
    if not tls:
        if cert is not None or key is not None:
            raise TlsUnusable("--tls-cert and --tls-key serve HTTPS only with --tls: add --tls, or remove them")
        return None
    if (cert is None) != (key is None):
        given, missing = ("--tls-cert", "--tls-key") if cert is not None else ("--tls-key", "--tls-cert")
        raise TlsUnusable(f"{given} needs {missing} too (a certificate and its key); give neither for a certificate "
                          "made for this process")
    if cert is not None and key is not None:
        check_pair(cert, key)
        return TlsFiles(cert=cert, key=key)
    from chaos.host.certs import make_local_certs

    made = tempfile.mkdtemp(prefix="streamchaos-tls-")  # mode 0700
    try:
        pair = make_local_certs(Path(made))
    except BaseException:
        shutil.rmtree(made, ignore_errors=True)
        raise
    return TlsFiles(cert=str(pair.cert), key=str(pair.key), ca=str(pair.ca), made=made)


def check_pair(cert: str, key: str) -> None:
    """``TlsUnusable`` unless ``cert`` is a PEM certificate chain and ``key`` its unencrypted PEM key."""
    from cryptography import x509
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    cert_pem, key_pem = _read("--tls-cert", cert), _read("--tls-key", key)
    try:
        x509.load_pem_x509_certificates(cert_pem)
    except ValueError:
        raise TlsUnusable(f"--tls-cert {cert} holds no PEM certificate") from None
    try:
        load_pem_private_key(key_pem, password=None)
    except TypeError:  # "Password was not given but private key is encrypted"
        raise TlsUnusable(f"--tls-key {key} is encrypted; give an unencrypted key (mode 0600)") from None
    except (ValueError, UnsupportedAlgorithm):
        raise TlsUnusable(f"--tls-key {key} holds no PEM private key this server can use") from None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert, key, password=b"")
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in (exc.reason or ""):
            raise TlsUnusable(f"--tls-key {key} is not the key of the certificate in --tls-cert {cert}") from None
        raise TlsUnusable(f"--tls-cert {cert} with --tls-key {key} cannot be used: {exc.reason or exc}") from None


def _read(flag: str, path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(1 << 20)  # a chain of a few certificates is a few KB
    except OSError as exc:
        raise TlsUnusable(f"cannot read {flag} {path}: {exc.strerror or exc}") from None
