"""Signed files for the shared-directory inbox: who wrote a file, and that nobody changed it since.

Over TLS the handshake authenticates both ends. A shared directory has no handshake: anyone who can write
it could forge a compute site's job or the storage site's replies. With keys (`paramedic keys`, the same
directories as for TLS) every file that says something is an envelope

    {"body": "<JSON text>", "sig": "<base64 ECDSA-SHA256 signature of the body>", "cert": "<PEM>"}

whose certificate must be issued by the keys' CA, valid now, and meant for its role: a compute site's
(client authentication) for jobs, the storage site's (server authentication) for replies. The body names
its job, its kind and (for chunks and acknowledgements) its index, so a signed file cannot be replayed
under another name or for another job. Payloads (setup.bin, chunk-N.bin) are bound by their SHA-256 in a
signed body.
"""

from __future__ import annotations

import base64
import datetime
import json
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from paramedic.errors import UsageError
from paramedic.ship.wire import ProtocolError, loads_json

MAX_CERT_CHARS = 8192
# What cryptography raises for a malformed certificate besides ValueError (none of them is a ValueError).
_BAD_CERTIFICATE = (x509.InvalidVersion, x509.DuplicateExtension, x509.UnsupportedGeneralNameType)
CLIENT = ExtendedKeyUsageOID.CLIENT_AUTH
SERVER = ExtendedKeyUsageOID.SERVER_AUTH


class Signer:
    """Signs bodies with the key in a `paramedic keys` directory; verifies envelopes against its CA."""

    def __init__(self, keys: Path):
        try:
            self.ca = x509.load_pem_x509_certificate((keys / "ca.pem").read_bytes())
            self.cert_pem = (keys / "cert.pem").read_text()
            key = serialization.load_pem_private_key((keys / "key.pem").read_bytes(), password=None)
        except (OSError, ValueError, TypeError) as exc:
            raise UsageError(f"--keys {keys}: cannot load the keys for signing: {exc}") from None
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise UsageError(f"--keys {keys}: key.pem is not an EC key (make keys with `paramedic keys`)")
        self.key = key

    def envelope(self, body: dict[str, Any]) -> bytes:
        text = json.dumps(body, separators=(",", ":"), sort_keys=True)
        signature = self.key.sign(text.encode(), ec.ECDSA(hashes.SHA256()))
        return json.dumps(
            {"body": text, "sig": base64.b64encode(signature).decode(), "cert": self.cert_pem}
        ).encode()

    def open_envelope(
        self, data: bytes, role: x509.ObjectIdentifier, what: str
    ) -> tuple[dict[str, Any], str]:
        """The body of a signed file and its signer's name (CN); ProtocolError for anything else."""
        outer = loads_json(data, what)
        if not isinstance(outer, dict) or not all(
            isinstance(outer.get(k), str) for k in ("body", "sig", "cert")
        ):
            raise ProtocolError(
                f"{what}: not a signed file (an unsigned job or reply where keys are in use?)"
            )
        if len(outer["cert"]) > MAX_CERT_CHARS:
            raise ProtocolError(f"{what}: certificate too large")
        try:
            cert = x509.load_pem_x509_certificate(outer["cert"].encode())
            cert.verify_directly_issued_by(self.ca)
        except (ValueError, TypeError, InvalidSignature, *_BAD_CERTIFICATE):
            raise ProtocolError(f"{what}: signed with a certificate not issued by this site's CA") from None
        now = datetime.datetime.now(datetime.UTC)
        if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
            raise ProtocolError(f"{what}: the signer's certificate has expired or is not yet valid")
        usages: x509.ExtendedKeyUsage | list[x509.ObjectIdentifier]
        try:
            usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        except x509.ExtensionNotFound:
            usages = []
        except (ValueError, *_BAD_CERTIFICATE):
            raise ProtocolError(f"{what}: the signer's certificate is malformed") from None
        if role not in usages:
            who = "a compute site" if role == CLIENT else "the storage site"
            raise ProtocolError(f"{what}: not signed by {who}")
        public = cert.public_key()
        if not isinstance(public, ec.EllipticCurvePublicKey):
            raise ProtocolError(f"{what}: unsupported key type")
        try:
            public.verify(
                base64.b64decode(outer["sig"], validate=True),
                outer["body"].encode(),
                ec.ECDSA(hashes.SHA256()),
            )
        except (InvalidSignature, ValueError):
            raise ProtocolError(f"{what}: bad signature") from None
        body = loads_json(outer["body"], what)
        if not isinstance(body, dict):
            raise ProtocolError(f"{what}: the signed body is not an object")
        names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        if not names:
            raise ProtocolError(f"{what}: the signer's certificate has no name")
        return body, str(names[0].value)
