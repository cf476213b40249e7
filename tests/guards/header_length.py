#!/usr/bin/env python3
"""No fat room without a reason (issue 53): every header under include/qcoll/ is at most
500 lines, or says at its top why it is longer, in a line of its first 40 that starts
`/// Over 500 lines:` (a `///` comment, as the @file comment it belongs to) followed by
the reason. A header that grows past the bound fails naming its length, so it is split
along its seams (or given its reason) when it grows, not when a review finds it.

    header_length.py <include dir>   (the directory that holds qcoll/)
"""
import pathlib
import re
import sys

bound = 500
reason = re.compile(r"^\s*///\s*Over 500 lines:\s*\S.{20,}")

include = pathlib.Path(sys.argv[1]) / "qcoll"
headers = sorted(p for p in include.rglob("*") if p.suffix in (".hpp", ".cuh") and p.is_file())
if len(headers) < 50:
    sys.exit(f"header_length.py: found only {len(headers)} headers under {include}: the path is wrong")
failures = []
long_with_reason = []
for header in headers:
    lines = header.read_text(errors="replace").splitlines()
    if len(lines) <= bound:
        continue
    name = header.relative_to(include.parent)
    if any(reason.match(line) for line in lines[:40]):
        long_with_reason.append(f"{name} ({len(lines)} lines)")
    else:
        failures.append(f"{name}: {len(lines)} lines, over {bound} without a reason at its top "
                        f"('/// Over 500 lines: …' in its first 40 lines): split it along its seams, or say why not")
for line in long_with_reason:
    print(f"over {bound} lines, with its reason: {line}")
if failures:
    print("\n".join(failures), file=sys.stderr)
    sys.exit(1)
print(f"{len(headers)} headers: none over {bound} lines without a reason at its top")
