"""The conformance harness: paramedic against one BLAST+ run on the unsplit database, cell by cell.

`python -m tests.conformance` runs the whole matrix (`make conformance`) and writes docs/CONFORMANCE.md;
tests/integration/test_conformance.py runs a slice of it in `make test`.
"""
