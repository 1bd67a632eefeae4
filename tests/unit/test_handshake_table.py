"""The pending-handshake table's eviction rule (issue 23, item 13): pure bookkeeping."""

from __future__ import annotations

from paramedic.site.handshakes import HandshakeTable, address_key


def test_a_full_table_evicts_the_oldest_of_the_heaviest_address() -> None:
    table: HandshakeTable[str] = HandshakeTable(max_total=4, max_per_key=10)
    for n in range(3):
        table.add(f"flood{n}", "10.0.0.9", float(n))
    table.add("real", "10.0.0.1", 3.0)
    _, evicted = table.add("new-flood", "10.0.0.9", 4.0)
    assert [e.item for e in evicted] == ["flood0"]
    _, evicted = table.add("real2", "10.0.0.1", 5.0)
    assert [e.item for e in evicted] == ["flood1"]  # 10.0.0.9 still holds the most
    assert table.count("10.0.0.1") == 2 and len(table) == 4


def test_one_address_beyond_its_share_loses_its_own_oldest() -> None:
    table: HandshakeTable[str] = HandshakeTable(max_total=100, max_per_key=2)
    table.add("a", "h", 0.0)
    table.add("b", "h", 1.0)
    entry, evicted = table.add("c", "h", 2.0)
    assert [e.item for e in evicted] == ["a"] and entry.item == "c"


def test_expiry_and_discard_keep_the_counts() -> None:
    table: HandshakeTable[str] = HandshakeTable(max_total=10, max_per_key=10)
    first, _ = table.add("a", "x", 1.0)
    table.add("b", "y", 2.0)
    table.add("c", "y", 3.0)
    assert table.discard(first) and not table.discard(first)
    assert [e.item for e in table.expired(2.5)] == ["b"]
    assert table.next_deadline() == 3.0 and table.heaviest == 1
    assert table.evict_one() is not None and table.evict_one() is None and table.heaviest == 0


def test_ipv6_sources_count_per_64() -> None:
    assert address_key("2001:db8:1:2::5") == address_key("2001:db8:1:2:ffff::1") == "2001:db8:1:2::/64"
    assert address_key("::ffff:10.1.2.3") == "10.1.2.3"
    assert address_key("10.1.2.3") == "10.1.2.3"


def test_when_every_address_holds_one_the_oldest_goes() -> None:
    table: HandshakeTable[str] = HandshakeTable(max_total=3, max_per_key=10)
    for n in range(3):
        table.add(f"c{n}", f"10.0.0.{n}", float(n))
    _, evicted = table.add("newest", "10.0.0.9", 3.0)
    assert [e.item for e in evicted] == ["c0"]
