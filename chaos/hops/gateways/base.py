"""What every real gateway of a path is to the run: the ``Gateway`` class, its registry
(``@gateway_kind``, ``GATEWAY_KINDS``, ``gateway_kinds``) and a user's configuration file as a template.

A gateway carries its own facts, so the runner, the loader and the dry run ask it rather than know it:

- ``kind`` (``path[].kind``), ``binaries`` (names looked up on PATH, then absolute paths tried),
  ``install_hint`` (the package to install, named in the one-line error when none is found);
- ``options``: the knobs of its shipped configuration (a ``Schema``: ``path[].options``);
- ``config_name``: the file the configuration is written to in the hop's work directory;
- ``listen_in_config``: whether its configuration says where it listens (nginx, HAProxy, Caddy) or
  its command line does (LiteLLM);
- ``version(binary)``, ``render(port, upstream, workdir, options)`` (the shipped configuration, made
  for streaming), ``check(binary, config_path, workdir)`` (its own check's words, or None),
  ``command(binary, config_path, workdir, port)`` and ``environment(workdir)``;
- ``listener(options)``: what it serves its client with those options (``Listener``: TLS with the
  run's certificate, HTTP/2), from the ``tls`` and ``http2`` options of those that have them.

A user's ``config:`` file replaces the shipped configuration. It is a template: ``{{listen}}``
(``127.0.0.1:P``), ``{{port}}``, ``{{upstream}}`` (``http://host:port``), ``{{upstream_hostport}}`` and
``{{workdir}}`` are substituted; a file that names neither ``{{listen}}`` nor ``{{port}}`` (where the
gateway's configuration says where it listens) is refused, since the gateway could not listen where
the run says. Every refusal is a located ``Problem``. ``{{cert}}`` (the certificate chain, PEM),
``{{key}}`` (its key) and ``{{cert_key}}`` (both in one file, what HAProxy's ``crt`` reads) are the
run's certificate for 127.0.0.1, and ``{{ca}}`` the run's CA (to verify an https upstream the run
serves), copied owner-only into the hop's ``tls/`` directory when the file names them: a file that
names one of the first three serves TLS, so the hop's URL is ``https://`` (``template_listener``).
"""

from __future__ import annotations

import importlib
import ipaddress
import os
import pkgutil
import re
import shutil
import subprocess
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar
from urllib.parse import urlsplit

from chaos.model.errors import ExperimentInvalid, Problem, SetupFailed
from chaos.model.params import Param, Schema, suggest

__all__ = [
    "GATEWAY_KINDS", "PLACEHOLDERS", "SERVING_PLACEHOLDERS", "TLS_PLACEHOLDERS", "Gateway", "GatewayOptions",
    "Listener", "TlsFiles", "Upstream", "all_values", "gateway_class", "gateway_kind", "gateway_kinds",
    "loopback_host", "millis",
    "named_placeholders", "quote_lines", "read_template", "run_tool", "substitute", "template_listener",
    "template_problems", "template_values", "tls_param", "tls_values", "upstream_ca", "validate_user_config",
    "write_tls_files",
]

TLS_PLACEHOLDERS = ("cert", "key", "cert_key", "ca")
SERVING_PLACEHOLDERS = ("cert", "key", "cert_key")  # a file naming one of these serves TLS
PLACEHOLDERS = ("listen", "port", "upstream", "upstream_hostport", "workdir", *TLS_PLACEHOLDERS)
TLS_DIR = "tls"  # under the hop's work directory: the run's certificate as the gateway reads it
_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
TOOL_TIMEOUT_S = 60.0  # a version or a configuration check: each runs in well under a second here
CHECK_LINES = 12  # at most this many lines of a check's complaint are quoted


@dataclass(frozen=True)
class Upstream:
    """Where a gateway forwards to, from the next hop's root URL (``http://host:port``)."""

    scheme: str  # http | https
    host: str
    port: int

    @property
    def hostport(self) -> str:
        """``host:port`` (an IPv6 host in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def root(self) -> str:
        """``scheme://host:port``: no path, so a gateway forwards each request's path unchanged."""
        return f"{self.scheme}://{self.hostport}"

    @classmethod
    def parse(cls, url: str) -> Upstream:
        """``SetupFailed`` for anything but an http(s) URL with a host; the port defaults by scheme."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise SetupFailed(f"a gateway's upstream must be an http(s) URL with a host, not {url!r}")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise SetupFailed(f"a gateway's upstream has a bad port: {url!r}") from None
        return cls(parts.scheme, parts.hostname, port)


@dataclass(frozen=True)
class Listener:
    """What a gateway serves its client: over TLS (the run's certificate) or not, HTTP/2 or not (None:
    a user's file, whichever it says: the readiness probe and the load's client learn it by asking)."""

    tls: bool = False
    http2: bool | None = False

    @property
    def scheme(self) -> str:
        """The scheme of the hop's URL: what the load (or the hop before it) connects with."""
        return "https" if self.tls else "http"


