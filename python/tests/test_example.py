"""examples/pytorch/digits_ddp.py, as the docs run it: 4 processes under torchrun on
scikit-learn's digits, the exact qcoll backend, gloo, and the one_bit hook. The one_bit
hook's test accuracy is within 4 percentage points of the exact allreduce's, and
it sends about 30x fewer bytes per step (both measured over TCP, where they leave
qcoll's transport).

Why 4 points: the test set has 450 images (one is 0.22 points), and where two
training runs end depends on the host's floating-point kernels (torch's, whose code
paths differ by CPU) as much as on the exchange, each host giving the same accuracies
run after run: on one 2-vCPU AMD EPYC host all three modes reached 96.89 %, on another
(same pinned torch, numpy and scikit-learn) one_bit reached 96.00 % against the exact
allreduce's 96.89 % (4 images), and on a 2-vCPU Intel Xeon host 94.22 % against 96.89 %
(12 images, the same in three runs). A broken exchange ends tens of points away. The exact
allreduce and gloo, which sum the same way, stay within 1.5 points."""

import json
import os
import pathlib
import subprocess
import sys

from conftest import free_port

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "pytorch" / "digits_ddp.py"


def train(*modes):
    """One torchrun launch that trains each mode in turn (one import of torch per rank)."""
    env = dict(os.environ, QCOLL_TRANSPORT="tcp")
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4", "--master-port", str(free_port()),
         str(EXAMPLE), "--mode", ",".join(modes), "--json"],
        env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert [line["mode"] for line in lines] == list(modes), result.stdout
    return lines


def test_one_bit_matches_exact_accuracy_with_thirty_times_fewer_bytes():
    exact, gloo, one_bit = train("qcoll", "gloo", "one_bit")
    print(json.dumps([exact, gloo, one_bit], indent=1))
    assert abs(one_bit["test_accuracy"] - exact["test_accuracy"]) <= 0.04, (one_bit, exact)
    assert abs(gloo["test_accuracy"] - exact["test_accuracy"]) <= 0.015, (gloo, exact)
    assert exact["test_accuracy"] > 0.9, exact
    ratio = exact["bytes_sent_per_step"] / one_bit["bytes_sent_per_step"]
    assert 25 < ratio < 40, f"one_bit sent {ratio:.1f}x fewer bytes per step than the exact allreduce"
