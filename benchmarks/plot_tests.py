#!/usr/bin/env python3
"""Tests of benchmarks/plot: its readers on real benchmark output and training logs,
its errors on malformed lines, and the docs' chart data against the docs they were
copied from. Standard library only; where matplotlib is importable, the charts are
also drawn (twice, to check they come out byte-identical), else those tests skip.

  python3 benchmarks/plot_tests.py [-v]
"""

import contextlib
import importlib.machinery
import importlib.util
import io
import re
import sys
import tempfile
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.dont_write_bytecode = True  # no __pycache__ beside a script without a .py name


def load_plot():
    loader = importlib.machinery.SourceFileLoader("qcoll_plot", str(HERE / "plot"))
    spec = importlib.util.spec_from_loader("qcoll_plot", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


plot = load_plot()

# benchmarks/qcoll_peer_bench 2 -b 4K -e 256K -f 4 (QCOLL_BUILD_DIR=build/ci), as printed.
QCOLL_PEER_BENCH = """\
# collective_bench (qcoll 0.2.0): exact allreduce, 2 ranks as processes over the shm transport
# host: vm Linux 6.18.44-fc-v509, 2 online cpus
# nranks: 2  op: sum  type: float32  in-place  transport: shm
# time = median over iters of max-over-ranks per-iteration time (barrier before each iteration)
#
# qcoll allreduce shm
#      size(B)        count   type     time(us)  algbw(GB/s)  busbw(GB/s)   #wrong  iters     tmin(us)
          4096         1024  float         2.13        1.925        1.925        0     50         1.79
         16384         4096  float         4.35        3.765        3.765        0     50         3.83
         65536        16384  float         8.87        7.386        7.386        0     50         8.38
        262144        65536  float        25.09       10.449       10.449        0     50        24.18
# Avg bus bandwidth: 5.881 GB/s
# collective_bench (qcoll 0.2.0): exact allreduce, 2 ranks as processes over the tcp transport
# host: vm Linux 6.18.44-fc-v509, 2 online cpus
# nranks: 2  op: sum  type: float32  in-place  transport: tcp
# time = median over iters of max-over-ranks per-iteration time (barrier before each iteration)
#
# qcoll allreduce tcp
#      size(B)        count   type     time(us)  algbw(GB/s)  busbw(GB/s)   #wrong  iters     tmin(us)
          4096         1024  float        10.11        0.405        0.405        0     50         9.49
         16384         4096  float        10.40        1.575        1.575        0     50         9.78
         65536        16384  float        29.75        2.203        2.203        0     50        26.82
        262144        65536  float        73.53        3.565        3.565        0     50        65.78
# Avg bus bandwidth: 1.937 GB/s
"""

# ../shared/peers/run_mpi.sh shm 2 -b 4K -e 1M -f 4 (its mpi_allreduce_bench, Open MPI 4.1.4), as printed.
OPEN_MPI = """\
# mpi_allreduce_bench
# MPI library: Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4, repo rev: v4.1.4, May 26, 2022
# host: vm Linux 6.18.44-fc-v509, 2 online cpus
# nranks: 2  op: sum  type: float32  in-place (MPI_IN_PLACE)  label: shm
# time = median over iters of max-over-ranks per-iteration time (MPI_Barrier before each iteration)
#
# MPI_Allreduce  nranks: 2  transport: shm
#      size(B)        count   type     time(us)  algbw(GB/s)  busbw(GB/s)   #wrong  iters     tmin(us)
          4096         1024  float         2.76        1.482        1.482        0     50         2.37
         16384         4096  float         8.19        2.000        2.000        0     50         7.52
         65536        16384  float        13.73        4.773        4.773        0     50        13.15
        262144        65536  float        36.29        7.223        7.223        0     50        35.59
       1048576       262144  float       125.74        8.339        8.339        0     50       124.07
# Avg bus bandwidth: 4.763 GB/s
"""

# ../shared/peers/run_gloo.sh 2 -a ring,new_ring -b 4K -e 256K -f 4, as printed.
GLOO = """\
# gloo_allreduce_bench
# Gloo 0.5.0 (Debian libgloo-dev 0.0~git20220518.5b14351-3), transport tcp, pci=, iface=lo, speed=-1, addr=[127.0.0.1], FileStore rendezvous
# host: vm Linux 6.18.44-fc-v509, 2 online cpus
# nranks: 2  op: sum  type: float32  in-place
# context scope (-C): size  (fresh full-mesh context, i.e. new TCP connections, per (algorithm, size))
# time = median over iters of max-over-ranks per-iteration time (barrier before each iteration)
#
# gloo algorithm: ring  nranks: 2  (context per size; connectFullMesh 20.2 ms)
#      size(B)        count   type     time(us)  algbw(GB/s)  busbw(GB/s)   #wrong  iters     tmin(us)
          4096         1024  float        63.33        0.065        0.065        0     50        60.66
         16384         4096  float        71.61        0.229        0.229        0     50        63.13
         65536        16384  float        96.00        0.683        0.683        0     50        79.11
        262144        65536  float       381.62        0.687        0.687        0     50       158.52
# Avg bus bandwidth (ring): 0.416 GB/s
#
# gloo algorithm: new_ring  nranks: 2  (context per size; connectFullMesh 20.0 ms)
#      size(B)        count   type     time(us)  algbw(GB/s)  busbw(GB/s)   #wrong  iters     tmin(us)
          4096         1024  float       219.68        0.019        0.019        0     50       138.02
         16384         4096  float       241.98        0.068        0.068        0     50       199.99
         65536        16384  float       253.62        0.258        0.258        0     50       170.15
        262144        65536  float       398.98        0.657        0.657        0     50       240.68
# Avg bus bandwidth (new_ring): 0.250 GB/s
"""

# collective_bench --compressed in the lab: docs/compressed-performance.md, "The goal: network lab", run 4.
COMPRESSED = """\
# qcoll allreduce compressed tcp
#      size(B)        count   type      variant   chunk     time(us)  algbw(GB/s)  busbw(GB/s)      wire(B)  wire/ex   bw/ex   #wrong    relerr  iters     tmin(us)    link%
      67108864     16777216  float        exact       -    882599.17        0.076        0.114    100663296   1.0000    1.00        0  0.00e+00     10    867935.70     91.2
      67108864     16777216  float     identity    256K    894116.33        0.075        0.113    100665600   1.0000    0.99        0  0.00e+00     10    865710.99     90.1
      67108864     16777216  float      one_bit    256K     69178.35        0.970        1.455      3246336   0.0322   12.76        0  1.03e+00     10     63891.37   1164.1
"""

# nccl-tests' layout (out-of-place and in-place columns, units on their own line, ranks
# listed in the preamble), with the qcoll shm numbers above in the in-place columns and
# the tcp ones in the out-of-place columns: a test of the layout, not a measurement.
NCCL_TESTS = """\
# nThread 1 nGpus 1 minBytes 4096 maxBytes 65536 step: 4(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid   1001 on host device  0 [0x01] GPU
#  Rank  1 Group  0 Pid   1002 on host device  1 [0x02] GPU
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
        4096          1024     float     sum      -1    10.11    0.41    0.41      0     2.13    1.92    1.92    N/A
       16384          4096     float     sum      -1    10.40    1.58    1.58      0     4.35    3.77    3.77    N/A
       65536         16384     float     sum      -1    29.75    2.20    2.20      0     8.87    7.39    7.39    N/A
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 2.87
"""

# qcoll-run -n 4 data_parallel_training --epochs 4 (build/ci), as printed, rank prefixes included.
DATA_PARALLEL_TRAINING = """\
[0] data-parallel training on 4 ranks (shm): MLP 32-256-256-10 (76810 parameters), 16384 training and 16384 test samples, batch 128 (32 per rank), 4 epochs, seed 1
[0] best possible test accuracy (the Bayes classifier, which knows the clusters): 94.86 %
[0] 
[0]                exact allreduce               1-bit compressed allreduce   
[0] epoch  train loss   test acc   time (s)   train loss   test acc   time (s)
[0]     1      0.8012    89.61 %       0.75       1.3294    77.91 %       0.64
[0]     2      0.2668    91.75 %       0.75       0.3921    91.02 %       0.77
[0]     3      0.2178    92.52 %       0.75       0.2299    92.47 %       0.72
[0]     4      0.1970    92.85 %       0.75       0.2044    92.65 %       0.69
[0] 
[0] accuracy gap: 0.20 pp (limit 0.50): ok
"""

# qcoll-run -n 4 --keep-going -- elastic_training --epochs 3 --kill 3@150, rank 0's lines.
ELASTIC_TRAINING = """\
[0] best possible test accuracy (the Bayes classifier): 94.81 %
[0] 
[0] epoch ranks train loss   test acc  time (s)
[0]     1     4     1.4183    75.67 %      0.17
[0]       recovery: old rank 0 of 4 is rank 0 of 3 (shrink 1, agreed in 4.4 ms), lost: rank 3 (its process is gone (its host refused the connection))
[0]       3 ranks go on from step 150
[0]       training again 18 ms after this rank's call failed
[0]     2     3     0.4651    88.44 %      0.16
[0]     3     3     0.2991    89.40 %      0.15
[0] 
[0] final test accuracy: 89.40 % on 3 ranks
"""

# torus_fault_training --steps 60 (build/ci): the table before the failure, the lines
# between, and the table after it, which repeats the step it re-formed at.
TORUS_FAULT_TRAINING = """\
 step  nodes  train loss  test acc  time (s)
   16     16      0.9739    0.6436      0.02
   20     16      1.0513    0.6655      0.03

--- failure at step 20
group 1: 14 ranks; rank 0 (a1) broadcast its parameters, momentum and step count (20); the old plan's 1-bit residuals are dropped; step 20 is redone
recovery: 0.50 s from detecting the failure to training again (mostly the membership grace)

 step  nodes  train loss  test acc  time (s)
   20     14           -    0.6655      0.53  <- re-formed here: training goes on without the lost nodes
   24     14      0.9605    0.7222      0.54
"""


def by_key(series):
    return {(s.name, s.transport, s.ranks): s for s in series}


class NcclTablesTest(unittest.TestCase):
    def test_qcoll_peer_bench_gives_a_series_per_transport(self):
        series = by_key(plot.read_nccl_tables(QCOLL_PEER_BENCH, "extra_n2.txt"))
        self.assertEqual(set(series), {("qcoll", "shm", 2), ("qcoll", "tcp", 2)})
        shm = series[("qcoll", "shm", 2)]
        self.assertEqual(shm.runs, {4096: [1.925], 16384: [3.765], 65536: [7.386], 262144: [10.449]})
        self.assertEqual(series[("qcoll", "tcp", 2)].runs[262144], [3.565])

    def test_open_mpi_and_gloo_are_named_by_their_titles(self):
        mpi = by_key(plot.read_nccl_tables(OPEN_MPI, "mpi_shm_n2.txt"))
        self.assertEqual(list(mpi), [("Open MPI", "shm", 2)])
        self.assertEqual(mpi[("Open MPI", "shm", 2)].runs[1048576], [8.339])
        gloo = by_key(plot.read_nccl_tables(GLOO, "gloo_n2.txt"))
        self.assertEqual(set(gloo), {("Gloo ring", "tcp", 2), ("Gloo new_ring", "tcp", 2)})
        self.assertEqual(gloo[("Gloo new_ring", "tcp", 2)].runs[262144], [0.657])

    def test_other_columns_and_compressed_variants(self):
        series = by_key(plot.read_nccl_tables(COMPRESSED, "lab.txt"))
        self.assertEqual(series[("qcoll", "tcp", None)].runs, {67108864: [0.114]})
        self.assertEqual(series[("qcoll one_bit", "tcp", None)].runs, {67108864: [1.455]})
        ratios = by_key(plot.read_nccl_tables(COMPRESSED, "lab.txt", column="bw/ex"))
        self.assertEqual(ratios[("qcoll one_bit", "tcp", None)].runs, {67108864: [12.76]})
        times = by_key(plot.read_nccl_tables(QCOLL_PEER_BENCH, "x.txt", column="time"))
        self.assertEqual(times[("qcoll", "shm", 2)].runs[4096], [2.13])

    def test_nccl_tests_layout_in_place_by_default(self):
        series = plot.read_nccl_tables(NCCL_TESTS, "all_reduce_perf.txt")
        self.assertEqual(len(series), 1)
        s = series[0]
        self.assertEqual((s.name, s.transport, s.ranks), ("all_reduce_perf", "", 2))
        self.assertEqual(s.runs, {4096: [1.92], 16384: [3.77], 65536: [7.39]})
        out = plot.read_nccl_tables(NCCL_TESTS, "all_reduce_perf.txt", place="out-of-place")[0]
        self.assertEqual(out.runs[65536], [2.20])

    def test_three_runs_give_a_median_and_a_range(self):
        runs = []
        for scale in (1.0, 0.5, 2.0):  # three copies of one table, values scaled
            text = QCOLL_PEER_BENCH.replace("10.449", f"{10.449 * scale:.3f}")
            runs.append(plot.read_nccl_tables(text, "run.txt"))
        shm = by_key(plot.merge(runs))[("qcoll", "shm", 2)]
        self.assertEqual(shm.run_count(), 3)
        size, median, low, high = shm.points()[-1]
        self.assertEqual((size, median, low, high), (262144, 10.449, 5.224, 20.898))

    def test_qcoll_run_prefixes_are_dropped(self):
        prefixed = "".join(f"[0] {line}\n" for line in OPEN_MPI.splitlines())
        self.assertEqual(plot.read_nccl_tables(prefixed, "p.txt")[0].runs[4096], [1.482])

    def test_a_row_missing_a_field_names_file_and_line(self):
        broken = QCOLL_PEER_BENCH.replace("         16384         4096  float         4.35        3.765",
                                          "         16384         4096  float         4.35")
        with self.assertRaisesRegex(plot.InputError, r"^extra_n2\.txt:9: 8 fields, but the header on line 7 "
                                                     r"names 9 columns"):
            plot.read_nccl_tables(broken, "extra_n2.txt")

    def test_a_value_that_is_not_a_number_names_file_and_line(self):
        broken = OPEN_MPI.replace("4.773        4.773", "4.773        4,773")
        with self.assertRaisesRegex(plot.InputError, r"^mpi\.txt:11: busbw\(GB/s\) '4,773' is not a number"):
            plot.read_nccl_tables(broken, "mpi.txt")

    def test_a_file_without_a_table_or_column(self):
        with self.assertRaisesRegex(plot.InputError, r"^empty\.txt: no table"):
            plot.read_nccl_tables("# just a comment\nsome text\n", "empty.txt")
        with self.assertRaisesRegex(plot.InputError, r"^x\.txt:7: no column 'membw'"):
            plot.read_nccl_tables(QCOLL_PEER_BENCH, "x.txt", column="membw")


MARKDOWN = """\
# source: docs/x.md, "A section"
# y: busbw (GB/s)
# series: HEAD = qcoll
# series: Open MPI
| n | tr | size | HEAD | base | Open MPI | ratio |
|--:|---|--:|---|---|---|---|
| 2 | shm | 1M | 7.19 / 6.07 / 7.59 | 6.95 / 2.97 / 7.16 | 5.29 / 3.44 / 4.74 | 1.36 / 1.77 / 1.60 |
| 2 | tcp | 64M | **2.05** / 1.79 / 1.92 | | — | 2.41 / 1.89 / 2.11 |
"""


class MarkdownTest(unittest.TestCase):
    def test_rows_keyed_by_size(self):
        chart, series = plot.read_markdown(MARKDOWN, "m.md")
        self.assertEqual(chart.source, 'docs/x.md, "A section"')
        series = by_key(series)
        self.assertEqual(set(series), {("qcoll", "shm", 2), ("qcoll", "tcp", 2), ("Open MPI", "shm", 2)})
        self.assertEqual(series[("qcoll", "shm", 2)].points(), [(1 << 20, 7.19, 6.07, 7.59)])
        self.assertEqual(series[("qcoll", "tcp", 2)].runs, {64 << 20: [2.05, 1.79, 1.92]})

    def test_rows_that_are_series(self):
        text = """\
# series: qcoll shm = qcoll | shm
# series: Gloo (best) = Gloo | tcp
| n | qcoll / best peer | t(4K) | 1 MiB | busbw 16M |
|--:|---|--:|--:|--:|
| 4 | qcoll shm | 29.9 | 1.67 | **1.34** |
| 4 | Gloo (best) | 468 | 0.26 | 0.69 (0.61–0.70) |
"""
        series = by_key(plot.read_markdown(text, "r.md")[1])
        self.assertEqual(series[("qcoll", "shm", 4)].runs, {1 << 20: [1.67], 16 << 20: [1.34]})
        self.assertEqual(series[("Gloo", "tcp", 4)].points(), [(1 << 20, 0.26, 0.26, 0.26),
                                                               (16 << 20, 0.69, 0.61, 0.70)])

    def test_sizes_packed_in_one_cell(self):
        text = """\
# ranks: 4
# column: HEAD
# sizes: 1M / 4M
# series: shm, k_level4 = k_level4 | shm
| goal | HEAD | 18c8838 |
|---|---|---|
| shm, k_level4 | 0.95, 0.95 / 1.09, 1.24 | 0.91, 1.00 / 1.04, 0.94 |
"""
        series = by_key(plot.read_markdown(text, "p.md")[1])
        self.assertEqual(series[("k_level4", "shm", 4)].runs, {1 << 20: [0.95, 0.95], 4 << 20: [1.09, 1.24]})

    def test_a_bad_cell_names_file_and_line(self):
        broken = MARKDOWN.replace("5.29 / 3.44 / 4.74", "5.29 / 3.44 / n/a")
        with self.assertRaisesRegex(plot.InputError, r"^m\.md:7: 'Open MPI' cell '5\.29 / 3\.44 / n/a' is not a "
                                                     "number"):
            plot.read_markdown(broken, "m.md")

    def test_a_short_row_an_unknown_column_and_an_unknown_size(self):
        with self.assertRaisesRegex(plot.InputError, r"^m\.md:8: 6 cells, but the header on line 5 has 7"):
            plot.read_markdown(MARKDOWN.replace("| 2 | tcp | 64M |", "| 2 | tcp |"), "m.md")
        with self.assertRaisesRegex(plot.InputError, r"^m\.md:4: no column 'Gloo'"):
            plot.read_markdown(MARKDOWN.replace("# series: Open MPI", "# series: Gloo"), "m.md")
        with self.assertRaisesRegex(plot.InputError, r"^m\.md:7: size '4K µs' is not a size"):
            plot.read_markdown(MARKDOWN.replace("| 2 | shm | 1M |", "| 2 | shm | 4K µs |"), "m.md")
        with self.assertRaisesRegex(plot.InputError, r"^m\.md:2: not a '# key: value' line"):
            plot.read_markdown(MARKDOWN.replace("# y:", "# why:"), "m.md")


class TrainingLogTest(unittest.TestCase):
    def test_two_runs_side_by_side(self):
        curves = {c.name: c for c in plot.read_training_log(DATA_PARALLEL_TRAINING, "dp.txt")}
        self.assertEqual(list(curves), ["exact allreduce", "1-bit compressed allreduce"])
        exact, one_bit = curves["exact allreduce"], curves["1-bit compressed allreduce"]
        self.assertEqual(exact.x_label, "epoch")
        self.assertTrue(exact.percent)
        self.assertEqual([p[1] for p in exact.points("train loss")], [0.8012, 0.2668, 0.2178, 0.1970])
        self.assertEqual([p[1] for p in one_bit.points("test acc")], [77.91, 91.02, 92.47, 92.65])

    def test_one_run_named_by_its_file_notes_between_rows_skipped(self):
        (curve,) = plot.read_training_log(ELASTIC_TRAINING, "logs/elastic.txt")
        self.assertEqual(curve.name, "elastic")
        self.assertEqual(curve.points("test acc"), [(1.0, 75.67, 75.67, 75.67), (2.0, 88.44, 88.44, 88.44),
                                                    (3.0, 89.40, 89.40, 89.40)])

    def test_steps_across_a_recovery(self):
        (curve,) = plot.read_training_log(TORUS_FAULT_TRAINING, "torus.txt")
        self.assertEqual((curve.name, curve.x_label, curve.percent), ("torus", "step", False))
        losses = [(x, median) for x, median, _, _ in curve.points("train loss")]
        self.assertEqual(losses, [(16, 0.9739), (20, 1.0513), (24, 0.9605)])  # step 20's loss once: "-" is none
        accuracies = [(x, median) for x, median, _, _ in curve.points("test acc")]
        self.assertEqual(accuracies, [(16, 0.6436), (20, 0.6655), (24, 0.7222)])

    def test_several_logs_of_one_run_give_a_median_and_a_range(self):
        logs = [plot.read_training_log(DATA_PARALLEL_TRAINING.replace("0.8012", loss), f"seed{i}.txt")
                for i, loss in enumerate(("0.8012", "0.9000", "0.7000"))]
        exact = {c.name: c for c in plot.merge_curves(logs)}["exact allreduce"]
        self.assertEqual(exact.points("train loss")[0], (1.0, 0.8012, 0.7, 0.9))

    def test_a_malformed_row_names_file_and_line(self):
        broken = DATA_PARALLEL_TRAINING.replace("0.2178    92.52 %", "0.2178    92.5x %")
        with self.assertRaisesRegex(plot.InputError, r"^dp\.txt:8: test acc '92\.5x' is not a number"):
            plot.read_training_log(broken, "dp.txt")
        short = DATA_PARALLEL_TRAINING.replace("0.2044    92.65 %       0.69", "0.2044    92.65 %")
        with self.assertRaisesRegex(plot.InputError, r"^dp\.txt:9: 6 values, but the header names 7 columns"):
            plot.read_training_log(short, "dp.txt")

    def test_a_repeated_epoch_and_a_log_without_a_table(self):
        twice = DATA_PARALLEL_TRAINING.replace("[0]     3 ", "[0]     2 ")
        with self.assertRaisesRegex(plot.InputError, r"^dp\.txt:8: epoch 2 of 'exact allreduce' appears twice in one "
                                                     "log with different values"):
            plot.read_training_log(twice, "dp.txt")
        with self.assertRaisesRegex(plot.InputError, r"^none\.txt: no training table"):
            plot.read_training_log(QCOLL_PEER_BENCH, "none.txt")


class DocsDataTest(unittest.TestCase):
    """The committed charts' data: every table row is a line of the doc section its
    '# source:' line names, character for character, so no number is made up."""

    DATA = sorted((REPO / "docs/images/data").glob("*.md"))

    def test_there_is_data(self):
        self.assertTrue(self.DATA, "no docs/images/data/*.md")

    def test_every_row_is_in_its_doc_section(self):
        for path in self.DATA:
            with self.subTest(path=path.name):
                text = path.read_text()
                source = re.search(r'^# source: (\S+), "(.+)"$', text, re.MULTILINE)
                self.assertIsNotNone(source, "no '# source: docs/FILE.md, \"Section\"' line")
                doc = (REPO / source.group(1)).read_text().splitlines()
                starts = [i for i, line in enumerate(doc) if re.match(r"#+ ", line) and
                          line.lstrip("#").strip() == source.group(2)]
                self.assertEqual(len(starts), 1, f"one heading '{source.group(2)}' in {source.group(1)}")
                level = len(doc[starts[0]]) - len(doc[starts[0]].lstrip("#"))
                end = next((i for i in range(starts[0] + 1, len(doc))
                            if re.match(rf"#{{1,{level}}} ", doc[i])), len(doc))
                section = set(doc[starts[0]:end])
                rows = [line for line in text.splitlines() if line.startswith("|")]
                self.assertGreater(len(rows), 2)
                for row in rows:
                    self.assertIn(row, section, f"{path.name}: a row not in the section")

    def test_every_chart_reads(self):
        for path in self.DATA:
            with self.subTest(path=path.name):
                chart, series = plot.read_markdown(path.read_text(), path.name)
                self.assertTrue(chart.title and chart.ylabel and chart.source)
                self.assertGreaterEqual(len(series), 3)
                self.assertTrue(all(len(s.points()) >= 3 for s in series))

    def test_the_committed_images_exist(self):
        for path in self.DATA:
            for suffix in (".png", ".svg"):
                image = path.parent.parent / (path.stem + suffix)
                self.assertGreater(image.stat().st_size if image.exists() else 0, 0, f"{image} is missing")


@unittest.skipUnless(plot.matplotlib_ready(), f"no {plot.MATPLOTLIB_REQUIREMENTS[0]} here (benchmarks/plot "
                                              "brings it into tools/python-tools' environment)")
class DrawingTest(unittest.TestCase):
    def test_tables_and_training_are_drawn_the_same_twice(self):
        with tempfile.TemporaryDirectory() as out:
            inputs = Path(out) / "in"
            inputs.mkdir()
            (inputs / "extra_n2.txt").write_text(QCOLL_PEER_BENCH)
            (inputs / "mpi_shm_n2.txt").write_text(OPEN_MPI)
            (inputs / "dp.txt").write_text(DATA_PARALLEL_TRAINING)
            digests = []
            for attempt in ("a", "b"):
                for args in (["tables", str(inputs / "extra_n2.txt"), str(inputs / "mpi_shm_n2.txt"),
                              "-o", f"{out}/{attempt}", "--stem", "busbw"],
                             ["training", str(inputs / "dp.txt"), "-o", f"{out}/{attempt}", "--stem", "loss"]):
                    with contextlib.redirect_stdout(io.StringIO()):
                        self.assertEqual(plot.main(args), 0)
                files = sorted(Path(out, attempt).iterdir())
                self.assertEqual([f.name for f in files], ["busbw.png", "busbw.svg", "loss.png", "loss.svg"])
                self.assertTrue(all(f.stat().st_size > 1000 for f in files))
                digests.append([f.read_bytes() for f in files])
            self.assertEqual(digests[0], digests[1], "the same input drew different bytes")


if __name__ == "__main__":
    unittest.main()