@dataclass(frozen=True)
class TlsFiles:
    """The run's certificate in a hop's work directory, as its gateway reads it (``write_tls_files``)."""

    cert: Path  # PEM: the leaf, then the run's CA
    key: Path  # PEM, PKCS#8
    cert_key: Path  # the chain and the key in one PEM file: HAProxy's ``crt`` takes no separate key here
    ca: Path  # the run's CA: what an https upstream the run serves itself (a hop, the target) is verified with

    @classmethod
    def under(cls, workdir: Path) -> TlsFiles:
        """Where they are for the hop working in ``workdir`` (whether written yet or not). Pure."""
        tls = workdir / TLS_DIR
        return cls(cert=tls / "cert.pem", key=tls / "key.pem", cert_key=tls / "cert_key.pem", ca=tls / "ca.pem")


def write_tls_files(workdir: Path, *, chain: Path | None = None, key: Path | None = None,
                    ca: Path | None = None) -> TlsFiles:
    """Copy what is given into ``workdir/tls/`` (0700; each file 0600, made new, never through a link):
    a certificate chain and its key (and the two in one file), the run's CA. Copies, not the run's own
    files, so a gateway reads only what lies in its own directory."""
    files = TlsFiles.under(workdir)
    writes: list[tuple[Path, bytes]] = []
    if chain is not None and key is not None:
        pem, secret = chain.read_bytes(), key.read_bytes()
        writes += [(files.cert, pem), (files.key, secret), (files.cert_key, pem.rstrip(b"\n") + b"\n" + secret)]
    if ca is not None:
        writes.append((files.ca, ca.read_bytes()))
    files.cert.parent.mkdir(mode=0o700, exist_ok=True)
    for path, data in writes:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
    return files


def upstream_ca(workdir: Path, upstream: Upstream) -> Path | None:
    """The CA a gateway verifies an https ``upstream`` on this host with, instead of the system's: the
    run's, where it lies in the hop's directory (the next hop or the target serves the run's
    certificate), else None (a remote upstream always: the run's certificates name loopback only)."""
    ca = TlsFiles.under(workdir).ca
    return ca if upstream.scheme == "https" and loopback_host(upstream.host) and ca.is_file() else None


def loopback_host(host: str) -> bool:
    """Whether ``host`` (a name or an address, no brackets) is this host's loopback."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def tls_param(gateway: str) -> Param:
    """The ``tls`` option, the same for every gateway that has it."""
    return Param("tls", "bool", False,
                 doc=f"{gateway} serves its client over TLS with a certificate the run makes for 127.0.0.1 (its CA"
                     " trusted by the load): the hop's URL is https://")


@dataclass(frozen=True)
class GatewayOptions(Schema):
    """A gateway's options (``path[].options``): a ``Schema`` and the checks across its options, each
    ``values -> (key, message)`` or None, run when every value parsed (so the loader locates them)."""

    checks: tuple[Callable[[Mapping[str, Any]], tuple[str, str] | None], ...] = field(default=())

    def parse(self, raw: Mapping[str, Any]) -> tuple[dict[str, Any], list[tuple[str, str]]]:
        values, problems = super().parse(raw)
        if not problems:
            problems = [found for check in self.checks if (found := check(values)) is not None]
        return values, problems


def millis(seconds: float) -> str:
    """A duration as the ``<N>ms`` nginx, HAProxy and Caddy all read (at least 1 ms)."""
    return f"{max(1, round(seconds * 1000))}ms"


def run_tool(command: list[str], *, env: Mapping[str, str] | None = None, cwd: Path | None = None) -> tuple[int, str]:
    """Run a gateway's own tool (``nginx -v``, ``haproxy -c``, ...) bounded in time: its status and
    its stdout and stderr together, stripped. A tool that cannot run is status 127 and why."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, errors="replace", timeout=TOOL_TIMEOUT_S,
                              check=False, stdin=subprocess.DEVNULL, cwd=cwd,
                              env=None if env is None else {**os.environ, **env})
    except subprocess.TimeoutExpired:
        return 124, f"{command[0]} did not finish within {TOOL_TIMEOUT_S:g}s"
    except OSError as exc:
        return 127, f"{command[0]}: {exc.strerror}"
    return done.returncode, (done.stdout + done.stderr).strip()


