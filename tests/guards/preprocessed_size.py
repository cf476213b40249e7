#!/usr/bin/env python3
"""How much a user's compiler reads for qcoll's cheapest include (issue 13).

Prints the preprocessed line count of qcoll/core/concepts.hpp (the vocabulary and
the policy concepts: what a user writing a quantizer, transport or topology needs)
and of qcoll/qcoll.hpp (the umbrella, for scale), as
`<compiler> -std=c++20 -E -I<include dir> -x c++ <header> | wc -l` counts them, and
fails if concepts.hpp's count exceeds BOUND.

Measured 2026-11-23 with g++-12 (libstdc++ 12, Debian 12):
  core/concepts.hpp  47,322 lines  (the previous layout's concepts.hpp: 77,388)
  qcoll.hpp         179,980 lines
BOUND is 1.5x today's count: room for the standard library and for growth, but
not for the header to start pulling in fmt or a policy folder again.

Usage: preprocessed_size.py <C++ compiler> <include dir>   (the directory that holds qcoll/)
"""
import pathlib
import subprocess
import sys

BOUND = 71_000  # 1.5 x 47,322 (2026-11-23, g++-12)
BOUNDED = "qcoll/core/concepts.hpp"
FOR_SCALE = "qcoll/qcoll.hpp"


def preprocessed_lines(compiler, include_dir, header):
    result = subprocess.run([compiler, "-std=c++20", "-E", f"-I{include_dir}", "-x", "c++", str(include_dir / header)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if result.returncode != 0:
        sys.stderr.write(result.stderr)
        return None
    return result.stdout.count("\n")


def main(argv):
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    compiler, include_dir = argv[0], pathlib.Path(argv[1])
    bounded = preprocessed_lines(compiler, include_dir, BOUNDED)
    for_scale = preprocessed_lines(compiler, include_dir, FOR_SCALE)
    print(f"preprocessed lines ({pathlib.Path(compiler).name} -std=c++20 -E):")
    print(f"  {BOUNDED:<24} {bounded if bounded is not None else 'FAILED TO PREPROCESS':>10}   (bound {BOUND:,})")
    print(f"  {FOR_SCALE:<24} {for_scale if for_scale is not None else 'failed to preprocess':>10}   (for scale)")
    if bounded is None:
        return 1
    if bounded > BOUND:
        print(f"FAILED: {BOUNDED} preprocesses to {bounded:,} lines, more than {BOUND:,}: "
              "the cheapest include has started pulling in more (see its #includes)")
        return 1
    print(f"OK: {BOUNDED} is {bounded / BOUND:.0%} of its bound")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
