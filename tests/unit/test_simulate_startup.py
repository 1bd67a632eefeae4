"""The predictor's start-up on a database described by its size (paramedic.engine.predict.startup): a first job's
verification is in the wall and grows with the bytes, a second job's start does not, a rank's first use of
a volume and --stage's copies are charged once where the model says, NCBI's databases are known by name,
and bad values are one line and exit 2."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from paramedic.cli import main
from paramedic.engine.predict.simulate import SimulateSettings, predict
from paramedic.engine.predict.startup import (
    DATABASES,
    FILES_PER_VOLUME,
    SHARED_FILES,
    DatabaseShape,
    StartupRates,
    parse_bytes,
    profile,
)
from paramedic.errors import UsageError
from tests.unit.test_simulate import made_up, model

RATES = StartupRates(
    rank0_fixed=0.5, rank0_per_volume=0.01, digest_rate=1e9, open_seconds=0.0, copy_rate=1e8,
    stage_digest_rate=1e9,
)  # fmt: skip


def shape(size: float, volumes: int = 2, residues: int = 20_000) -> DatabaseShape:
    """The made-up pilot's database (2 fragments of 10,000 residues) with `size` bytes of files."""
    return DatabaseShape.of("db", "prot", int(size), volumes, residues)


def run(path: Path, database: DatabaseShape | None, workers: int = 4, **kw: object):
    settings = SimulateSettings(
        record=path, queries=40, workers=workers, message_seconds=0.0, latency_seconds=0.0,
        database=database, rates=kw.pop("rates", RATES), **kw,
    )  # type: ignore[arg-type]  # fmt: skip
    return predict(model(path), settings)


def test_a_first_job_waits_for_rank0_to_digest_every_byte(tmp_path: Path) -> None:
    """The same searches (same letters, same fragments), with and without the start: the wall differs by
    rank 0's start exactly, and that start is the resolution plus every byte at the digest rate."""
    path = made_up(tmp_path)
    plain = run(path, None)
    # the pilot's 2 (in place, 2 volumes are cut in 4); every rank on one node: rank 0's node digests all
    first = run(path, shape(30e9), fragments=2, node_ranks=5)
    assert first.work_seconds == pytest.approx(plain.work_seconds)
    assert first.startup is not None and first.startup.verify_bytes == 30e9
    start = 0.5 + 0.01 * 2 + 30e9 / 1e9
    assert first.startup.rank0_seconds == pytest.approx(start)
    assert first.wall_seconds == pytest.approx(plain.wall_seconds + start)
    where = first.where()
    assert where["start: verification"]["rank_seconds"] == pytest.approx(5 * 30.0)
    assert sum(v["share"] for v in where.values()) == pytest.approx(1.0, abs=1e-3)


def test_verification_grows_with_bytes_and_a_second_job_does_not(tmp_path: Path) -> None:
    path = made_up(tmp_path)
    walls = {size: run(path, shape(size), node_ranks=5).wall_seconds for size in (1e9, 10e9, 100e9)}
    assert walls[10e9] - walls[1e9] == pytest.approx(9.0)  # 9 GB more at 1 GB/s
    assert walls[100e9] - walls[10e9] == pytest.approx(90.0)
    second = {size: run(path, shape(size), first_job=False) for size in (1e9, 100e9, 10e12)}
    assert len({round(p.wall_seconds, 9) for p in second.values()}) == 1
    for p in second.values():
        assert p.startup is not None and p.startup.verify_seconds == 0 and p.startup.verify_bytes == 0
        assert p.startup.rank0_seconds == pytest.approx(0.5 + 0.01 * 2)
        assert p.wall_seconds < walls[1e9]


def test_a_first_jobs_digest_is_shared_by_the_nodes(tmp_path: Path) -> None:
    """A share per node, the largest files first to the least loaded (paramedic.db.spread): the job waits
    for the largest share."""
    path = made_up(tmp_path)
    db = shape(40e9, volumes=8)
    runs = {node_ranks: run(path, db, workers=7, node_ranks=node_ranks) for node_ranks in (8, 4, 1)}
    seconds = {n: p.startup.verify_seconds for n, p in runs.items() if p.startup is not None}
    assert seconds == pytest.approx({8: 40.0, 4: 20.0, 1: 5.0})  # 1, 2 and 8 nodes
    assert runs[8].wall_seconds - runs[4].wall_seconds == pytest.approx(20.0)
    odd = run(path, shape(30e9, volumes=3), workers=7, node_ranks=4)  # 3 volumes, 2 nodes: 2 on one
    assert odd.startup is not None and odd.startup.verify_seconds == pytest.approx(20.0)
    assert odd.startup.report()["verify_nodes"] == 2


