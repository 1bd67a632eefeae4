"""TLS contexts for the link between the server site and the compute sites.

Both ends speak TLS 1.3 only and trust only the private CA made by `paramedic keys` (see `site.keys`).
The server requires a client certificate: that is how a compute site is authenticated, and its CN is the
site's name (`peer_name`). A client without a certificate from that CA, or one that cannot do TLS 1.3,
fails in the handshake, before the server reads any request. The client checks the server's certificate
and host name, so it never sends work or data to an impostor.

`--keys DIR` is a directory made by `paramedic keys`: `ca.pem`, `cert.pem` and `key.pem`.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import cast

from paramedic.errors import UsageError


def server_context(keys: Path) -> ssl.SSLContext:
    """Context for the server: TLS 1.3, a client certificate from our CA is required."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.verify_mode = ssl.CERT_REQUIRED
    # No session tickets: nothing resumes sessions, and the server then writes nothing after the handshake
    # that could race with a client that sends its request and closes.
    ctx.num_tickets = 0
    _load(ctx, Path(keys))
    return ctx


def client_context(keys: Path) -> ssl.SSLContext:
    """Context for a compute site: TLS 1.3, the server's certificate and host name are checked."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.check_hostname = True
    ctx.verify_mode = ssl.CERT_REQUIRED
    _load(ctx, Path(keys))
    return ctx


def peer_name(sock: ssl.SSLSocket) -> str:
    """The common name (CN) of the peer's verified certificate: a compute site's name, on the server."""
    cert = sock.getpeercert()
    # getpeercert()'s "subject": a tuple of relative distinguished names, each a tuple of (name, value)
    for rdn in cast("tuple[tuple[tuple[str, str], ...], ...]", (cert or {}).get("subject", ())):
        for attr, value in rdn:
            if attr == "commonName":
                return value
    raise ssl.SSLError("the peer presented no verified certificate with a common name")


def _load(ctx: ssl.SSLContext, keys: Path) -> None:
    """Load ca.pem, cert.pem and key.pem from `keys`; any problem is a UsageError naming the file."""
    # imported here: every search rank imports this module, and cryptography takes 30 ms to import
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    prefix = f"--keys {keys}"
    if not keys.is_dir():
        raise UsageError(f"{prefix}: not a directory (make one with `paramedic keys`)")
    ca, cert, key = (keys / "ca.pem", keys / "cert.pem", keys / "key.pem")
    ca_data, cert_data, key_data = (_read(prefix, path) for path in (ca, cert, key))
    try:
        x509.load_pem_x509_certificates(ca_data)
    except ValueError:
        raise UsageError(f"{prefix}: ca.pem is not a PEM certificate") from None
    try:
        x509.load_pem_x509_certificate(cert_data)
    except ValueError:
        raise UsageError(f"{prefix}: cert.pem is not a PEM certificate") from None
    try:
        serialization.load_pem_private_key(key_data, password=None)
    except (ValueError, TypeError):  # TypeError: the key is encrypted
        raise UsageError(f"{prefix}: key.pem is not an unencrypted PEM private key") from None
    try:
        ctx.load_verify_locations(cafile=str(ca))
    except (ssl.SSLError, OSError) as exc:
        raise UsageError(f"{prefix}: ca.pem cannot be used: {_reason(exc)}") from None
    try:
        ctx.load_cert_chain(certfile=str(cert), keyfile=str(key))
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc):
            raise UsageError(f"{prefix}: key.pem does not belong to cert.pem") from None
        raise UsageError(f"{prefix}: cert.pem/key.pem cannot be used: {_reason(exc)}") from None
    except OSError as exc:
        raise UsageError(f"{prefix}: cert.pem/key.pem cannot be read: {_reason(exc)}") from None


def _read(prefix: str, path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise UsageError(f"{prefix}: missing {path.name}") from None
    except OSError as exc:
        raise UsageError(f"{prefix}: cannot read {path.name}: {_reason(exc)}") from None


def _reason(exc: OSError) -> str:
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return str(exc.reason).lower().replace("_", " ")
    return exc.strerror or str(exc)
