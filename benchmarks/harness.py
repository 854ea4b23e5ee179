"""Shared benchmark harness: machine facts, other processes' CPU use, block timing.

Timing: every implementation runs in one process, one after another, in
blocks: a block is `warmup` untimed calls then `iters` calls each timed with
time.perf_counter; `rounds` blocks per implementation, the order of
implementations reversed every other round (so slow drift hits all alike);
the reported time is the median of all rounds*iters timed calls. Short
blocks (6 calls), many of them (8): this machine's speed for the same
compute-bound call switches between two levels about 2x apart from one block
to the next (seen with 1 or 2 IREE workers and with PyTorch alike), and
more, shorter blocks keep one slow stretch from deciding a row. Blocks, not
call-by-call interleaving, because IREE's worker threads and PyTorch's OpenMP
threads both spin briefly after a call and would steal the cores from each
other.

The machine may be shared, and PyTorch's multi-threaded eager mode suffers
badly when another process takes a core. `timed` waits (up to --wait-quiet
seconds) for other processes to leave the CPUs, times again (up to
--retries times) if others took 10% or more of the CPU time meanwhile, and
reports the share others used in the timing it kept.
"""

import os
import platform
import statistics
import subprocess
import time
from importlib import metadata

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUIET = 0.10  # other processes' CPU share below which a timing counts as clean


def add_timing_options(parser, iters: int = 6, rounds: int = 8) -> None:
    parser.add_argument("--warmup", type=int, default=5, help="untimed calls per block (default 5)")
    parser.add_argument("--iters", type=int, default=iters, help=f"timed calls per block (default {iters})")
    parser.add_argument("--rounds", type=int, default=rounds, help=f"blocks per implementation (default {rounds})")
    parser.add_argument("--wait-quiet", type=float, default=120, metavar="S",
                        help="before timing each input, wait up to S seconds for other processes to "
                             "leave the CPUs (< 10%% used); default 120")
    parser.add_argument("--retries", type=int, default=3,
                        help="time an input again (at most this often) when other processes used >= 10%% "
                             "of the CPUs meanwhile; the least disturbed timing is kept; default 3")


def start(title: str, args, extra=()) -> int:
    """Sets PyTorch's threads to the core count, seeds, prints the machine; returns the core count."""
    import torch
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    torch.set_num_threads(cores)
    torch.manual_seed(0)
    print_machine(title, args, cores, [
        f"threads     torch.set_num_threads({cores}); IREE device local-task (its default worker pool)", *extra])
    return cores


def print_machine(title: str, args, cores: int, extra=()) -> None:
    print(f"# {title}")
    print(f"date        {time.strftime('%Y-%m-%d %H:%M:%S %Z')}")
    print(f"machine     {cpu_model()}, {cores} cores ({os.cpu_count()} logical CPUs), {platform.machine()}")
    print(f"commit      {git_head()}")
    print(f"versions    python {platform.python_version()}, torch {version('torch')}, "
          f"iree-base-compiler {version('iree-base-compiler')}, iree-base-runtime {version('iree-base-runtime')}, "
          f"torch-mlir {version('torch-mlir')}, peft {version('peft')}, transformers {version('transformers')}")
    for line in extra:
        print(line)
    print(f"timing      per implementation {args.rounds} blocks x ({args.warmup} warm-up + {args.iters} timed), "
          f"order reversed every other block; median of {args.rounds * args.iters} perf_counter timings")
    print(f"loadavg     {loadavg()} (start); others used {fmt_pct(others_load())} of the CPUs in the last second")


# ----------------------------------------------------------------------------- machine


def cpu_model() -> str:
    """The CPU's model name with its family and model numbers (a virtual CPU's name may be bare)."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    name = fields.get("model name") or platform.processor() or "unknown"
    if "cpu family" in fields:
        name += f" (family {fields['cpu family']} model {fields.get('model', '?')})"
    return name


def git_head() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True).stdout.strip()
        return head + (" (+ uncommitted changes)" if dirty else "")
    except Exception as e:  # not a checkout
        return f"unknown ({type(e).__name__})"


def version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def loadavg() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "n/a"


class CpuMeter:
    """Share of the machine's CPU time used by *other* processes between start() and stop().

    /proc/stat busy ticks of the whole machine minus this process's own CPU
    time: on a shared machine, timings taken while others ran are not clean.
    """

    HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    @staticmethod
    def _sample():
        try:
            with open("/proc/stat") as f:
                fields = [int(v) for v in f.readline().split()[1:]]
        except OSError:
            return None
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)   # idle + iowait
        own = sum(os.times()[:2]) * CpuMeter.HZ
        return sum(fields[:8]) - idle, sum(fields[:8]), own

    def start(self):
        self._start = self._sample()
        return self

    def stop(self):
        end = self._sample()
        if self._start is None or end is None or end[1] == self._start[1]:
            return None
        busy, total, own = (e - s for e, s in zip(end, self._start))
        return max(0.0, min(1.0, (busy - own) / total))


def others_load(seconds: float = 1.0):
    meter = CpuMeter().start()
    time.sleep(seconds)
    return meter.stop()


def wait_until_quiet(max_wait: float, threshold: float = QUIET) -> None:
    """Waits (up to max_wait s) until other processes use < threshold of the CPUs."""
    deadline = time.time() + max_wait
    while True:
        load = others_load()
        if load is None or load < threshold:
            return
        if time.time() >= deadline:
            print(f"warning: other processes still use {load:.0%} of the CPUs; timing anyway", flush=True)
            return
        print(f"waiting: other processes use {load:.0%} of the CPUs", flush=True)
        time.sleep(4)


# ----------------------------------------------------------------------------- timing


def measure(fns: dict, warmup: int, iters: int, rounds: int):
    """({name: timed seconds}, others' CPU share) over rounds*iters timed calls of each fns[name]()."""
    meter = CpuMeter().start()
    times = {name: [] for name in fns}
    names = list(fns)
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            fn = fns[name]
            for _ in range(warmup):
                fn()
            for _ in range(iters):
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
    return times, meter.stop()


def rel_err(y, ref) -> float:
    y, ref = np.asarray(y, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    return float(np.linalg.norm(y - ref) / np.linalg.norm(ref))


def timed(fns: dict, args, label: str):
    """({name: median seconds}, others' CPU share), retimed while others took the CPUs."""
    best = None
    for _ in range(1 + args.retries):
        wait_until_quiet(args.wait_quiet)
        timings, others = measure(fns, args.warmup, args.iters, args.rounds)
        if best is None or (others or 0) < (best[1] or 0):
            best = (timings, others)
        if others is None or others < QUIET:
            break
        print(f"[{label}] others used {others:.0%} of the CPUs while timing: timing again", flush=True)
    timings, others = best
    return {name: statistics.median(v) for name, v in timings.items()}, others


def report(lines: list, path: str | None) -> None:
    """Prints the Markdown `lines`, and writes them to `path` too if given."""
    text = "\n".join(lines) + "\n"
    print(text)
    if path:
        with open(path, "w") as f:
            f.write(text)


def verdict(value: float, bound: float, at_least: bool) -> str:
    """"met" when `value` is at least (or at most) `bound`, else "MISSED"."""
    return "met" if (value >= bound if at_least else value <= bound) else "MISSED"


def fmt_pct(x):
    return "n/a" if x is None else f"{x:.0%}"


def fmt_ms(t: dict, key: str) -> str:
    return f"{t[key] * 1e3:.2f}" if key in t else "n/a"
