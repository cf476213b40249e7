#!/usr/bin/env python3
"""Region coverage of each fuzz target's parser code, from a replay of a corpus.

usage: tests/fuzz/coverage.py BUILD CORPUS_ROOT [TARGET...]

BUILD is a clang build with -fprofile-instr-generate -fcoverage-mapping (docs/testing.md
has the command); CORPUS_ROOT holds one folder per target (tests/fuzz/corpus, or the
folders a libFuzzer run grew). Each target's driver replays its folder; llvm-cov then
counts the code regions of the functions that parse what the target feeds (a regular
expression over their names, in the files listed): the encoders, senders and socket
code in the same headers are not the target's to reach, so they are left out.
"""
import os
import re
import subprocess
import sys
import tempfile

# target: (headers, functions that parse the target's bytes)
TARGETS = {
    "decoder": (["include/qcoll/quantizers/", "include/qcoll/core/wire.hpp"],
                r"decode|check_records|read_header|parse|verdict|unpack"),
    "stream": (["include/qcoll/transports/stream/"],
               r"recv|receive|read|parse|deliver|park|match|abort|test\(|wait|on_|header|fail"),
    "handshake": (["include/qcoll/rendezvous/handshake.hpp"],
                  r"server_handshake|client_handshake|refusal_reason|printable|channel_name"),
    "store": (["include/qcoll/rendezvous/tcp_store_protocol.hpp", "include/qcoll/rendezvous/tcp_store_table.hpp"],
              r"parse_request|store_table|take_response"),
    "survivors": (["include/qcoll/rendezvous/survivors.hpp"], r"read_ranks|read_answer|encode_answer|put_ranks"),
    "environment": (["include/qcoll/rendezvous/environment.hpp", "include/qcoll/rendezvous/launcher_variables.hpp"],
                    r"job_from_environment\(std::function|read_variable|parse_|read_pair|slurm_|mpirun_local_port"),
}


def main():
    build, corpus = sys.argv[1], sys.argv[2]
    chosen = sys.argv[3:] or list(TARGETS)
    source = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with tempfile.TemporaryDirectory() as work:
        print(f"{'target':<12} {'inputs':>7} {'regions':>8} {'covered':>8} {'percent':>8}")
        for target in chosen:
            files, pattern = TARGETS[target]
            binary = os.path.join(build, "tests", f"{target}_fuzz")
            raw = os.path.join(work, f"{target}.profraw")
            data = os.path.join(work, f"{target}.profdata")
            replay = subprocess.run([binary, "--corpus", os.path.join(corpus, target), "--seconds", "0"],
                                    env={**os.environ, "LLVM_PROFILE_FILE": raw}, check=True,
                                    capture_output=True, text=True).stdout
            inputs = int(re.search(r"(\d+) corpus inputs", replay).group(1))
            subprocess.run(["llvm-profdata-14", "merge", "-o", data, raw], check=True)
            report = subprocess.run(["llvm-cov-14", "report", binary, f"-instr-profile={data}", "--show-functions",
                                     *[os.path.join(source, f) for f in files]],
                                    check=True, capture_output=True, text=True).stdout
            names = subprocess.run(["c++filt"], input=report, check=True, capture_output=True, text=True).stdout
            regions = missed = 0
            for line in names.splitlines():
                fields = line.split()
                if len(fields) < 4 or not fields[-1].endswith("%") or line.startswith("TOTAL"):
                    continue
                if re.search(pattern, " ".join(fields[:-3])):
                    regions += int(fields[-3])
                    missed += int(fields[-2])
            print(f"{target:<12} {inputs:>7} {regions:>8} {regions - missed:>8} "
                  f"{100.0 * (regions - missed) / max(regions, 1):>7.1f}%")


if __name__ == "__main__":
    main()
