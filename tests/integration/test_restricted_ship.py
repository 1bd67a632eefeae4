"""Metadata shipped under a restriction (issue 43, item 4): a real `paramedic serve` with its own replica of
the database in place at another path, real TLS; the compute site resolves -seqidlist, -taxids or
-taxidlist once and ships the subset (per-volume masks, compressed) with the metadata, and the site
regenerates under it, its statistics counted from its own replica: byte for byte one BLAST+ run with the
same restriction, blastp and blastn, one and several volumes.

A restriction changes the statistics, so each case asserts that its restricted report's e-values differ
from the unrestricted run's for the same alignments (a site that regenerated without the subset would
print the unrestricted ones). What the site is sent is hostile until checked: bad subsets are refused in
one line and the site stays up.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import zstandard

from tests.conftest import blast, paramedic
from tests.integration.test_in_place import _writable
from tests.integration.test_restrictions import COLUMNS, genomes, site  # noqa: F401 (fixtures)
from tests.support.site import StorageSite

pytestmark = pytest.mark.integration


@dataclass
class Sites:
    keys: Path
    servers: dict[str, StorageSite]  # "one", "several" (proteins), "dna"
    protein: Path  # test_restrictions' `site`: queries, dbs/one/db, dbs/several/db, lists
    dna: Path  # test_restrictions' `genomes`: queries, dbs/dna


@pytest.fixture(scope="module")
def sites(site: Path, genomes: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sites]:  # noqa: F811
    base = tmp_path_factory.mktemp("restricted-ship")
    paramedic("keys", "--out", str(base / "keys"), "--server", "localhost", "--client", "compute-a")
    sources = {
        "one": (site / "dbs" / "one", "db"),
        "several": (site / "dbs" / "several", "db"),
        "dna": (genomes / "dbs", "dna"),
    }
    servers = {}
    try:
        for name, (source, stem) in sources.items():
            replica = base / "storage" / "replicas" / name  # another path than the compute site's
            shutil.copytree(source, replica)
            _writable(replica)
            (base / f"root-{name}").mkdir()
            servers[name] = StorageSite(
                replica / stem, base / f"root-{name}", base / "keys" / "server", base / f"serve-{name}.log"
            )
            servers[name].start()
        yield Sites(base / "keys", servers, site, genomes)
    finally:
        for server in servers.values():
            server.stop()


def _common(data: Path, db: str, restriction: list[str], program: str, outfmt: str) -> list[str]:
    """e-values up to 10 (blastn: up to 100), so that many hits are marginal and show the statistics."""
    search = ["-evalue", "10"] if program == "blastp" else ["-task", "blastn", "-evalue", "100"]
    return ["-query", str(data / "q.fasta"), "-db", db, *search, "-outfmt", outfmt, *restriction]


def _ship(
    sites: Sites, server: str, data: Path, db: str, restriction: list[str], out: str, *engine: str,
    program: str = "blastp", outfmt: str = COLUMNS, check: bool = True,
) -> subprocess.CompletedProcess[str]:  # fmt: skip
    return paramedic(
        "search", program, *_common(data, db, restriction, program, outfmt), "-out", out,
        "--site", sites.servers[server].url, "--keys", str(sites.keys / "compute-a"), "--ship-timeout", "120",
        "--record", str(data / f"{out}.run.json"), *engine, cwd=data, check=check,
    )  # fmt: skip


def _reference(
    data: Path, db: str, restriction: list[str], program: str = "blastp", outfmt: str = COLUMNS
) -> bytes:
    out = data / f"ref-{abs(hash((db, tuple(restriction), program, outfmt)))}.out"
    if not out.exists():
        blast(program, *_common(data, db, restriction, program, outfmt), "-out", str(out), cwd=data)
    return out.read_bytes()


def _unchanged(restricted: bytes, whole: bytes) -> int:
    """How many of the restricted report's alignments the unrestricted run reports with the same
    e-value (a restriction to a small subset gives most of them smaller ones, or makes them hits at all)."""
    evalues = {}
    for line in whole.decode().splitlines():
        fields = line.split("\t")
        evalues[tuple(fields[:10])] = fields[10]
    return sum(
        evalues.get(tuple(fields[:10])) == fields[10]
        for fields in (line.split("\t") for line in restricted.decode().splitlines())
    )


def _check_record(path: Path, option: str) -> None:
    """The run record names the restriction, the subset resolved once, and for taxids how the installed
    BLAST+ matches them: exactly (2.12, no -no_taxid_expansion) or with descendants (2.15+)."""
    record = json.loads(path.read_text())["restriction"]
    assert record["option"] == option and record["subset"]["sequences"] > 0
    if "taxid" in option:
        help_text = subprocess.run(["blastp", "-help"], capture_output=True, text=True, check=True).stdout
        expands = "-no_taxid_expansion" in help_text
        assert record["taxids_matched"].startswith("with descendants" if expands else "exact"), record
        assert record["blast"].startswith("2.")
    else:
        assert "taxids_matched" not in record


def _restriction(data: Path, kind: str) -> list[str]:
    return {
        "taxids": ["-taxids", (data / "common").read_text()],
        "taxidlist": ["-taxidlist", "taxidlist.txt"],
        "seqidlist": ["-seqidlist", "seqids.txt"],  # with an id the database does not hold
        "one sequence": ["-seqidlist", "one-seqid.txt"],
        "every taxid": ["-taxids", (data / "all").read_text()],
    }[kind]


@pytest.mark.parametrize("db", ["one", "several"])
@pytest.mark.parametrize("kind", ["taxids", "taxidlist", "seqidlist", "one sequence", "every taxid"])
def test_metadata_under_a_restriction_is_regenerated_exactly(sites: Sites, db: str, kind: str) -> None:
    data, restriction = sites.protein, _restriction(sites.protein, kind)
    out = f"{db}-{kind.replace(' ', '-')}.tsv"
    proc = _ship(sites, db, data, f"dbs/{db}/db", restriction, out, "--ship", "metadata",
                 "--strategy", "fragments")  # fmt: skip
    assert "shipped (metadata)" in proc.stderr, proc.stderr
    expected = _reference(data, f"dbs/{db}/db", restriction)
    assert (sites.servers[db].root / out).read_bytes() == expected
    _check_record(data / f"{out}.run.json", restriction[0])
    whole = _reference(data, f"dbs/{db}/db", [])
    lines = expected.decode().splitlines()
    if kind == "every taxid":  # the case: every sequence selected, the whole database's report
        assert expected == whole and len(lines) >= 10
        return
    assert lines and _unchanged(expected, whole) <= len(lines) // 4, "the restriction must change e-values"
    if kind == "one sequence":
        assert len({line.split("\t")[1] for line in lines}) == 1
    else:
        assert len(lines) >= 10, "too few hits to compare statistics"


def test_the_statistics_lines_of_a_pairwise_report(sites: Sites) -> None:
    """-outfmt 0 prints the database's size (the whole database's) and the statistics (the subset's)."""
    data, restriction = sites.protein, _restriction(sites.protein, "taxids")
    _ship(sites, "several", data, "dbs/several/db", restriction, "pairwise.txt", "--ship", "metadata",
          "--strategy", "fragments", outfmt="0")  # fmt: skip
    expected = _reference(data, "dbs/several/db", restriction, outfmt="0")
    assert (sites.servers["several"].root / "pairwise.txt").read_bytes() == expected
    assert expected != _reference(data, "dbs/several/db", [], outfmt="0")


def test_blastn_metadata_under_taxids(sites: Sites) -> None:
    data, restriction = sites.dna, ["-taxids", (sites.dna / "common").read_text()]
    proc = _ship(sites, "dna", data, "dbs/dna", restriction, "dna.tsv", "--ship", "metadata",
                 "--strategy", "fragments", program="blastn")  # fmt: skip
    assert "shipped (metadata)" in proc.stderr, proc.stderr
    expected = _reference(data, "dbs/dna", restriction, "blastn")
    assert (sites.servers["dna"].root / "dna.tsv").read_bytes() == expected
    lines = expected.decode().splitlines()
    assert len(lines) >= 10, "too few hits to compare statistics"
    unchanged = _unchanged(expected, _reference(data, "dbs/dna", [], "blastn"))
    assert unchanged <= len(lines) // 4, "the restriction must change the e-values"


def test_ship_auto_under_a_restriction_weighs_metadata(sites: Sites) -> None:
    """--ship auto chooses as without a restriction (before: always the output, compressed); whatever it
    chooses, the report is BLAST+'s."""
    data, restriction = sites.protein, _restriction(sites.protein, "seqidlist")
    proc = _ship(sites, "several", data, "dbs/several/db", restriction, "auto.tsv", "--ship", "auto",
                 "--strategy", "fragments")  # fmt: skip
    assert "restrict" not in proc.stderr and "instead" not in proc.stderr, proc.stderr
    assert "shipped (" in proc.stderr, proc.stderr
    decision = json.loads((data / "auto.tsv.run.json").read_text())["ship"]["auto_decision"]
    assert decision["reason"].startswith("D - x = ")  # the ParaMEDIC rule decided, its x with the subset
    assert 0 < decision["x_subset_bytes"] <= decision["x_metadata_bytes"]
    expected = _reference(data, "dbs/several/db", restriction)
    assert (sites.servers["several"].root / "auto.tsv").read_bytes() == expected


def test_what_metadata_cannot_carry_ships_the_output(sites: Sites) -> None:
    """--strategy queries (BLAST+ on the whole database: nothing merged) and the negative lists (which
    only BLAST+ searching the whole database applies) make no metadata: --ship metadata is refused in
    one line, --ship auto ships the output compressed, BLAST+'s bytes."""
    data = sites.protein
    cases = {
        "queries": (_restriction(data, "taxids"), ["--strategy", "queries"]),
        "negative": (["-negative_taxids", (data / "common").read_text()], []),
    }
    for name, (restriction, engine) in cases.items():
        proc = _ship(sites, "several", data, "dbs/several/db", restriction, f"{name}-m.tsv", "--ship",
                     "metadata", *engine, check=False)  # fmt: skip
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        proc = _ship(sites, "several", data, "dbs/several/db", restriction, f"{name}.tsv", "--ship", "auto",
                     *engine)  # fmt: skip
        assert "shipped (compressed)" in proc.stderr, proc.stderr
        expected = _reference(data, "dbs/several/db", restriction)
        assert (sites.servers["several"].root / f"{name}.tsv").read_bytes() == expected
        assert expected != _reference(data, "dbs/several/db", [])


def _setup(sites: Sites, restriction: list[str]):
    """A valid setup of a blastp job on `several` under `restriction`, as the compute site makes it:
    the header, the subset and the rest (the queries)."""
    from paramedic.blast.options import BlastOptions
    from paramedic.db.locate import resolve_database
    from paramedic.db.subset import resolve_subset
    from paramedic.ship.blast_codec import BlastJobSetup

    data = sites.protein
    db, manifest = resolve_database(str(data / "dbs" / "several" / "db"), data, dbtype="prot")
    options = BlastOptions.parse("blastp", ["-outfmt", "6", *restriction])
    subset = resolve_subset(db, options, data)
    queries = [("q1", "MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQAPILSRVGDGTQDNLSGAEKAVQVKVKALPDAQ")]
    setup = BlastJobSetup("blastp", options.argv(), "dbs/several/db", manifest.checksum(), (range(0, 1),),
                          queries, subset)  # fmt: skip
    return setup, db


def _refused(sites: Sites, header: dict, payload: bytes, out: str) -> str:
    """The site's refusal of a job opened with this setup (one line), the site still up."""
    from paramedic.ship.client import SiteAddress, TlsShipper
    from paramedic.ship.transport import SiteError

    server = sites.servers["several"]
    shipper = TlsShipper(
        SiteAddress("tls", "localhost", server.port), sites.keys / "compute-a", "blast-metadata",
        {**header, "out": out}, payload, streams=1, timeout=20.0,
    )  # fmt: skip
    try:
        with pytest.raises(SiteError) as refused:
            shipper.start()
    finally:
        shipper.close()
    assert server.alive()
    message = str(refused.value)
    assert "\n" not in message
    return message


def test_bad_subsets_are_refused_in_one_line_and_the_site_stays_up(sites: Sites) -> None:
    setup, db = _setup(sites, ["-seqidlist", str(sites.protein / "seqids.txt")])
    header, payload = setup.encode()
    assert header["subset"]["nseq"] > 1
    size = header["subset"]["bytes"]
    masks, rest = payload[:size], payload[size:]
    raw = b"".join(setup.subset.bits)

    def with_masks(blob: bytes, **fields: int) -> tuple[dict, bytes]:
        return {**header, "subset": {**header["subset"], "bytes": len(blob), **fields}}, blob + rest

    def compressed(data: bytes, content_size: bool = True) -> bytes:
        return zstandard.ZstdCompressor(write_content_size=content_size).compress(data)

    past_the_end = bytearray(raw)
    first = setup.subset.bits[0]
    count = db.spans[0][2]
    assert count % 8, "the first volume's last byte must have padding bits"
    past_the_end[len(first) - 1] |= 1  # the last padding bit of the first volume
    sneaky = replace(setup.subset, nseq=setup.subset.nseq + 1, length=setup.subset.length + 100)
    empty = bytes(len(raw))
    cases = {
        "statistics": (with_masks(masks, nseq=sneaky.nseq), "are not the replica's"),
        "letters": (with_masks(masks, length=sneaky.length), "are not the replica's"),
        "past the end": (with_masks(compressed(bytes(past_the_end))), "past its"),
        "bomb": (with_masks(compressed(bytes(64 * 2**20))), "declares 67108864 bytes of masks"),
        "no size": (with_masks(compressed(raw, content_size=False)), "declares"),
        "short": (with_masks(compressed(raw[:-1])), "declares"),
        "not zstd": (with_masks(b"\0" * 40), "not a zstd frame"),
        "trailing": (with_masks(masks + compressed(b"x")), "one whole frame"),
        "empty": (with_masks(compressed(empty), nseq=0, length=0, shortest=0, longest=0), "no sequence"),
        "too large": (with_masks(masks, bytes=2**30), "bytes"),
        "beyond payload": (
            ({**header, "subset": {**header["subset"], "bytes": len(payload)}}, payload),
            "larger",
        ),
        "no subset": (
            ({k: v for k, v in header.items() if k != "subset"}, rest),
            "without its resolved subset",
        ),
        "subset alone": (({**header, "options": ["-outfmt", "6"]}, payload), "a subset without -seqidlist"),
        "negative": (
            ({**header, "options": ["-outfmt", "6", "-negative_taxids", "9606"]}, payload),
            "-negative_taxids",
        ),
        "not an object": (({**header, "subset": [1, 2]}, payload), "not an object"),
    }
    server = sites.servers["several"]
    start = len(server.log())
    for name, ((bad_header, bad_payload), says) in cases.items():
        message = _refused(sites, bad_header, bad_payload, f"bad/{name.replace(' ', '-')}.tsv")
        assert says in message, f"{name}: {message}"
        server.wait_log(r"refused request 'open': .*" + re.escape(says), start=start)
    log = server.log()[start:]
    assert "internal error" not in log and "Traceback" not in log, log
    assert not list((server.root / "bad").glob("*")) if (server.root / "bad").exists() else True
    # the site still regenerates a good restricted job
    data, restriction = sites.protein, _restriction(sites.protein, "seqidlist")
    _ship(sites, "several", data, "dbs/several/db", restriction, "after.tsv", "--ship", "metadata",
          "--strategy", "fragments")  # fmt: skip
    assert (sites.servers["several"].root / "after.tsv").read_bytes() == _reference(
        data, "dbs/several/db", restriction
    )


def test_a_site_keeps_the_masks_in_a_private_file(sites: Sites, tmp_path: Path) -> None:
    """The masks a job keeps are a file of the site's own, mapped (nr's are 90 MB a job), and read back as
    the compute site's subset."""
    import stat

    from paramedic.db.locate import resolve_database
    from paramedic.ship.subset_wire import decode_subset

    setup, _ = _setup(sites, ["-taxids", (sites.protein / "common").read_text()])
    header, payload = setup.encode()
    replica = sites.servers["several"].replica
    assert replica is not None
    db, _ = resolve_database(str(replica), tmp_path, dbtype="prot")
    subset, rest = decode_subset(header["subset"], payload, db, tmp_path / "masks")
    assert subset == setup.subset and len(rest) == len(payload) - header["subset"]["bytes"]
    assert stat.S_IMODE((tmp_path / "masks").stat().st_mode) == 0o600
    assert all(isinstance(bits, memoryview) for bits in subset.bits)


def test_mutated_subsets_are_refused_or_exact(sites: Sites, tmp_path: Path) -> None:
    """A few hundred random mutations of a valid subset (bit flips, truncation, bytes appended, header
    numbers changed, zstd frames that inflate to other bytes of the declared size): each is refused with a
    ProtocolError, or decodes to a subset of the replica whose statistics are the ones the header says."""
    import random

    from paramedic.db.locate import resolve_database
    from paramedic.ship.subset_wire import decode_subset
    from paramedic.ship.wire import ProtocolError

    setup, _ = _setup(sites, ["-taxids", (sites.protein / "common").read_text()])
    header, payload = setup.encode()
    fields = header["subset"]
    masks, rest = payload[: fields["bytes"]], payload[fields["bytes"] :]
    replica = sites.servers["several"].replica
    assert replica is not None
    db, _ = resolve_database(str(replica), tmp_path, dbtype="prot")
    raw = bytearray(b"".join(setup.subset.bits))
    rng = random.Random(43)
    refused = accepted = 0
    for _ in range(400):
        kind = rng.randrange(5)
        blob, numbers = bytearray(masks), dict(fields)
        if kind == 0:
            for _ in range(rng.randint(1, 4)):
                blob[rng.randrange(len(blob))] ^= 1 << rng.randrange(8)
        elif kind == 1:
            del blob[rng.randrange(len(blob)) :]
        elif kind == 2:
            blob += bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        elif kind == 3:
            name = rng.choice(list(numbers))
            numbers[name] = rng.choice([-1, 0, 1, numbers[name] + 1, 2**63, "7", None, 1.5, True])
        else:
            other = bytearray(raw)
            for _ in range(rng.randint(1, 8)):
                other[rng.randrange(len(other))] ^= 1 << rng.randrange(8)
            blob = bytearray(zstandard.ZstdCompressor().compress(bytes(other)))
        numbers = {**numbers, "bytes": len(blob)} if kind != 3 else numbers
        try:
            subset, left = decode_subset(numbers, bytes(blob) + rest, db)
        except ProtocolError as exc:
            assert "\n" not in str(exc)
            refused += 1
            continue
        accepted += 1
        assert left == rest
        assert [subset.nseq, subset.length, subset.shortest, subset.longest] == [
            numbers[name] for name in ("nseq", "length", "shortest", "longest")
        ]
    assert refused >= 300, (refused, accepted)


@pytest.mark.parametrize("engine", ["one master", "partitions"])
def test_a_shared_directory_inbox_regenerates_under_the_subset(
    sites: Sites, tmp_path: Path, engine: str
) -> None:
    """The same subset through `--site file://` (the setup's payload a file in the inbox): --ship metadata,
    and --ship auto (no link to weigh: metadata) run by partition masters (each partition's pieces
    regenerated under the one subset)."""
    replica = sites.servers["several"].replica
    assert replica is not None
    inbox, root = tmp_path / "inbox", tmp_path / "root"
    root.mkdir()
    server = StorageSite(replica, root, None, tmp_path / "serve.log", 1, inbox=inbox)
    server.start()
    try:
        data, restriction = sites.protein, _restriction(sites.protein, "taxidlist")
        extra = ["--ship", "metadata"]
        if engine == "partitions":
            extra = ["--ship", "auto", "--np", "4", "--partition-size", "2", "--batch", "4"]
        record = tmp_path / "record.json"
        paramedic(
            "search", "blastp", *_common(data, "dbs/several/db", restriction, "blastp", COLUMNS),
            "-out", "inbox.tsv", "--site", f"file://{inbox}", "--strategy", "fragments", "--ship-timeout",
            "120", "--record", str(record), *extra, cwd=data,
        )  # fmt: skip
        expected = _reference(data, "dbs/several/db", restriction)
        assert (root / "inbox.tsv").read_bytes() == expected
        lines = expected.decode().splitlines()
        assert (
            len(lines) >= 10
            and _unchanged(expected, _reference(data, "dbs/several/db", [])) <= len(lines) // 4
        )
        shipped = json.loads(record.read_text())
        assert shipped["ship"]["mode"] == "metadata"
        assert shipped["partitions"] == (2 if engine == "partitions" else 1)
    finally:
        server.stop()
