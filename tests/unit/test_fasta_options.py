import gzip

import pytest

from paramedic.blast.alias import oid_mask
from paramedic.blast.options import BlastOptions
from paramedic.cli import split_engine_options
from paramedic.db.fasta import read_fasta
from paramedic.errors import InputError, UsageError


def write(tmp_path, text, name="x.fa"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_headers_kept_exactly_and_gzip_read(tmp_path):
    p = tmp_path / "x.fa.gz"
    p.write_bytes(gzip.compress(b">sp|P1|X desc with trailing blank \nMKV\nLLA\n>q2\nACDE\n"))
    records = list(read_fasta(p, "prot"))
    assert records[0].header == "sp|P1|X desc with trailing blank "
    assert records[0].sequence == "MKVLLA" and records[1].seq_id == "q2"


@pytest.mark.parametrize(
    "text,moltype,message",
    [
        ("", "prot", "empty FASTA"),
        ("hello\n>a\nMKV\n", "prot", "text before the first"),
        (">a\n\n>b\nMKV\n", "prot", "empty sequence"),
        ("> \nMKV\n", "prot", "empty sequence id"),
        (">a\nMKVLLEEPQWRT\n", "nucl", "looks like protein"),
        (">a\nACGTACGTACGTACGTACGTACGT\n", "prot", "looks like nucleotide"),
        (">a\nMK1V\n", "prot", "are not protein"),
    ],
)
def test_bad_fasta_is_a_clear_input_error(tmp_path, text, moltype, message):
    with pytest.raises(InputError, match=message):
        list(read_fasta(write(tmp_path, text), moltype))


def test_a_protein_of_nucleotide_letters_is_said_once_when_a_warning_is_asked_for(tmp_path):
    said = []
    text = ">a\nACGTACGTACGTACGTACGTACGT\n>b\nNNNNNNNNNNNNNNNNNNNNNNNN\n"
    records = list(read_fasta(write(tmp_path, text), "prot", said.append, "blastp"))
    assert [r.seq_id for r in records] == ["a", "b"]
    assert len(said) == 1 and "looks like nucleotide" in said[0] and "as blastp accepts it" in said[0]


def test_missing_file(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        list(read_fasta(tmp_path / "nope.fa", "prot"))


def test_oid_mask_layout():
    mask = oid_mask([0, 9], 10)
    assert mask == bytes([0, 0, 0, 10, 0b10000000, 0b01000000])
    with pytest.raises(ValueError):
        oid_mask([10], 10)


def test_engine_and_blast_options_split():
    engine, blast = split_engine_options(["-evalue", "1e-5", "--np", "4", "-outfmt", "6 std", "--quiet"])
    assert engine == ["--np", "4", "--quiet"]
    assert blast == ["-evalue", "1e-5", "-outfmt", "6 std"]
    # which options take a value comes from the search parser (declared once): every one of them
    from paramedic.cli.search_options import search_parser

    valued = [a.option_strings[-1] for a in search_parser()._actions if a.nargs != 0 and a.option_strings]
    assert {"--np", "--mirror", "--report", "--stage-limit", "--output-strategy"} <= set(valued)
    for option in valued:
        assert split_engine_options([option, "-x", "-evalue", "1"]) == ([option, "-x"], ["-evalue", "1"])


def test_blast_options_parsed_with_blasts_own_rules():
    opts = BlastOptions.parse("blastp", ["-query", "q", "-db", "d", "-outfmt", "6 std staxid", "-ungapped"])
    assert opts.outfmt_number() == 6 and opts.get("ungapped") is None and opts.has("ungapped")
    assert opts.hitlist_size() == 500
    assert BlastOptions.parse("blastp", ["-num_alignments", "900"]).hitlist_size() == 900
    with pytest.raises(UsageError, match="unknown blastp option -bogus"):
        BlastOptions.parse("blastp", ["-bogus", "1"])
    with pytest.raises(UsageError, match="needs a value"):
        BlastOptions.parse("blastp", ["-evalue"])
    with pytest.raises(UsageError, match="not supported"):
        BlastOptions.parse("blastp", ["-remote"])


def test_blast_help_is_cached_per_executable_and_a_bad_cache_entry_is_replaced(tmp_path, monkeypatch):
    from paramedic.blast.options import known_options
    from paramedic.blast.tools import require_tool
    from paramedic.cache import cache_dir, file_key

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    entry = cache_dir("blast-help") / f"blastp-{file_key(require_tool('blastp'))}.help"
    fresh = known_options.__wrapped__("blastp")
    assert fresh["evalue"] is True and fresh["ungapped"] is False
    assert entry.is_file() and b" -evalue <Real>" in entry.read_bytes()
    entry.write_text(" -db <String>\n -query <File_In>\n -my_option <Real>\n")  # read back, not re-run
    assert known_options.__wrapped__("blastp") == {"db": True, "query": True, "my_option": True}
    entry.write_text("garbage")  # not a help text: -help runs again and the entry is replaced
    assert known_options.__wrapped__("blastp") == fresh
    assert b" -evalue <Real>" in entry.read_bytes()


@pytest.mark.parametrize(
    ("argv", "checked"),
    [
        (["-query", "q", "-db", "d", "-out", "o", "-outfmt", "6"], False),
        (["-query", "q", "-db", "d"], False),
        (["-query", "q", "-db", "d", "-outfmt", "6 qseqid sseqid bogus"], True),  # fields: BLAST+ checks them
        (["-query", "q", "-db", "d", "-evalue", "abc"], True),
        (["-query", "q", "-db", "d", "-ungapped"], True),
    ],
)
def test_blast_checks_the_values_only_when_there_are_some(argv, checked):
    from paramedic.blast.options import _values_to_check

    assert _values_to_check(BlastOptions.parse("blastp", argv)) is checked


@pytest.mark.parametrize(("rank", "said"), [(None, True), ("0", True), ("3", False)])
def test_a_refusal_every_rank_finds_is_said_by_rank_0_alone(monkeypatch, capsys, rank, said):
    from paramedic.cli import main

    for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        monkeypatch.delenv(name, raising=False)
    if rank is not None:
        monkeypatch.setenv("PMI_RANK", rank)
    assert main(["search", "blastp", "--strategy", "bogus"]) == 2
    assert ("paramedic: error:" in capsys.readouterr().err) is said
