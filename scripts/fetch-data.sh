#!/usr/bin/env bash
# Fetch the real sequence sets from Debian packages into a cache outside git.
#   mmseqs2-examples: 20,000 UniProt proteins (DB.fasta) + 500 queries (QUERY.fasta), for blastp
#   ragout-examples:  bacterial genomes and contigs, for blastn
# Idempotent: does nothing when the cache is complete. No root needed (apt-get download + dpkg -x).
set -euo pipefail
DATA="${PARAMEDIC_DATA:-$HOME/.cache/paramedic/data}"
mkdir -p "$DATA"
if [ -f "$DATA/.complete" ]; then echo "data: $DATA (cached)"; exit 0; fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
if ! apt-get download mmseqs2-examples ragout-examples >/dev/null 2>&1; then
  # apt-get download needs fresh package lists; updating them needs root.
  if [ "$(id -u)" = 0 ]; then apt-get update -qq; else sudo apt-get update -qq; fi
  apt-get download mmseqs2-examples ragout-examples >/dev/null
fi
for deb in *.deb; do dpkg -x "$deb" x; done
mkdir -p "$DATA/mmseqs2" "$DATA/ragout"
ex=x/usr/share/doc/mmseqs2/example-data
zcat "$ex/DB.fasta.gz" > "$DATA/mmseqs2/DB.fasta"
zcat "$ex/QUERY.fasta.gz" > "$DATA/mmseqs2/QUERY.fasta"
cp -r x/usr/share/doc/ragout/examples/. "$DATA/ragout/"
touch "$DATA/.complete"
echo "data: $DATA"
