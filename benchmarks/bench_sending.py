"""What sending to another process costs with the shim: `ForkingPickler.dumps` of 200 tensors.

Everything multiprocessing sends (a queue's item, a pool's task, a spawn child's arguments) is
pickled by `multiprocessing.reduction.ForkingPickler.dumps`; torch's reducer puts each tensor's
storage in shared memory.  One timed call is one `dumps` of a list of 200 tensors of 16 floats;
what it sent is loaded (untimed) after each call, so that the descriptors it handed out are
collected as a receiver collects them.

- leaves: without the shim; with the shim installed and no mode applying here (another thread's
  scope holds it); with mode warn applying (nothing to detach).  The three should be within noise:
  the shim adds a Python call per tensor and per send, and touches nothing else.  The leaves are
  in shared memory after their first send, as in any program that sends them more than once.
- tensors with history: modes silent and warn (each send copies them: a new storage per tensor in
  shared memory; warn also surveys the send to name them), against what a user would write
  without the shim, `[t.detach().clone() for t in tensors]` sent natively.

Medians of `--runs` calls each (after `--warmup` more), wall time and process CPU time, the cases
interleaved round by round so that the machine's load changes hit every case alike.

    .venv/bin/python benchmarks/bench_sending.py              # 51 runs: about 10 s
    .venv/bin/python benchmarks/bench_sending.py --runs 201
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
import warnings
from multiprocessing.reduction import ForkingPickler
from typing import Any, Callable, Dict, List, Tuple

import torch

import deepcopy_shim

COUNT = 200


def tensors(history: bool) -> List[torch.Tensor]:
    torch.manual_seed(0)
    if not history:
        return [torch.randn(16) for _ in range(COUNT)]
    with torch.enable_grad():
        w = torch.randn(16, requires_grad=True)
        return [w * (i + 1) for i in range(COUNT)]


class AnotherThreadsScope:
    """Holds the patch installed from another thread (a scope there), so that no mode applies here."""

    def __enter__(self) -> None:
        self.entered, self.leave = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._hold, daemon=True)
        self.thread.start()
        assert self.entered.wait(30)

    def _hold(self) -> None:
        with deepcopy_shim.enabled("warn"):
            self.entered.set()
            self.leave.wait(600)

    def __exit__(self, *exc: Any) -> None:
        self.leave.set()
        self.thread.join(30)


def send(objs: List[torch.Tensor]) -> Callable[[], Any]:
    return lambda: ForkingPickler.dumps(objs)


def by_hand(objs: List[torch.Tensor]) -> Callable[[], Any]:
    return lambda: ForkingPickler.dumps([t.detach().clone() for t in objs])


def cases() -> List[Tuple[str, Callable[[], Any], Any, bool]]:
    """(name, the send, the mode applying in this thread: None for native or for no mode here,
    whether another thread's scope holds the patch installed)."""
    leaves, history = tensors(False), tensors(True)
    return [
        ("200 leaves, native", send(leaves), None, False),
        ("200 leaves, shim installed, no mode here", send(leaves), None, True),
        ("200 leaves, shim installed, mode warn", send(leaves), "warn", False),
        ("200 with history, detach().clone() by hand, native", by_hand(history), None, False),
        ("200 with history, mode silent", send(history), "silent", False),
        ("200 with history, mode warn", send(history), "warn", False),
    ]


def timed(call: Callable[[], Any], mode: Any, held: bool) -> Tuple[float, float]:
    """One call's (wall, cpu) seconds, in `mode`; what it sent is then received, untimed."""
    holder = AnotherThreadsScope() if held else None
    if holder is not None:
        holder.__enter__()
    try:
        with deepcopy_shim.enabled(mode) if mode else _Nothing(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            wall, cpu = time.perf_counter(), time.process_time()
            data = call()
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    finally:
        if holder is not None:
            holder.__exit__()
    ForkingPickler.loads(data)  # the receiver takes the descriptors handed out
    return wall, cpu


class _Nothing:
    def __enter__(self) -> None:
        pass

    def __exit__(self, *exc: Any) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=51, help="timed calls per case (default 51)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed calls per case first (default 5)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    table = cases()
    times: Dict[str, List[Tuple[float, float]]] = {name: [] for name, *_ in table}
    for round_ in range(args.warmup + args.runs):
        for name, call, mode, held in table:
            result = timed(call, mode, held)
            if round_ >= args.warmup:
                times[name].append(result)
    print(f"ForkingPickler.dumps of {COUNT} tensors of 16 floats; torch {torch.__version__}, "
          f"one torch thread; median of {args.runs} runs")
    print(f"| {'case':<52} | wall (ms) | CPU (ms) | wall / native |")
    print(f"| {'-' * 52} | ---: | ---: | ---: |")
    native = {"leaves": statistics.median(w for w, _ in times[table[0][0]]),
              "with history": statistics.median(w for w, _ in times[table[3][0]])}
    for name, *_ in table:
        wall = statistics.median(w for w, _ in times[name])
        cpu = statistics.median(c for _, c in times[name])
        base = native["leaves" if "leaves" in name else "with history"]
        print(f"| {name:<52} | {wall * 1e3:.2f} | {cpu * 1e3:.2f} | {wall / base:.2f}x |")


if __name__ == "__main__":
    main()
