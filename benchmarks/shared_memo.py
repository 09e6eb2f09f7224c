"""Is every mode linear?  Twice the copies, tensors, memo entries or depth should cost about twice.

Four sizes are doubled, one at a time, and each mode's time at 2n over its time at n printed
(about 2 is linear, about 4 quadratic):

- copies: n small objects, each holding one tensor with autograd history, copied one by one
  through one memo (as a library that copies many objects with a memo of its own does);
- tensors: one copy of a list of n such objects;
- memo entries: one copy of 100 such objects through a memo that n earlier copies filled;
- depth: one copy of n modules nested in one another, each caching a tensor with history (what
  warn names is as deep as the model: its paths are n steps long at the bottom, so warn's time
  at 2n is about twice plus what the longer paths' text takes).

"oracle" is native deepcopy of the same objects holding detached leaves instead (the detaching
oracle, what the detaching modes should cost about as much as).  strict refuses the first
tensor with history, so it is timed on the leaves' objects (what it adds where nothing is
refused).

    .venv/bin/python benchmarks/shared_memo.py              # n = 2000
    .venv/bin/python benchmarks/shared_memo.py --n 8000 --rounds 3
    .venv/bin/python benchmarks/shared_memo.py --cases depth --n 1000
"""

from __future__ import annotations

import argparse
import copy
import gc
import statistics
import sys
import threading
import time
import warnings
from typing import Any, Callable, Dict, List, Optional

import torch
import torch.nn as nn

import deepcopy_shim

MODES = ("oracle", "silent", "warn", "strict")


class Holds:
    def __init__(self, tensor: torch.Tensor) -> None:
        self.t = tensor


def _objects(n: int, history: bool) -> List[Holds]:
    leaf = torch.ones(2, requires_grad=True)
    return [Holds(leaf * 2 if history else torch.ones(2)) for _ in range(n)]


def _copies(n: int, history: bool) -> Callable[[], None]:
    objects = _objects(n, history)

    def run() -> None:
        memo: Dict[Any, Any] = {}
        for obj in objects:
            copy.deepcopy(obj, memo)
    return run


def _tensors(n: int, history: bool) -> Callable[[], None]:
    objects = _objects(n, history)
    return lambda: copy.deepcopy(objects) and None


def _memo_entries(n: int, history: bool) -> Callable[[], None]:
    earlier = _objects(n, history=False)
    objects = _objects(100, history)

    def run() -> None:
        memo: Dict[Any, Any] = {}
        copy.deepcopy(earlier, memo)  # untimed: filled before the clock starts, see _timed
        _timed.start = time.perf_counter()
        copy.deepcopy(objects, memo)
    return run


class Nest(nn.Module):
    """A module holding the next one and a cached tensor."""

    def __init__(self, inner: Optional[nn.Module], tensor: torch.Tensor) -> None:
        super().__init__()
        self.inner = inner
        self.cached = tensor


def _depth(n: int, history: bool) -> Callable[[], None]:
    leaf = torch.ones(2, requires_grad=True)
    model: Optional[nn.Module] = None
    for _ in range(n):
        model = Nest(model, leaf * 2 if history else torch.ones(2))
    return lambda: copy.deepcopy(model) and None


def _timed(run: Callable[[], None]) -> float:
    gc.collect()
    if NO_GC:
        gc.disable()
    try:
        _timed.start = time.perf_counter()  # type: ignore[attr-defined]
        run()
        return time.perf_counter() - _timed.start  # type: ignore[attr-defined]
    finally:
        gc.enable()


# --no-gc: the cyclic garbage collector off during each timed call.  Its full passes scan every
# object alive, so a copy that allocates n objects while m are alive pays about n * m / 700 in
# them: at depth 2000 that is a third of warn's time (the frames and nodes of the way to each
# tensor, held until the copy ends), and it is the collector's growth, not the copy's.
NO_GC = False


def _arm(case: Callable[[int, bool], Callable[[], None]], mode: str, n: int) -> float:
    run = case(n, mode in ("silent", "warn"))
    if mode == "oracle":
        return _timed(run)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with deepcopy_shim.enabled(mode):
            return _timed(run)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="the smaller size")
    parser.add_argument("--rounds", type=int, default=5, help="median of this many rounds")
    parser.add_argument("--cases", default="copies,tensors,memo entries,depth",
                        help="which sizes to double, comma-separated")
    parser.add_argument("--no-gc", action="store_true",
                        help="the garbage collector off during each timed call")
    args = parser.parse_args()
    global NO_GC
    NO_GC = args.no_gc
    torch.set_num_threads(1)
    every = {"copies": _copies, "tensors": _tensors, "memo entries": _memo_entries, "depth": _depth}
    cases = {name: every[name] for name in args.cases.split(",")}
    print(f"{'size doubled':<13} {'mode':<7} {'n':>7} {'time':>10} {'2n':>10} {'2n / n':>7}")
    for name, case in cases.items():
        for mode in MODES:
            small = statistics.median(_arm(case, mode, args.n) for _ in range(args.rounds))
            large = statistics.median(_arm(case, mode, 2 * args.n) for _ in range(args.rounds))
            print(f"{name:<13} {mode:<7} {args.n:>7} {small * 1e3:>8.1f}ms {large * 1e3:>8.1f}ms "
                  f"{large / small:>7.2f}")


if __name__ == "__main__":
    # The depth case copies 2n nested modules: a deep recursion, given room in a thread of its own.
    sys.setrecursionlimit(1_000_000)
    threading.stack_size(1 << 30)
    worker = threading.Thread(target=main)
    worker.start()
    worker.join()
