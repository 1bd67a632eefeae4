"""Make the private certificate authority and the certificates the two sites authenticate each other with.

The server and every compute site trust only this CA, so a connection is accepted only from a machine
holding a key issued by whoever ran `keys` (and only that person holds `ca/ca.key`). Layout of `out`:

    ca/ca.pem, ca/ca.key                the CA certificate and its key (keep the key; copy it nowhere)
    server/{cert,key,ca}.pem            copy this directory to the server host (`--keys DIR`)
    <client>/{cert,key,ca}.pem          one per compute site; copy each to its site

The server certificate names `server` (DNS name, or IP address if it parses as one) and, in addition, always
`localhost`, 127.0.0.1 and ::1, so tests and single-machine demos work without extra names. A client's
identity is the CN of its certificate (its name here), which the server reports as the peer name.

Keys are EC P-256 (quick to make and to use). Everything is built in a temporary directory beside `out` and
renamed into place at the end, so an interrupted run leaves nothing half-made; `out` is created mode 0700
(it holds the CA key) and every key file is mode 0600.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from paramedic.errors import OutputError, UsageError

CLIENT_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
RESERVED = {"server", "ca"}
HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")
MAX_CN = 64  # X.509 upper bound on a common name


def make_keys(out: Path, server: str, clients: Sequence[str], days: int = 825) -> None:
    """Create the CA, the server's and each client's certificate and key under `out` (see module doc)."""
    out = Path(out)
    server_ip = _check_server(server)
    _check_clients(clients)
    if days < 1:
        raise UsageError(f"--days must be at least 1, not {days}")
    if out.exists() or out.is_symlink():
        raise OutputError(f"{out} already exists; choose a new directory (keys are never overwritten)")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    except OSError as exc:
        raise OutputError(f"cannot create {out}: {exc.strerror or exc}") from None
    try:
        _build(tmp, server, server_ip, list(clients), days)
        if out.exists() or out.is_symlink():  # appeared while we were working; do not replace it
            raise OutputError(f"{out} already exists; choose a new directory (keys are never overwritten)")
        os.rename(tmp, out)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise OutputError(f"cannot write keys to {out}: {exc.strerror or exc}") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _check_server(server: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """Return the address if `server` is an IP address; UsageError unless it is a valid host name."""
    try:
        return ipaddress.ip_address(server)
    except ValueError:
        pass
    if len(server) > MAX_CN:
        raise UsageError(f"server name {server!r} is longer than {MAX_CN} characters")
    labels = server.split(".")
    if not server or not all(HOST_LABEL.fullmatch(label) for label in labels) or labels[-1].isdigit():
        raise UsageError(f"server name {server!r} is not a host name or IP address")
    return None


def _check_clients(clients: Sequence[str]) -> None:
    if isinstance(clients, str):
        clients = [clients]
    if not clients:
        raise UsageError("at least one client (compute site) name is required")
    seen: set[str] = set()
    for name in clients:
        if not isinstance(name, str) or not CLIENT_NAME.fullmatch(name) or name in {".", ".."}:
            raise UsageError(f"client name {name!r} must be 1-64 characters from A-Z a-z 0-9 . _ -")
        key = name.casefold()  # the names become directories; keep them distinct on any file system
        if key in RESERVED:
            raise UsageError(f"client name {name!r} is reserved (the server and CA directories use it)")
        if key in seen:
            raise UsageError(f"client name {name!r} is given twice")
        seen.add(key)


def _build(
    root: Path,
    server: str,
    server_ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None,
    clients: list[str],
    days: int,
) -> None:
    now = datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(hours=1), now + datetime.timedelta(days=days)  # allow clock skew

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"ParaMEDIC CA {secrets.token_hex(4)}")])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    ca_pem = ca_cert.public_bytes(serialization.Encoding.PEM)
    (root / "ca").mkdir()
    _write(root / "ca" / "ca.pem", ca_pem, 0o644)
    _write(root / "ca" / "ca.key", _key_pem(ca_key), 0o600)

    def issue(directory: str, name: str, usage: x509.ObjectIdentifier, alt: list[x509.GeneralName]) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(cert_sign=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False
            )
        )
        if alt:
            builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        (root / directory).mkdir()
        _write(root / directory / "cert.pem", cert.public_bytes(serialization.Encoding.PEM), 0o644)
        _write(root / directory / "key.pem", _key_pem(key), 0o600)
        _write(root / directory / "ca.pem", ca_pem, 0o644)

    alt: list[x509.GeneralName] = [
        x509.IPAddress(server_ip) if server_ip is not None else x509.DNSName(server)
    ]
    for extra in (
        x509.DNSName("localhost"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("::1")),
    ):
        if extra not in alt:
            alt.append(extra)
    issue("server", server, ExtendedKeyUsageOID.SERVER_AUTH, alt)
    for client in clients:
        issue(client, client, ExtendedKeyUsageOID.CLIENT_AUTH, [])


def _key_usage(cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not cert_sign,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _write(path: Path, data: bytes, mode: int) -> None:
    """Create `path` with `mode` from the start (a key is never readable by others, even briefly)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), mode)  # the umask may have removed bits from a public file; keys stay 0600
        f.write(data)
