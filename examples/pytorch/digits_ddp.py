"""DDP training on scikit-learn's bundled digits (8x8 images of handwritten digits,
1,797 samples, shipped inside scikit-learn: no download), with qcoll:

    torchrun --nproc-per-node 4 examples/pytorch/digits_ddp.py --mode qcoll     # exact, qcoll backend
    torchrun --nproc-per-node 4 examples/pytorch/digits_ddp.py --mode gloo      # exact, PyTorch's gloo
    torchrun --nproc-per-node 4 examples/pytorch/digits_ddp.py --mode one_bit   # gloo + qcoll's one_bit hook
    torchrun --nproc-per-node 4 examples/pytorch/digits_ddp.py --mode qcoll,gloo,one_bit  # all three, in turn

Each rank trains on its shard of the training set; rank 0 prints the test accuracy and
the bytes this rank sent per step, measured where they leave qcoll's transport (the
exact allreduce's with --mode qcoll, the hook's with --mode one_bit; gloo's are not
visible to qcoll). QCOLL_TRANSPORT=tcp measures what would cross a network: over shm, a
large exact allreduce lets peers read blocks from shared memory instead of sending them.

Several modes train one after the other in the same processes (one launch, one import
of torch per rank), each from the same initial weights and batch order, so each gives
what it gives alone. The world's process group is gloo's; --mode qcoll trains over a
group of qcoll's backend, dist.new_group(backend="qcoll") (dist.init_process_group("qcoll")
makes qcoll the default group instead, as docs/pytorch.md shows).
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.distributed as dist
import torch.nn as nn
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import qcoll.torch
import qcoll.torch.hooks as hooks


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", default="one_bit",
                        help="qcoll (exact, qcoll backend), gloo (exact), or any qcoll quantizer for the DDP "
                             "hook over gloo: one_bit, k_level, bfp, ...; several, comma-separated, train in "
                             "turn (default one_bit)")
    parser.add_argument("--bits", type=int, default=None,
                        help="the hook's quantizer bits where it takes them (default: the hook's, 4)")
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--batch", type=int, default=32, help="samples per rank per step")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--json", action="store_true", help="print rank 0's result as one JSON line per mode")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()

    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)
    x_train, y_train = x_train[rank::size], y_train[rank::size]  # this rank's shard

    for mode in args.mode.split(","):
        result = train(mode, args, rank, x_train, y_train, x_test, y_test)
        if rank != 0:
            continue
        if args.json:
            print(json.dumps(dict(result, ranks=size)), flush=True)
        else:
            per_step = ("not measured (gloo)" if result["bytes_sent_per_step"] is None
                        else f"{result['bytes_sent_per_step']:,.0f} bytes")
            print(f"{mode}: test accuracy {100 * result['test_accuracy']:.2f} % after {result['steps']} steps; "
                  f"rank 0 sent {per_step} per step ({result['parameters']:,} parameters, "
                  f"{4 * result['parameters']:,} bytes of float32 gradient)", flush=True)
    dist.destroy_process_group()


def train(mode, args, rank, x_train, y_train, x_test, y_test):
    """Trains a fresh model with one mode; returns rank 0's figures (every rank's, alike)."""
    group = dist.new_group(backend="qcoll") if mode == "qcoll" else None  # None: the world's (gloo)
    torch.manual_seed(args.seed)  # every rank, and every mode, starts from the same weights
    model = nn.Sequential(nn.Linear(64, args.hidden), nn.ReLU(), nn.Linear(args.hidden, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, 10))
    ddp = nn.parallel.DistributedDataParallel(model, process_group=group)
    state = None
    if mode not in ("qcoll", "gloo"):  # a quantizer: the hook refuses a name it does not know
        state = hooks.CompressedState(quantizer=mode, **({} if args.bits is None else {"bits": args.bits}))
        ddp.register_comm_hook(state, hooks.compressed_allreduce)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=args.momentum)

    def bytes_sent():  # this rank's, through qcoll; None where qcoll does not carry the gradients
        if mode == "qcoll":
            return qcoll.torch.bytes_sent(group)
        return None if state is None else state.bytes_sent()

    sent_before = bytes_sent()  # DDP's broadcast of the initial weights is not a step
    generator = torch.Generator().manual_seed(args.seed + rank)
    steps_per_epoch = max(1, len(x_train) // args.batch)
    steps = 0
    for epoch in range(args.epochs):
        order = torch.randperm(len(x_train), generator=generator)
        for step in range(steps_per_epoch):
            batch = order[step * args.batch:(step + 1) * args.batch]
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(ddp(x_train[batch]), y_train[batch])
            loss.backward()
            optimizer.step()
            steps += 1
        if rank == 0 and not args.json and (epoch + 1) % 10 == 0:
            print(f"{mode}: epoch {epoch + 1}: loss {loss.item():.4f}", flush=True)

    with torch.no_grad():
        accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
    sent = None if sent_before is None else bytes_sent() - sent_before
    if group is not None:
        dist.destroy_process_group(group)
    return {"mode": mode, "steps": steps, "parameters": sum(p.numel() for p in model.parameters()),
            "test_accuracy": accuracy, "bytes_sent_per_step": None if sent is None else sent / steps}


if __name__ == "__main__":
    main()