class Gateway(ABC):
    """A real gateway the run starts in its path (``path[].kind``): its facts and its tools.

    Subclasses set the class attributes and implement the four methods; ``@gateway_kind`` registers
    them. Instances hold no state: ``GATEWAY_KINDS[kind]()`` is the gateway of that kind.
    """

    kind: ClassVar[str]
    binaries: ClassVar[tuple[str, ...]]
    install_hint: ClassVar[str]
    options: ClassVar[Schema]
    config_name: ClassVar[str]
    listen_in_config: ClassVar[bool] = True
    startup_timeout_s: ClassVar[float] = 30.0  # from spawn to answering HTTP on its port
    stop_grace_s: ClassVar[float] = 5.0  # from SIGTERM to SIGKILL of its process group

    def find_binary(self, search_path: str | None = None) -> str:
        """The first of ``binaries`` that exists (a name on ``search_path``, default PATH; an absolute
        path as it is). ``SetupFailed`` (exit 4), one line naming the package, when there is none."""
        for candidate in self.binaries:
            if os.path.isabs(candidate):
                if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                    return candidate
            elif (found := shutil.which(candidate, path=search_path)) is not None:
                return found
        raise SetupFailed(f"{self.kind}: no {self.kind} binary here (looked for {', '.join(self.binaries)});"
                          f" install it: {self.install_hint}")

    def effective_options(self, options: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The shipped configuration's knobs: the defaults, with the given (already parsed) values over them."""
        values, _ = self.options.parse({})
        values.update({k: v for k, v in (options or {}).items() if v is not None})
        return values

    @abstractmethod
    def version(self, binary: str) -> str:
        """What the binary says its version is (from its own version output)."""

    @abstractmethod
    def render(self, listen_port: int, upstream_root: str, workdir: Path, options: Mapping[str, Any]) -> str:
        """The shipped configuration, made for streaming: listening on 127.0.0.1:``listen_port`` only,
        forwarding to ``upstream_root``, temporary files under ``workdir``; ``options`` as parsed."""

    @abstractmethod
    def check(self, binary: str, config_path: Path, workdir: Path) -> str | None:
        """The gateway's own check of a configuration: None when it passes, else its complaint, its words."""

    @abstractmethod
    def command(self, binary: str, config_path: Path, workdir: Path, port: int) -> list[str]:
        """The command that runs it in the foreground (its process group is ended to stop it)."""

    def environment(self, workdir: Path) -> dict[str, str]:
        """Variables set for its process and its check, over the runner's environment."""
        return {}

    def listener(self, options: Mapping[str, Any] | None = None) -> Listener:
        """What its shipped configuration serves its client with ``options``: its ``tls`` and ``http2``
        options (a gateway without them serves HTTP/1.1 in the clear)."""
        o = self.effective_options(options)
        return Listener(tls=bool(o.get("tls")), http2=bool(o.get("http2")))


GATEWAY_KINDS: dict[str, type[Gateway]] = {}
_Kind = TypeVar("_Kind", bound=type[Gateway])
_found = False


def gateway_kind(cls: _Kind) -> _Kind:
    """Class decorator: make a gateway kind known to ``path:`` and to ``start_gateway``."""
    if cls.kind in GATEWAY_KINDS and GATEWAY_KINDS[cls.kind] is not cls:
        raise AssertionError(f"gateway kind {cls.kind!r} registered twice")
    GATEWAY_KINDS[cls.kind] = cls
    return cls


def gateway_kinds() -> dict[str, type[Gateway]]:
    """Every gateway kind, by name: this package's modules imported once (each registers its own)."""
    global _found
    if not _found:
        for module in pkgutil.iter_modules([str(Path(__file__).parent)]):
            importlib.import_module(f"{__package__}.{module.name}")
        _found = True
    return dict(sorted(GATEWAY_KINDS.items()))


def gateway_class(kind: str) -> type[Gateway]:
    """The class of gateway ``kind``; ``SetupFailed`` naming the known kinds when there is none."""
    known = gateway_kinds()
    if kind not in known:
        raise SetupFailed(f"gateway kind {kind!r} is not known{suggest(kind, known)}; known: {', '.join(known)}")
    return known[kind]


# ---------------------------------------------------------------- a user's configuration as a template


def template_values(listen_port: int, upstream_root: str, workdir: Path) -> dict[str, str]:
    """What each placeholder but the TLS ones (``tls_values``) stands for in one hop's configuration."""
    upstream = Upstream.parse(upstream_root)
    return {"listen": f"127.0.0.1:{listen_port}", "port": str(listen_port), "upstream": upstream.root,
            "upstream_hostport": upstream.hostport, "workdir": str(workdir)}


def all_values(listen_port: int, upstream_root: str, workdir: Path) -> dict[str, str]:
    """What every placeholder stands for: ``template_values`` and ``tls_values``."""
    return {**template_values(listen_port, upstream_root, workdir), **tls_values(workdir)}


def tls_values(workdir: Path) -> dict[str, str]:
    """The TLS placeholders: where their files are written in the hop's directory when a template names them."""
    files = TlsFiles.under(workdir)
    return {"cert": str(files.cert), "key": str(files.key), "cert_key": str(files.cert_key), "ca": str(files.ca)}


def template_listener(text: str) -> Listener:
    """What a user's configuration serves: TLS when it names the run's certificate (``{{cert}}``,
    ``{{key}}`` or ``{{cert_key}}``). Whether it speaks HTTP/2 is its own business: the run's readiness
    probe and the load's client learn it by asking (ALPN; a prior-knowledge preface in the clear)."""
    return Listener(tls=bool(named_placeholders(text) & set(SERVING_PLACEHOLDERS)), http2=None)


def named_placeholders(text: str) -> set[str]:
    """The placeholders a template names (known or not)."""
    return {match.group(1) for match in _PLACEHOLDER.finditer(text)}


def template_problems(text: str, *, needs_listen: bool = True) -> list[tuple[int, int, str]]:
    """``(line, column, message)`` for each unknown placeholder, and ``(0, 0, message)`` when the
    template never says where to listen (``needs_listen``). Pure."""
    problems: list[tuple[int, int, str]] = []
    named: set[str] = set()
    for match in _PLACEHOLDER.finditer(text):
        name = match.group(1)
        named.add(name)
        if name not in PLACEHOLDERS:
            line = text.count("\n", 0, match.start()) + 1
            column = match.start() - (text.rfind("\n", 0, match.start()) + 1) + 1
            problems.append((line, column, f"unknown placeholder {match.group(0)}{suggest(name, PLACEHOLDERS)};"
                                           f" known: {', '.join('{{' + p + '}}' for p in PLACEHOLDERS)}"))
    if needs_listen and not named & {"listen", "port"}:
        problems.append((0, 0, "the file contains neither {{listen}} nor {{port}}: the gateway could not listen"
                               " where the run says (a free port on 127.0.0.1); write e.g. `listen {{listen}};`"))
    return problems


def substitute(text: str, values: Mapping[str, str]) -> str:
    """``text`` with every known placeholder replaced (unknown ones are ``template_problems``)."""
    return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), text)