def test_a_second_jobs_start_grows_with_volumes_only(tmp_path: Path) -> None:
    path = made_up(tmp_path)
    starts = [run(path, shape(1e9, v), first_job=False).startup for v in (2, 20, 200)]
    assert [s.rank0_seconds for s in starts if s] == pytest.approx([0.52, 0.7, 2.5])


def test_each_rank_opens_a_volume_once(tmp_path: Path) -> None:
    """Opens: a volume's files the first time a rank searches it, the database's shared files once a rank;
    report pieces read every volume (a mask over the whole database)."""
    path = made_up(tmp_path)
    rates = dataclasses.replace(RATES, open_seconds=1.0)
    p = run(path, shape(1e9), workers=3, rates=rates)
    assert p.startup is not None
    opened = p.startup.opened
    ranks = {rank for rank, _ in opened}
    assert ranks <= {1, 2, 3} and len(opened) == len(set(opened))
    assert p.startup.open_seconds == pytest.approx(len(opened) * FILES_PER_VOLUME + len(ranks) * SHARED_FILES)
    free = run(path, shape(1e9), workers=3)
    assert p.wall_seconds > free.wall_seconds


def test_stage_copies_a_volume_once_a_node_then_only_digests(tmp_path: Path) -> None:
    path = made_up(tmp_path)
    first = run(path, shape(4e9), workers=7, stage=True, node_ranks=4)  # ranks 0-3, 4-7: two nodes
    assert first.startup is not None
    copied = first.startup.copied
    assert len(copied) == len(set(copied)) and {node for node, _ in copied} <= {0, 1}
    assert first.startup.copy_bytes == len(copied) * 2e9  # two volumes of 2 GB each
    assert first.startup.copy_seconds == pytest.approx(len(copied) * (2e9 / 1e8 + 2e9 / 1e9))
    second = run(path, shape(4e9), workers=7, stage=True, node_ranks=4, first_job=False)
    assert second.startup is not None
    assert second.startup.copy_bytes == 0 and second.startup.stage_digest_bytes > 0
    assert second.startup.stage_digest_bytes == 2e9 * len(second.startup.used_copies)
    assert second.startup.used_copies <= second.startup.opened
    unstaged = run(path, shape(4e9), workers=7, first_job=False)
    assert unstaged.wall_seconds < second.wall_seconds < first.wall_seconds


def test_ncbi_databases_by_name() -> None:
    nr, nt = profile("nr"), profile("nt")
    assert (nr.dbtype, nr.bytes, nr.volumes) == ("prot", 364 * 10**9, 176)
    assert (nt.dbtype, nt.volumes) == ("nucl", 383) and nt.bytes == pytest.approx(1.07 * 2**40, rel=1e-9)
    assert set(DATABASES) >= {"nr", "nt", "core_nt"}
    assert nr.residues > 0 and "estimated" in nr.note
    assert profile("nr", residues=123_456_789).residues == 123_456_789
    assert parse_bytes("364G") == 364 * 10**9 and parse_bytes("1.07TiB") == round(1.07 * 2**40)
    assert parse_bytes("500MB") == 500 * 10**6 and parse_bytes("4096") == 4096
    for bad in ("", "lots", "-3G", "0", "1.5X"):
        with pytest.raises(UsageError):
            parse_bytes(bad)
    nr_shape = profile("nr")
    assert nr_shape.fragments() == 176 and profile("swissprot").fragments() == 4  # as fragment_ranges cuts
    assert [shape(1e9, v).fragments() for v in (1, 2, 3, 4, 5)] == [4, 4, 3, 4, 5]
    fragments = [nr_shape.volumes_of(f, 176) for f in range(176)]
    assert fragments == [range(v, v + 1) for v in range(176)]
    assert nr_shape.volumes_of(0, 4) == range(0, 44) and nr_shape.volumes_of(3, 4) == range(132, 176)


