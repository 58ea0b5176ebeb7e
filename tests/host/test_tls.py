"""One verifying TLS context per process, and every HTTP client of ours built with it.

httpx builds a context per client otherwise (37 ms of CPU each, the CA bundle loaded again); sharing
must not loosen verification.
"""

from __future__ import annotations

import re
import ssl
from pathlib import Path

from chaos.host.tls import tls_context

ROOT = Path(__file__).resolve().parents[2]
CLIENT = re.compile(r"httpx\.(?:Async)?Client\(")


def test_the_shared_context_verifies_certificates_and_host_names() -> None:
    context = tls_context()
    assert context is tls_context()
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert context.cert_store_stats()["x509_ca"] > 0  # the CA bundle is loaded: https targets still verify


def test_every_client_of_the_packages_is_built_with_the_shared_context() -> None:
    missing = []
    for path in [*ROOT.glob("chaos/**/*.py"), *ROOT.glob("faults/**/*.py"), *ROOT.glob("sla/**/*.py")]:
        text = path.read_text(encoding="utf-8")
        for match in CLIENT.finditer(text):
            depth, end = 0, match.end() - 1
            for end in range(match.end() - 1, len(text)):  # to the call's closing parenthesis
                depth += {"(": 1, ")": -1}.get(text[end], 0)
                if depth == 0:
                    break
            if "verify=tls_context()" not in text[match.start():end]:
                line = text.count("\n", 0, match.start()) + 1
                missing.append(f"{path.relative_to(ROOT)}:{line}")
    assert not missing, f"clients building their own TLS context (pass verify=tls_context()): {missing}"