def read_template(path: Path, *, needs_listen: bool = True, key: str = "config") -> str:
    """A user's configuration template, read and checked: ``ExperimentInvalid`` (exit 2) with each
    problem located in the file (a file that cannot be read is located at ``key``)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ExperimentInvalid([Problem("<experiment>", 0, 0, key, f"gateway configuration {path}: {why}")]) from None
    problems = template_problems(text, needs_listen=needs_listen)
    if problems:
        raise ExperimentInvalid([Problem(str(path), line, col, key if not line else "", message)
                                 for line, col, message in problems])
    return text


def validate_user_config(gateway: Gateway, path: Path, *, key: str = "config") -> list[Problem]:
    """Every problem of a user's configuration found before the run starts anything: unreadable, a
    bad template, or (when the gateway's binary is here) refused by the gateway's own check, run on
    the file as it would be substituted (a placeholder port, a throwaway work directory)."""
    try:
        text = read_template(path, needs_listen=gateway.listen_in_config, key=key)
    except ExperimentInvalid as exc:
        return exc.problems
    try:
        binary = gateway.find_binary()
    except SetupFailed:
        return []  # the run says so itself (exit 4): a missing binary is no mistake in the experiment
    with tempfile.TemporaryDirectory(prefix="streamchaos-check-") as tmp:
        workdir = Path(tmp)
        config = workdir / gateway.config_name
        if named_placeholders(text) & set(TLS_PLACEHOLDERS):  # throwaway files, so the check can load them
            from chaos.host.certs import make_local_certs

            pair = make_local_certs(workdir / "made")
            write_tls_files(workdir, chain=pair.cert, key=pair.key, ca=pair.ca)
        config.write_text(substitute(text, all_values(9, "http://127.0.0.1:9", workdir)), encoding="utf-8")
        complaint = gateway.check(binary, config, workdir)
    if complaint is None:
        return []
    # the copy it checked is gone when this is read, and its lines are the file's (a placeholder's value
    # holds no newline): name the user's file
    complaint = complaint.replace(str(config), str(path)).replace(str(workdir), "<work directory>")
    return [Problem(str(path), 0, 0, key, f"{gateway.kind}'s own check refused it: {complaint}")]


def quote_lines(text: str, keep: tuple[str, ...] = ()) -> str:
    """The lines of a tool's complaint worth quoting (those containing any of ``keep``, else all),
    joined by `` | `` so the quote stays one line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    chosen = [line for line in lines if any(word in line for word in keep)] if keep else []
    return " | ".join((chosen or lines)[:CHECK_LINES]) or "(no output)"

