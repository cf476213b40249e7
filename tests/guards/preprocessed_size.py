#!/usr/bin/env python3
"""How much a user's compiler reads for qcoll's cheapest include (issue 13).

Prints the preprocessed line count of qcoll/core/types.hpp (the cheapest include:
ranks, element types, reduce operations), of qcoll/core/concepts.hpp (the policy
concepts: what a user writing a quantizer, transport or topology needs) and of
qcoll/qcoll.hpp (the umbrella, for scale), as
`<compiler> -std=c++20 -E -I<include dir> -x c++ <header> | wc -l` counts them, and
fails if a bounded header's count exceeds its bound.

Measured 2026-11-23 with g++-12 (libstdc++ 12, Debian 12):
  core/types.hpp      3,988 lines  (the previous layout's types.hpp: 18,763)
  core/concepts.hpp  47,367 lines  (the previous layout's concepts.hpp: 77,388);
                     its floor is the standard headers the concepts name: <span> and
                     <system_error> alone are 30,409 lines, <chrono> 46,005
  qcoll.hpp         ~180,000 lines
Each bound is about 1.5x today's count: room for the standard library and for
growth, but not for a header to start pulling in fmt or a policy folder again.

It also fails if qcoll/communicator.hpp, as a program built with the compiled kernels
reads it (QCOLL_KERNELS_COMPILED, what qcoll::qcoll defines), includes any of xsimd:
only the kernels' own translation units need it (issue 53: 132,921 lines with xsimd,
116,713 without; g++-12 -fsyntax-only 2.49 s -> 2.34 s).

Usage: preprocessed_size.py <C++ compiler> <include dir>   (the directory that holds qcoll/)
"""
import pathlib
import subprocess
import sys

BOUNDS = {  # header: lines (about 1.5 x the count measured 2026-11-23 with g++-12)
    "qcoll/core/types.hpp": 6_000,
    "qcoll/core/concepts.hpp": 71_000,
}
FOR_SCALE = "qcoll/qcoll.hpp"


def preprocessed(compiler, include_dir, header, defines=()):
    result = subprocess.run([compiler, "-std=c++20", "-E", *[f"-D{d}" for d in defines], f"-I{include_dir}", "-x",
                             "c++", str(include_dir / header)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if result.returncode != 0:
        sys.stderr.write(result.stderr)
        return None
    return result.stdout


def preprocessed_lines(compiler, include_dir, header):
    text = preprocessed(compiler, include_dir, header)
    return None if text is None else text.count("\n")


def main(argv):
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    compiler, include_dir = argv[0], pathlib.Path(argv[1])
    print(f"preprocessed lines ({pathlib.Path(compiler).name} -std=c++20 -E):")
    failed = False
    for header, bound in BOUNDS.items():
        lines = preprocessed_lines(compiler, include_dir, header)
        shown = f"{lines:,}" if lines is not None else "FAILED TO PREPROCESS"
        print(f"  {header:<24} {shown:>20}   (bound {bound:,})")
        if lines is None or lines > bound:
            failed = True
            if lines is not None:
                print(f"FAILED: {header} preprocesses to {lines:,} lines, more than {bound:,}: "
                      "it has started pulling in more (see its #includes)")
    for_scale = preprocessed_lines(compiler, include_dir, FOR_SCALE)
    print(f"  {FOR_SCALE:<24} {f'{for_scale:,}' if for_scale is not None else 'failed to preprocess':>20}   (for scale)")
    communicator = preprocessed(compiler, include_dir, "qcoll/communicator.hpp", ["QCOLL_KERNELS_COMPILED"])
    if communicator is None:
        failed = True
    else:
        xsimd = sorted({line.split('"')[1] for line in communicator.splitlines()
                        if line.startswith("# ") and "/xsimd/" in line})
        print(f"  {'qcoll/communicator.hpp':<24} {communicator.count(chr(10)):>20,}   (compiled kernels: "
              f"{'no xsimd' if not xsimd else f'{len(xsimd)} xsimd files'})")
        if xsimd:
            failed = True
            print("FAILED: qcoll/communicator.hpp includes xsimd with the compiled kernels (only the kernels' own "
                  f"translation units need it), first {xsimd[0]}")
    if failed:
        return 1
    print("OK: every bounded header is within its bound")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
