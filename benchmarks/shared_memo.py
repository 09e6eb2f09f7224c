"""Copies that share one memo: is every mode linear in the number of copies?

n small objects, each holding one tensor with autograd history, are copied one by one through
one memo (as a library that copies many objects with a memo of its own does), at n and at 2n.
Each mode's time at 2n over its time at n is printed: about 2 is linear, about 4 quadratic.
"oracle" is native deepcopy of the same objects holding detached leaves instead (the detaching
oracle: what the detaching modes must cost about as much as); strict copies until it is
refused, so it is timed on leaves only (what it adds to copies that meet no tensor with
history).

    .venv/bin/python benchmarks/shared_memo.py              # n = 2000 and 4000
    .venv/bin/python benchmarks/shared_memo.py --n 8000 --rounds 3
"""

from __future__ import annotations

import argparse
import copy
import gc
import statistics
import time
import warnings
from typing import Any, Callable, Dict, List

import torch

import deepcopy_shim


class Holds:
    def __init__(self, tensor: torch.Tensor) -> None:
        self.t = tensor


def _objects(n: int, history: bool) -> List[Holds]:
    leaf = torch.ones(2, requires_grad=True)
    return [Holds(leaf * 2 if history else torch.ones(2)) for _ in range(n)]


def _copy_all(objects: List[Holds]) -> None:
    memo: Dict[Any, Any] = {}
    for obj in objects:
        copy.deepcopy(obj, memo)


def _timed(run: Callable[[], None]) -> float:
    gc.collect()
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def _arm(mode: str, n: int) -> float:
    objects = _objects(n, history=mode in ("silent", "warn"))
    if mode == "oracle":
        return _timed(lambda: _copy_all(objects))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with deepcopy_shim.enabled(mode):
            return _timed(lambda: _copy_all(objects))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="copies at the smaller size")
    parser.add_argument("--rounds", type=int, default=5, help="median of this many rounds")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{'mode':<8} {'n':>7} {'time':>10} {'2n':>10} {'2n / n':>7}")
    for mode in ("oracle", "silent", "warn", "strict"):
        small = statistics.median(_arm(mode, args.n) for _ in range(args.rounds))
        large = statistics.median(_arm(mode, 2 * args.n) for _ in range(args.rounds))
        print(f"{mode:<8} {args.n:>7} {small * 1e3:>8.1f}ms {large * 1e3:>8.1f}ms {large / small:>7.2f}")


if __name__ == "__main__":
    main()
