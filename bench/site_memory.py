"""Peak memory of `paramedic serve` holding one job whose setup inflates to SIZE MiB (issue 23, item 14).

Usage: python bench/site_memory.py [--mib 500] [--restart]
Formats a 40-sequence replica, starts `paramedic serve` (a real process), opens one blast-metadata job over
TLS whose queries inflate to --mib MiB, and prints the server's VmHWM and VmRSS (from /proc) before and
after; with --restart, kills and restarts the site and measures again (the job is prepared again there).
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from paramedic.db.manifest import load_manifest  # noqa: E402
from paramedic.ship.client import TlsShipper  # noqa: E402
from paramedic.ship.codecs import pack_json  # noqa: E402
from paramedic.ship.transport import SiteAddress  # noqa: E402
from tests.conftest import paramedic, take_fasta  # noqa: E402
from tests.support.site import StorageSite  # noqa: E402


def status(pid: int) -> dict[str, int]:
    """VmHWM and VmRSS of `pid`, in MiB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmHWM", "VmRSS"):
            out[name] = int(value.split()[0]) // 1024
    return out


AMINO = "ACDEFGHIKLMNPQRSTVWY"


def queries(mib: int) -> tuple[int, bytes]:
    """A legal setup that inflates about 32x: each query a random 600-residue motif repeated 33 times."""
    rng = random.Random(23)
    n = mib * 2**20 // (600 * 33)
    return n, pack_json([[f"q{i}", "".join(rng.choices(AMINO, k=600)) * 33] for i in range(n)])


def client_hello() -> bytes:
    """The bytes of a real TLS 1.3 ClientHello (the server then holds a TLS state for the connection)."""
    import ssl

    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ssl.create_default_context().wrap_bio(incoming, outgoing, server_hostname="localhost")
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return outgoing.read()


def flood(site: StorageSite, count: int, idle: dict[str, int]) -> None:
    """Hold `count` silent connections from 8 addresses, then as many that sent a real ClientHello."""
    import socket
    import time

    assert site.proc is not None
    hello = client_hello()
    for label, first in (("silent", b""), ("ClientHello sent", hello)):
        held = []
        for i in range(count):
            sock = socket.create_connection(
                ("127.0.0.1", site.port), source_address=(f"127.0.0.{2 + i % 8}", 0)
            )
            if first:
                sock.sendall(first)
            held.append(sock)
        time.sleep(1.0)
        threads = len(list(Path(f"/proc/{site.proc.pid}/task").iterdir()))
        print(
            f"{count} pending handshakes ({label}): {status(site.proc.pid)} (idle {idle}), {threads} threads"
        )
        for sock in held:
            sock.close()
        time.sleep(0.5)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=500)
    parser.add_argument("--restart", action="store_true")
    parser.add_argument("--flood", type=int, default=0, help="instead: hold this many pending handshakes")
    args = parser.parse_args()
    data = Path.home() / ".cache" / "paramedic" / "data"
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        take_fasta(data / "mmseqs2" / "DB.fasta", base / "db.fasta", 40)
        paramedic("format", "--in", str(base / "db.fasta"), "--dbtype", "prot", "--fragments", "2",
                  "--out", str(base / "db" / "uni"), "--quiet")  # fmt: skip
        paramedic("keys", "--out", str(base / "keys"), "--server", "localhost", "--client", "compute-a")
        (base / "root").mkdir()
        site = StorageSite(base / "db" / "uni", base / "root", base / "keys" / "server", base / "serve.log")
        site.start()
        try:
            assert site.proc is not None
            idle = status(site.proc.pid)
            if args.flood:
                flood(site, args.flood, idle)
                return 0
            n, payload = queries(args.mib)
            checksum = load_manifest(base / "db" / "uni").checksum()
            setup = {
                "out": "m/out.txt", "program": "blastp", "options": ["-outfmt", "6"], "db_arg": "db/uni",
                "manifest_sha256": checksum, "n_queries": n, "pieces": [[0, n]],
            }  # fmt: skip
            shipper = TlsShipper(SiteAddress("tls", "localhost", site.port), base / "keys" / "compute-a",
                                 "blast-metadata", setup, payload, streams=1, timeout=60)  # fmt: skip
            result = "opened"
            try:
                shipper.start()
            except Exception as exc:  # noqa: BLE001 - the refusal is the measurement
                result = f"refused: {exc}"
            finally:
                shipper.close()
            held = status(site.proc.pid)
            print(f"setup {len(payload) / 2**20:.1f} MiB compressed, {args.mib} MiB of queries: {result}")
            print(f"  serve idle: {idle}   after open: {held}")
            if args.restart and result == "opened":
                site.kill9()
                site.start()
                print(f"  after a restart: {status(site.proc.pid)}")
        finally:
            site.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