def test_the_prediction_names_its_start(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = made_up(tmp_path)
    argv = ["simulate", "--record", str(path), "--queries", "40", "--workers", "7"]
    one_node = ["--node-ranks", "8", "--json"]
    assert main([*argv, "--db-bytes", "30G", "--db-volumes", "2", "--db-residues", "20000", *one_node]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["startup"]["rank0_verify_bytes"] == 30 * 10**9 and out["startup"]["job"] == "first"
    assert out["startup"]["rank0_verify_seconds"] == pytest.approx(30e9 / 2.1e9, rel=1e-3)
    assert set(out["where"]) >= {"start: verification", "search", "merge", "output", "idle"}
    assert main([*argv, "--database-profile", "nr", "--second-job", "--stage", "--node-ranks", "4"]) == 0
    text = capsys.readouterr().out
    assert "second job on nr" in text and "where the time goes" in text
    assert main(argv) == 0
    assert "start-up" not in capsys.readouterr().out  # no database described: as before


def _one_line(capsys: pytest.CaptureFixture[str], argv: list[str], words: str) -> None:
    assert main(["simulate", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err and "Traceback" not in err, err


def test_bad_database_descriptions_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = made_up(tmp_path)
    base = ["--record", str(path), "--queries", "10", "--workers", "2"]
    _one_line(capsys, [*base, "--db-bytes", "lots", "--db-volumes", "3"], "--db-bytes 'lots'")
    _one_line(capsys, [*base, "--db-bytes", "364G"], "go together")
    _one_line(capsys, [*base, "--db-volumes", "3"], "go together")
    _one_line(capsys, [*base, "--db-bytes", "364G", "--db-volumes", "0"], "--db-volumes")
    _one_line(capsys, [*base, "--db-residues", "5"], "--db-residues")
    _one_line(capsys, [*base, "--database-profile", "nr", "--db-bytes", "1G", "--db-volumes", "1"], "one of")
    _one_line(capsys, [*base, "--database-profile", "nr", "--database-scale", "2"], "--database-scale")
    _one_line(capsys, [*base, "--database-profile", "refseq"], "invalid choice")
    _one_line(capsys, [*base, "--database-profile", "nt"], "nucleotide database")
    _one_line(capsys, [*base, "--stage"], "--stage needs")
    _one_line(capsys, [*base, "--database-profile", "nr", "--digest-rate", "0"], "--digest-rate")
    _one_line(capsys, [*base, "--database-profile", "nr", "--copy-rate", "fast"], "--copy-rate")
    _one_line(capsys, [*base, "--database-profile", "nr", "--node-ranks", "0"], "--node-ranks")


def test_report_pieces_read_the_database_in_place_even_with_stage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only fragment searches use staged copies (as the engine stages fragments only): a report piece,
    which reads a mask over every volume, opens their files but neither copies nor digests a volume."""
    from paramedic.engine.predict.startup import Startup

    calls: list[tuple[int, range, bool]] = []
    original = Startup.first_use

    def spy(self: Startup, rank: int, volumes: range, start: float, staged: bool = True) -> float:
        calls.append((rank, volumes, staged))
        return original(self, rank, volumes, start, staged)

    monkeypatch.setattr(Startup, "first_use", spy)
    path = made_up(tmp_path)
    p = run(path, shape(40e9, volumes=8, residues=80_000), workers=6, stage=True, node_ranks=2, fragments=8)
    assert p.startup is not None
    pieces = [c for c in calls if not c[2]]
    assert pieces and all(volumes == range(8) for _, volumes, _ in pieces)
    searched = {(rank, v) for rank, volumes, staged in calls if staged for v in volumes}
    assert p.startup.used_copies == searched
    per_volume = 5e9 / 1e8 + 5e9 / 1e9  # a 5 GB volume's copy at 0.1 GB/s and its digest at 1 GB/s
    assert p.startup.copy_seconds == pytest.approx(len(p.startup.copied) * per_volume)
    assert p.startup.copy_seconds < len(searched) * per_volume + 1


def test_faster_cores_divide_the_pilots_blast_seconds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = made_up(tmp_path)
    one, two = run(path, shape(1e9)), run(path, shape(1e9), core_speed=2.0)
    assert two.work_seconds == pytest.approx(one.work_seconds / 2)
    assert two.startup is not None and one.startup is not None
    assert two.startup.rank0_seconds == one.startup.rank0_seconds  # the disk is not the cores
    base = ["--record", str(path), "--queries", "10", "--workers", "2"]
    _one_line(capsys, [*base, "--core-speed", "0"], "--core-speed")
    _one_line(capsys, [*base, "--core-speed", "nan"], "--core-speed")
