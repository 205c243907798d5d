#!/usr/bin/env bash
# Writes data/kjv.txt.xz, lowbit's bundled default corpus: the King James Version of the Bible
# (public domain), as printed by the `bible` program of Debian's bible-kjv package, xz-compressed.
#
#   bible -l0 Gen1:1-Rev22:21    every verse from Genesis 1:1 to Revelation 22:21; -l0 turns off
#                                line wrapping, so each verse is one line ("  N text"), each
#                                chapter starts with a blank line, its name and a blank line
#
# The text is 4,298,239 bytes of ASCII (31,102 verses in 1,189 chapters); the script checks that
# and its SHA-256 before writing, so the committed file can be re-created bit for bit in content.
# xz -6e -T1 (single-threaded, 8 MiB dictionary: the decoder needs about 9 MiB) gives ~0.95 MB.
set -euo pipefail
cd "$(dirname "$0")/.."

die() {
  echo "make_kjv_corpus: $*" >&2
  exit 1
}

command -v bible >/dev/null || die "the 'bible' program is missing: apt-get install bible-kjv"
command -v xz >/dev/null || die "xz is missing: apt-get install xz-utils"

expected_sha256=6f74f5589333c56c263963e6347dba662bae2d96861302e690aaae0b4a855eda
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

bible -l0 Gen1:1-Rev22:21 >"$tmp/kjv.txt"
bytes=$(wc -c <"$tmp/kjv.txt")
verses=$(grep -c '^  [0-9]' "$tmp/kjv.txt" || true)
[[ $verses == 31102 ]] || die "expected 31102 verses, got $verses (bible-kjv version?)"
sha=$(sha256sum "$tmp/kjv.txt" | cut -d' ' -f1)
[[ $sha == "$expected_sha256" ]] ||
  die "the text ($bytes bytes) has SHA-256 $sha, expected $expected_sha256 (bible-kjv version?)"

mkdir -p data
xz -6e -T1 --check=crc64 -c "$tmp/kjv.txt" >"$tmp/kjv.txt.xz"
mv "$tmp/kjv.txt.xz" data/kjv.txt.xz
echo "make_kjv_corpus: wrote data/kjv.txt.xz ($(wc -c <data/kjv.txt.xz) bytes; text $bytes bytes," \
  "$verses verses, SHA-256 $sha)"
