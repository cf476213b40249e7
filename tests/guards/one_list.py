#!/usr/bin/env python3
"""One list per policy family (issue 53): the quantizers a program chooses by name are
listed once, in include/qcoll/quantizers/by_name.hpp (named_quantizers), and the
transports once, in include/qcoll/rendezvous/environment.hpp (named_transports).
Fails naming each place outside them that compares a string with a listed name — an
if-chain a new quantizer or transport would have to be added to.

    one_list.py <source root>
"""

import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1])
include = root / "include" / "qcoll"

quantizers = sorted(set(re.findall(r'static constexpr const char\* name = "(\w+)";',
                                   "".join(p.read_text() for p in (include / "quantizers").glob("*.hpp")))))
transports = sorted(set(re.findall(r'case transport_kind::\w+: return "(\w+)";',
                                   (include / "rendezvous" / "environment.hpp").read_text())))
if len(quantizers) < 2 or len(transports) < 2:
    sys.exit(f"one_list.py: found quantizers {quantizers} and transports {transports}: the pattern is stale")
# "auto" is no transport (the absence of a choice) and means other things elsewhere.
names = "|".join(quantizers + [t for t in transports if t != "auto"])
# `x == "one_bit"`, `"tcp" != x`, and Python's `x in ("one_bit", ...)`.
compared = re.compile(rf'(==|!=)\s*"({names})\d*"|"({names})\d*"\s*(==|!=)|\bin\s*[(\[{{]\s*"({names})"')

places = [root / d for d in ("include", "python/csrc", "python/src", "benchmarks", "examples", "tools")]
found = []
checked = 0
for place in places:
    for path in sorted(place.rglob("*")):
        if path.suffix not in (".hpp", ".cpp", ".cu", ".cuh", ".py") or not path.is_file():
            continue
        checked += 1
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if line.lstrip().startswith(("//", "#", "///")):
                continue
            if compared.search(line):
                found.append(f"{path.relative_to(root)}:{number}: {line.strip()}")

print(f"{checked} files: quantizers {', '.join(quantizers)}; transports {', '.join(transports)}")
if found:
    print("names compared outside their list (use quantizers::with_quantizer / parse_quantizer_spec, "
          "rendezvous::parse_transport):")
    print("\n".join(found))
    sys.exit(1)
print("every choice by name goes through its family's one list")
