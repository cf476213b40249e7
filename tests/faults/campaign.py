#!/usr/bin/env python3
"""A randomized fault campaign: many short jobs, each with a random transport, world
size and fault at a random moment, each judged by what every rank says and leaves.

usage: tests/faults/campaign.py BUILD [--trials N] [--seed S] [--transports shm,tcp,mpich]
                                      [--faults none,kill,stop,elastic,cut,slow,garbage,corrupt] [--show]

Trial kinds (the worker scenarios are in tests/multiprocess/):
- none     worker `campaign`: collectives of random kinds and sizes, every result
           checked; every rank must say "campaign done".
- kill     the same, and the driver SIGKILLs a random rank at a random moment once every
           rank has joined: every other rank must either have finished or fail with an
           error that names the killed rank ("peer <r>"), within the deadline.
- stop     the same with SIGSTOP (a hung process, its sockets open): the others must fail
           naming it, by timeout, within the deadline; the driver then kills it.
- elastic  `recovery_worker residuals` (tcp and shm, 4, 6 or 8 ranks): random ranks, fewer than half,
           die at a fixed step; the survivors must shrink, agree, carry on and check
           their sums against every rank's inputs and residual mass.
- cut      worker `campaign` over TCP in the network lab (benchmarks/netlab: every rank
           in a network namespace of its own behind a bridge, 1 Gbit/s links): a random
           rank's link is cut (its bridge port goes down: packets dropped, nobody told)
           0–1 s after all joined. The others must fail naming it, as for `stop`; the cut
           rank fails as it will (it is cut off, not judged).
- slow     the same lab, and a random rank's link slows to 50 or 100 Mbit/s 0.05–0.5 s
           after the start (`netlab --link-slow`), 30–100 calls: every rank must finish
           with correct results — a slow link is not a failure. A job that finished
           before its link slowed counts as "finished before the fault".
- garbage  worker `campaign` over TCP (qcoll-run), every rank with tests/faults/garble.cpp
           preloaded; 0–1 s after all joined a random rank gets SIGUSR1, and from then
           on every byte it writes to a socket is garbage. The others must finish or
           fail naming it, as for `kill`.
- corrupt  the same, but from SIGUSR1 on the victim flips one bit in the middle of its next
           socket write of at least 4 KiB, once (QCOLL_GARBLE=payload: inside a data
           chunk, the stream's structure intact): where the flip went out (the victim
           says "garble: flipped"), no rank may finish with a wrong result, some rank
           must fail with the payload's CRC-32C mismatch, and every rank that fails must
           name the victim. TCP checks payloads where a connection leaves loopback
           (docs/transports.md, "Payload integrity"): each trial binds the ranks to this
           host's first non-loopback address (QCOLL_BIND), where there is one, or sets
           QCOLL_PAYLOAD_CRC=1 — by the seed, half and half.
The network faults need root and network namespaces (netlab.md).
Under MPI (MPICH's mpirun), a killed rank makes the launcher end the whole job: the
judgement is then only that every process is gone within the deadline.

Every trial must end within its deadline, and leave no process (the worker's command
line carries a marker) and no /dev/shm segment of its job. A failed trial prints the
seed that reproduces it (--seed S --trials 1 runs trial S alone). The summary counts
trials per fault and outcome and gives the worst detection time (the fault, to a
survivor's error).
"""
import argparse
import collections
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

SOURCE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEP_TIMEOUT_MS = 2000   # QCOLL_TIMEOUT_MS of every trial: a stopped rank is found within it
TRIAL_DEADLINE_S = 60    # a trial that runs longer is a hang


def network_address():
    """This host's first IPv4 address outside 127.0.0.0/8, or None."""
    try:
        found = subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split()
    except OSError:
        return None
    return next((a for a in found if "." in a and not a.startswith("127.")), None)


