"""Real TLS 1.3 sockets on 127.0.0.1 between contexts made from `paramedic keys` output."""

from __future__ import annotations

import ipaddress
import socket
import ssl
import stat
import threading
from pathlib import Path

import pytest
from cryptography import x509

from paramedic.errors import OutputError, UsageError
from paramedic.ship.tls import client_context, peer_name, server_context
from paramedic.site import keys as keys_module
from paramedic.site.keys import make_keys

TIMEOUT = 5.0


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pki") / "keys"
    make_keys(out, "localhost", ["compute-a"])
    return out


@pytest.fixture(scope="module")
def other_keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A second, unrelated CA issuing a client with the same name."""
    out = tmp_path_factory.mktemp("pki-other") / "keys"
    make_keys(out, "localhost", ["compute-a"])
    return out


class OneShotServer:
    """Accept one connection with `ctx`, record the peer name, echo one message, and record any error."""

    def __init__(self, ctx: ssl.SSLContext):
        self.ctx = ctx
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(TIMEOUT)
        self.port = self.listener.getsockname()[1]
        self.peer: str | None = None
        self.version: str | None = None
        self.received: bytes | None = None  # stays None unless application data was read
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            conn, _ = self.listener.accept()
            conn.settimeout(TIMEOUT)
            with self.ctx.wrap_socket(conn, server_side=True) as tls:
                self.peer = peer_name(tls)
                self.version = tls.version()
                self.received = tls.recv(1024)
                tls.sendall(self.received)
        except BaseException as exc:  # recorded for the test to assert on
            self.error = exc
        finally:
            self.listener.close()

    def join(self) -> None:
        self.thread.join(TIMEOUT * 2)
        assert not self.thread.is_alive(), "server thread hung"


def talk(ctx: ssl.SSLContext, port: int, hostname: str = "localhost") -> tuple[str | None, bytes]:
    """Connect, send b"ping", return (TLS version, reply); raises on any TLS/socket error."""
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as raw:
        with ctx.wrap_socket(raw, server_hostname=hostname) as tls:
            version = tls.version()
            tls.sendall(b"ping")
            reply = tls.recv(1024)
            if not reply:
                raise ConnectionError("server closed the connection")
            return version, reply


def refused(ctx: ssl.SSLContext, keys: Path, reason: str) -> None:
    """Run a client with `ctx` against the real server; assert the server's handshake failed for `reason`
    and it read no application data (the client sees the failure on handshake or on its first read)."""
    server = OneShotServer(server_context(keys / "server"))
    with pytest.raises((ssl.SSLError, OSError)):
        talk(ctx, server.port)
    server.join()
    assert isinstance(server.error, ssl.SSLError), server.error
    assert reason in str(server.error).lower(), server.error
    assert server.received is None and server.peer is None


def test_authorized_client_round_trip(keys: Path):
    server = OneShotServer(server_context(keys / "server"))
    version, reply = talk(client_context(keys / "compute-a"), server.port)
    server.join()
    assert server.error is None
    assert version == "TLSv1.3" and server.version == "TLSv1.3"
    assert server.peer == "compute-a"
    assert server.received == b"ping" and reply == b"ping"


def test_client_without_certificate_is_refused(keys: Path):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(cafile=str(keys / "compute-a" / "ca.pem"))
    refused(ctx, keys, "peer did not return a certificate")


def test_client_certificate_from_another_ca_is_refused(keys: Path, other_keys: Path):
    # Trusts the real server (so the client side is satisfied) but presents a certificate from another CA.
    ctx = client_context(other_keys / "compute-a")
    ctx.load_verify_locations(cafile=str(keys / "ca" / "ca.pem"))
    refused(ctx, keys, "certificate verify failed")


def test_client_limited_to_tls12_is_refused(keys: Path):
    ctx = client_context(keys / "compute-a")
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    refused(ctx, keys, "unsupported protocol")


def test_client_refuses_server_of_another_ca(keys: Path, other_keys: Path):
    server = OneShotServer(server_context(other_keys / "server"))
    with pytest.raises(ssl.SSLCertVerificationError):
        talk(client_context(keys / "compute-a"), server.port)
    server.join()
    assert server.received is None


def test_client_checks_server_host_name(keys: Path):
    server = OneShotServer(server_context(keys / "server"))
    with pytest.raises(ssl.SSLCertVerificationError):
        talk(client_context(keys / "compute-a"), server.port, hostname="elsewhere.example")
    server.join()
    assert server.received is None


def test_layout_and_key_modes(keys: Path):
    for path in (keys / "ca" / "ca.key", keys / "server" / "key.pem", keys / "compute-a" / "key.pem"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    for site in ("server", "compute-a"):
        assert sorted(p.name for p in (keys / site).iterdir()) == ["ca.pem", "cert.pem", "key.pem"]
        assert (keys / site / "ca.pem").read_bytes() == (keys / "ca" / "ca.pem").read_bytes()
    assert not (keys / "server" / "ca.key").exists() and not (keys / "compute-a" / "ca.key").exists()
    assert [p.name for p in keys.parent.iterdir()] == ["keys"]  # no temporary directory left behind


def test_certificate_contents(keys: Path):
    ca = x509.load_pem_x509_certificate((keys / "ca" / "ca.pem").read_bytes())
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    usage = ca.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.key_cert_sign and usage.crl_sign
    client = x509.load_pem_x509_certificate((keys / "compute-a" / "cert.pem").read_bytes())
    eku = client.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]


def test_server_ip_name_and_local_names(tmp_path: Path):
    make_keys(tmp_path / "k", "10.1.2.3", ["c1"])
    cert = x509.load_pem_x509_certificate((tmp_path / "k" / "server" / "cert.pem").read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    ips = san.get_values_for_type(x509.IPAddress)
    assert ipaddress.ip_address("10.1.2.3") in ips
    assert ipaddress.ip_address("127.0.0.1") in ips and ipaddress.ip_address("::1") in ips
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]


def test_refuses_existing_out(tmp_path: Path):
    out = tmp_path / "keys"
    out.mkdir()
    (out / "mine").write_text("keep")
    with pytest.raises(OutputError, match="already exists"):
        make_keys(out, "localhost", ["a"])
    assert [p.name for p in out.iterdir()] == ["mine"]


@pytest.mark.parametrize(
    "clients",
    [
        [""],
        ["a/b"],
        [".."],
        ["."],
        ["x" * 65],
        ["bad name"],
        ["server"],
        ["ca"],
        ["CA"],
        ["a", "a"],
        ["a", "A"],
        [],
    ],
)
def test_refuses_bad_client_names(tmp_path: Path, clients: list[str]):
    with pytest.raises(UsageError):
        make_keys(tmp_path / "keys", "localhost", clients)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("server", ["", "bad_host", "-x.example", "a..b", "host/x", "1.2.3"])
def test_refuses_bad_server_names(tmp_path: Path, server: str):
    with pytest.raises(UsageError):
        make_keys(tmp_path / "keys", server, ["a"])
    assert list(tmp_path.iterdir()) == []


def test_interrupted_run_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    real_write, calls = keys_module._write, []

    def failing_write(path: Path, data: bytes, mode: int) -> None:
        calls.append(path)
        if len(calls) == 5:
            raise OSError(28, "No space left on device")
        real_write(path, data, mode)

    monkeypatch.setattr(keys_module, "_write", failing_write)
    with pytest.raises(OutputError, match="No space left"):
        make_keys(tmp_path / "keys", "localhost", ["a", "b"])
    assert list(tmp_path.iterdir()) == []


def test_server_context_missing_cert(keys: Path, tmp_path: Path):
    incomplete = tmp_path / "server"
    incomplete.mkdir()
    for name in ("ca.pem", "key.pem"):
        (incomplete / name).write_bytes((keys / "server" / name).read_bytes())
    with pytest.raises(UsageError, match=r"--keys .*: missing cert\.pem"):
        server_context(incomplete)


def test_contexts_report_bad_key_directories(keys: Path, tmp_path: Path):
    with pytest.raises(UsageError, match="not a directory"):
        client_context(tmp_path / "nowhere")
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in ("ca.pem", "cert.pem", "key.pem"):
        (broken / name).write_bytes((keys / "compute-a" / name).read_bytes())
    (broken / "key.pem").write_text("not a key\n")
    with pytest.raises(UsageError, match=r"key\.pem is not"):
        client_context(broken)
    (broken / "key.pem").write_bytes((keys / "server" / "key.pem").read_bytes())
    with pytest.raises(UsageError, match=r"key\.pem does not belong to cert\.pem"):
        client_context(broken)