class Trial:
    def __init__(self, build, seed, transports, faults):
        self.random = random.Random(seed)
        self.seed = seed
        self.build = build
        self.fault = self.random.choice(faults)
        candidates = [t for t in transports if not (self.fault == "elastic" and t == "mpich")]
        self.transport = self.random.choice(candidates or ["tcp"])
        if self.fault in ("cut", "slow"):
            self.transport = "netlab"  # TCP between network namespaces
        if self.fault in ("garbage", "corrupt"):
            self.transport = "tcp"
        # recovery_worker's check after the shrink plays the first world on a 2 × n/2 torus.
        self.size = self.random.choice([4, 6, 8]) if self.fault == "elastic" else self.random.randint(2, 8)
        self.marker = f"qcoll-campaign-{os.getpid()}-{seed}"
        self.job_id = self.marker
        self.lines = []
        self.pids = {}
        self.fault_time_ms = None
        self.victims = []
        self.lab_name = f"qc{os.getpid() % 10000}x{seed}"  # netlab's namespaces: <name>-r<rank>, <name>-hub
        self.slowed = None

    def command(self, directory):
        env = dict(os.environ, QCOLL_TIMEOUT_MS=str(STEP_TIMEOUT_MS), QCOLL_CAMPAIGN_SEED=str(self.seed),
                   QCOLL_JOB_ID=self.job_id)
        if self.fault in ("garbage", "corrupt"):
            env["LD_PRELOAD"] = os.path.join(self.build, "tests", "libqcoll_garble.so")
        if self.fault == "corrupt":
            env["QCOLL_GARBLE"] = "payload"
            address = network_address()
            if address and self.random.random() < 0.5:
                env["QCOLL_BIND"] = address  # checked by default: the connections leave loopback
            else:
                env["QCOLL_PAYLOAD_CRC"] = "1"
        if self.fault == "elastic":
            dead = self.random.sample(range(self.size), self.random.randint(1, (self.size - 1) // 2))
            self.victims = sorted(dead)
            worker = [os.path.join(self.build, "tests", "recovery_worker"), "residuals",
                      ",".join(map(str, self.victims)), directory]  # the directory's name has the marker
        else:
            calls = self.random.randint(30, 100) if self.fault == "slow" else self.random.randint(100, 1000)
            worker = [os.path.join(self.build, "tests",
                                   "transport_worker_mpich" if self.transport == "mpich" else "transport_worker"),
                      "campaign", str(calls), self.marker]
        if self.transport == "mpich":
            return ["mpirun.mpich", "-np", str(self.size), *worker], env
        if self.transport == "netlab":
            lab = [os.path.join(SOURCE_DIR, "benchmarks", "netlab"), "-n", str(self.size), "--name", self.lab_name,
                   "--rate", "1gbit", "--keep-going", "--timeout", str(TRIAL_DEADLINE_S - 5)]
            if self.fault == "slow":
                self.slowed = self.random.randrange(self.size)
                rate = self.random.choice(["50mbit", "100mbit"])
                lab += ["--link-slow", f"{self.slowed}@{self.random.uniform(0.05, 0.5):.2f}:{rate}"]
            return [*lab, "--", *worker], env
        launcher = os.path.join(self.build, "tools", "qcoll-run", "qcoll-run")
        return [launcher, "-n", str(self.size), "--transport", self.transport, "--keep-going",
                "--timeout", str(TRIAL_DEADLINE_S - 5), "--grace", "1", *worker], env

    def run(self):
        with tempfile.TemporaryDirectory(prefix=self.marker + "-") as directory:
            argv, env = self.command(directory)
            started = time.monotonic()
            process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            reader = threading.Thread(target=self.read, args=(process,), daemon=True)
            reader.start()
            if self.fault in ("kill", "stop", "cut", "garbage", "corrupt"):
                self.inject(process, started)
            if self.fault == "stop" and self.victims:
                # A stopped rank never exits by itself: once the others have spoken (or
                # the deadline nears), it is killed, as an operator would.
                while process.poll() is None and time.monotonic() - started < TRIAL_DEADLINE_S - 10 and \
                        len(self.verdicts()) < self.size - 1:
                    time.sleep(0.01)
                self.kill_pid(self.pids[self.victims[0]])
            try:
                process.wait(timeout=max(1, TRIAL_DEADLINE_S - (time.monotonic() - started)))
                hung = False
            except subprocess.TimeoutExpired:
                hung = True
                self.kill_everything(process)
            reader.join(timeout=5)
            if self.fault == "stop":
                self.kill_everything(None)  # the stopped rank, if the launcher left it
            elapsed = time.monotonic() - started
            return self.judge(process.returncode, hung, elapsed)

    def read(self, process):
        for line in process.stdout:
            self.lines.append(line.rstrip("\n"))
            found = re.search(r"rank (\d+): campaign pid (\d+)", line)
            if found:
                self.pids[int(found.group(1))] = int(found.group(2))

    def inject(self, process, started):
        # Every rank has joined once each printed its pid; the fault comes 0–1 s later.
        while len(self.pids) < self.size and process.poll() is None and time.monotonic() - started < 30:
            time.sleep(0.005)
        if len(self.pids) < self.size:
            return
        time.sleep(self.random.uniform(0.0, 1.0))
        victim = self.random.randrange(self.size)
        self.victims = [victim]
        self.fault_time_ms = time.time() * 1000
        if self.fault == "cut":  # as netlab's --link-down does it: the hub's end of the victim's veth
            if subprocess.run(["ip", "-n", f"{self.lab_name}-hub", "link", "set", "dev", f"v{victim}", "down"],
                              capture_output=True).returncode != 0:
                self.victims = []  # the lab is gone: the job had ended
            return
        try:
            os.kill(self.pids[victim], {"kill": signal.SIGKILL, "stop": signal.SIGSTOP,
                                        "garbage": signal.SIGUSR1, "corrupt": signal.SIGUSR1}[self.fault])
        except ProcessLookupError:
            self.victims = []  # it had finished: the trial runs without a fault

    def verdicts(self):
        """rank -> its verdict line's match (done, or error with time and message)."""
        found = {}
        for line in list(self.lines):
            m = re.search(r"rank (\d+): (campaign done|campaign error at (\d+): (.*)|recovered:)", line)
            if m:
                found.setdefault(int(m.group(1)), m)
        return found

    @staticmethod
    def kill_pid(pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def leftovers(self):
        ps = subprocess.run(["pgrep", "-f", self.marker], capture_output=True, text=True).stdout.split()
        ps = [p for p in ps if int(p) != os.getpid()]
        segments = [f for f in os.listdir("/dev/shm") if self.job_id in f]
        if self.transport == "netlab":
            namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
            segments += [line.split()[0] for line in namespaces.splitlines() if line.startswith(self.lab_name + "-")]
        return ps, segments

    def kill_everything(self, process):
        if process is not None:
            try:
                process.kill()
            except ProcessLookupError:
                pass
        for pid in subprocess.run(["pgrep", "-f", self.marker], capture_output=True, text=True).stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass

    def judge(self, status, hung, elapsed):
        """(outcome, problem or None, detection ms or None)."""
        time.sleep(0.2)  # the launcher's children are reaped by now
        processes, segments = self.leftovers()
        if processes or segments:
            self.kill_everything(None)
            for name in segments:
                if name.startswith(self.lab_name + "-"):
                    subprocess.run(["ip", "netns", "del", name], capture_output=True)
                else:
                    os.unlink(os.path.join("/dev/shm", name))
            return "leftovers", f"left processes {processes} and segments {segments}", None
        if hung:
            return "hang", f"still running after {TRIAL_DEADLINE_S} s", None
        said = self.verdicts()
        failed = [l for l in self.lines if "FAILED" in l]
        if failed:
            return "wrong", failed[0], None
        if self.fault == "elastic":
            recovered = {r for r, m in said.items() if m.group(2) == "recovered:"}
            survivors = set(range(self.size)) - set(self.victims)
            if recovered != survivors:
                return "wrong", f"survivors {sorted(survivors)} but recovered {sorted(recovered)}: {status}", None
            return "survivors carried on", None, None
        # Under MPI a rank that dies or fails ends the whole job: the launcher may stop a
        # survivor before it speaks.
        launcher_ends = self.transport == "mpich" and bool(self.victims)
        detection = None
        for rank in range(self.size):
            if rank in self.victims or (rank in said and said[rank].group(2) == "campaign done"):
                continue
            if rank not in said:
                if launcher_ends:
                    continue
                return "wrong", f"rank {rank} said nothing (exit {status})", None
            message = said[rank].group(4)
            if not self.victims:
                return "wrong", f"rank {rank} failed without a fault: {message}", None
            if f"peer {self.victims[0]}" not in message and f"rank {self.victims[0]}" not in message:
                return "wrong", f"rank {rank}'s error does not name rank {self.victims[0]}: {message}", None
            ms = int(said[rank].group(3)) - self.fault_time_ms
            detection = ms if detection is None else max(detection, ms)
        if self.fault == "corrupt" and any("garble: flipped" in line for line in self.lines):
            if not any("CRC-32C" in line and "corrupted in transit" in line for line in self.lines):
                return "wrong", "a payload bit was flipped, and no rank reported the CRC-32C mismatch", None
            return "CRC-32C mismatch reported", None, detection
        if self.fault == "slow":
            slowed = any("link slowed" in line for line in self.lines)
            return ("correct results" if slowed else "finished before the fault"), None, None
        if not self.victims:
            return "correct results", None, None
        if launcher_ends and detection is None:
            return "launcher ended the job", None, None
        return ("error naming the rank" if detection is not None else "finished before the fault"), None, detection


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("build")
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--transports", default="shm,tcp,mpich")
    parser.add_argument("--faults", default="none,kill,stop,elastic")
    parser.add_argument("--show", action="store_true", help="print every trial's output")
    args = parser.parse_args()
    transports, faults = args.transports.split(","), args.faults.split(",")
    counts = collections.Counter()
    worst = {}
    failures = []
    started = time.monotonic()
    for seed in range(args.seed, args.seed + args.trials):
        trial = Trial(args.build, seed, transports, faults)
        outcome, problem, detection = trial.run()
        counts[(trial.fault, trial.transport, outcome)] += 1
        if detection is not None:
            worst[trial.fault] = max(worst.get(trial.fault, 0), detection)
        if args.show or problem:
            print(f"trial {seed}: {trial.fault} on {trial.transport}, {trial.size} ranks, victims {trial.victims}: "
                  f"{outcome}" + (f": {problem}" if problem else ""))
            if args.show or problem:
                print("\n".join("    " + l for l in trial.lines[-30:]))
        if problem:
            failures.append(seed)
    print(f"{args.trials} trials in {time.monotonic() - started:.0f} s")
    print(f"{'fault':<8} {'transport':<9} {'outcome':<28} trials")
    for (fault, transport, outcome), n in sorted(counts.items()):
        print(f"{fault:<8} {transport:<9} {outcome:<28} {n}")
    for fault, ms in sorted(worst.items()):
        print(f"worst detection time, {fault}: {ms:.0f} ms")
    if failures:
        print(f"FAILED trials (rerun one with --seed S --trials 1 --show): {failures}")
        return 1
    print("every trial passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
