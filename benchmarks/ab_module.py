"""Same-run A/B timing of a module copy: this checkout's deepcopy-shim against a git ref's.

Each ratio is measured within one process, the methods alternated round by round (order
rotated), `gc.collect()` before every timed call, one torch thread; reported: the median over
rounds of the per-round ratio, and each method's median time.

    .venv/bin/python benchmarks/ab_module.py --ref 1fdfd7a          # all cases, against 1fdfd7a
    .venv/bin/python benchmarks/ab_module.py --ref HEAD~1 --rounds 41 --cases module-heavy
    .venv/bin/python benchmarks/ab_module.py --clock cpu           # process CPU time, not wall time
    .venv/bin/python benchmarks/ab_module.py --after-compile       # and again after torch.compile
    .venv/bin/python benchmarks/ab_module.py --blocks 1000 --dict-n 10000 --big-width 1024

Cases: module-heavy (`--blocks` x [Linear(16, 16), LayerNorm(16), ReLU]), module-heavy non-leaf
(the same, each Linear's output cached by a forward hook: warn against silent; native refuses
it), dict (`--dict-n` leaf tensors of `--dict-size` floats), big (`--big-layers` x
Linear(`--big-width`, `--big-width`)).  "floor" and "protocol floor" (module-heavy only) are
`floor_module_heavy.copy_model` and `copy_model_with_protocol`, "clone"
`untyped_storage().clone()` of every tensor.

"old" is the package `deepcopy_shim` as committed at `--ref` (extracted with `git archive` and
imported under another name), "new" is the working tree's; each is enabled in turn, between
timed calls, never inside one.  "native" is `copy.deepcopy` with both disabled.  With
`--after-compile`, one `torch.compile` of an unrelated module runs after every case (it changes
the process for good: dynamo wraps `nn.Module.__init__` and `__setstate__`), and the cases are
measured again.
"""

from __future__ import annotations

import argparse
import copy
import gc
import importlib
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import warnings
from io import BytesIO
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.nn as nn
from floor_module_heavy import copy_model, copy_model_with_protocol, module_heavy

import deepcopy_shim

try:
    import copium
except ImportError:
    copium = None

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
OLD_NAME = "deepcopy_shim_at_ref"


def load_old(ref: str) -> ModuleType:
    """The package `deepcopy_shim` as committed at `ref`, imported as `deepcopy_shim_at_ref`."""
    archive = subprocess.run(["git", "archive", ref, "deepcopy_shim"], cwd=ROOT, check=True,
                             capture_output=True).stdout
    where = Path(tempfile.mkdtemp())
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(where)
    (where / "deepcopy_shim").rename(where / OLD_NAME)
    sys.path.insert(0, str(where))
    return importlib.import_module(OLD_NAME)


# --- models -------------------------------------------------------------------------------


def _cache_output(module: nn.Module, args: Any, output: torch.Tensor) -> None:
    module.cached = output


def module_heavy_nonleaf(blocks: int = 300) -> nn.Module:
    model = module_heavy(blocks)
    for layer in model:
        if isinstance(layer, nn.Linear):
            layer.register_forward_hook(_cache_output)
    model(torch.randn(4, 16))
    return model


def tensor_dict(n: int = 1000, size: int = 8) -> Dict[str, torch.Tensor]:
    return {f"t{i}": torch.randn(size) for i in range(n)}


def big(layers: int = 24, width: int = 2048) -> nn.Module:
    return nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])


def tensors_of(obj: Any) -> List[torch.Tensor]:
    if isinstance(obj, dict):
        return list(obj.values())
    found = [t.detach() for t in list(obj.parameters()) + list(obj.buffers())]
    for m in obj.modules():
        cached = vars(m).get("cached")
        if isinstance(cached, torch.Tensor):
            found.append(cached.detach())
    return found


# --- methods ------------------------------------------------------------------------------


class Switch:
    """Puts torch in a state (native, or one package enabled in a mode) before a timed call."""

    def __init__(self, old: ModuleType) -> None:
        self.packages = {"new": deepcopy_shim, "old": old}

    def native(self) -> None:
        for package in self.packages.values():
            package.disable()

    def shim(self, mode: str, which: str) -> Callable[[], None]:
        def setup() -> None:
            self.native()
            self.packages[which].enable(mode)
        return setup

    def restore(self) -> None:
        self.native()


Method = Tuple[str, Callable[[], None], Callable[[Any], Any]]


def methods(switch: Switch, case: str, tensors: List[torch.Tensor]) -> List[Method]:
    noop: Callable[[], None] = lambda: None  # noqa: E731
    clone: Callable[[Any], Any] = lambda obj: [t.untyped_storage().clone() for t in tensors]  # noqa: E731
    found: List[Method] = [("native", switch.native, copy.deepcopy)]
    if copium is not None and case not in ("module-heavy non-leaf", "dict"):
        found.append(("copium", switch.native, copium.deepcopy))
    modes = ["silent", "warn"] if case == "module-heavy non-leaf" else ["silent"]
    if case == "module-heavy non-leaf":
        found = []  # native refuses
    for mode in modes:
        for which in ("old", "new"):
            found.append((f"{which} {mode}", switch.shim(mode, which), copy.deepcopy))
    if case == "module-heavy":
        found.append(("floor", switch.native, copy_model))
        found.append(("protocol floor", switch.native, copy_model_with_protocol))
    found.append(("clone", noop, clone))
    return found


RATIOS: Dict[str, List[Tuple[str, str]]] = {
    "module-heavy": [("old silent", "clone"), ("new silent", "clone"), ("floor", "clone"),
                     ("protocol floor", "clone"), ("new silent", "floor"),
                     ("new silent", "protocol floor"), ("copium", "protocol floor"),
                     ("native", "protocol floor"), ("copium", "old silent"),
                     ("copium", "new silent"), ("native", "old silent"), ("native", "new silent"),
                     ("new silent", "old silent")],
    "module-heavy non-leaf": [("old warn", "old silent"), ("new warn", "new silent"),
                              ("old silent", "clone"), ("new silent", "clone"),
                              ("new silent", "old silent"), ("new warn", "old warn")],
    "dict": [("old silent", "native"), ("new silent", "native"), ("copium", "native")],
    "big": [("old silent", "clone"), ("new silent", "clone"), ("native", "clone")],
}


def run(case: str, obj: Any, switch: Switch, rounds: int, clock: str, when: str = "") -> None:
    tensors = tensors_of(obj)
    ms = methods(switch, case, tensors)
    timer = time.process_time if clock == "cpu" else time.perf_counter
    times: Dict[str, List[float]] = {name: [] for name, _, _ in ms}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _name, setup, fn in ms:  # warm-up
            setup()
            fn(obj)
        for r in range(rounds):
            order = ms[r % len(ms):] + ms[:r % len(ms)]
            for name, setup, fn in order:
                setup()
                gc.collect()
                start = timer()
                out = fn(obj)
                times[name].append(timer() - start)
                del out
    switch.restore()
    print(f"{case}{when} ({clock} time, {rounds} rounds, {len(tensors)} tensors, "
          f"{sum(1 for _ in obj.modules()) if isinstance(obj, nn.Module) else 0} modules)")
    for name in times:
        print(f"  {name:>14}: {statistics.median(times[name]) * 1e3:8.2f} ms")
    for a, b in RATIOS[case]:
        if a in times and b in times:
            per_round = [x / y for x, y in zip(times[a], times[b])]
            print(f"  {a:>14} / {b:<14} {statistics.median(per_round):6.3f}x")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ref", default="main", help="the git ref whose package is 'old'")
    parser.add_argument("--rounds", type=int, default=31)
    parser.add_argument("--cases", default="module-heavy,module-heavy non-leaf,dict,big")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    parser.add_argument("--blocks", type=int, default=300, help="blocks of module-heavy")
    parser.add_argument("--big-layers", type=int, default=24)
    parser.add_argument("--big-width", type=int, default=2048, help="big: Linear(width, width)")
    parser.add_argument("--dict-n", type=int, default=1000, help="dict: how many tensors")
    parser.add_argument("--dict-size", type=int, default=8, help="dict: floats per tensor")
    parser.add_argument("--after-compile", action="store_true",
                        help="measure every case again after one torch.compile in this process")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    old = load_old(args.ref)
    switch = Switch(old)
    builders: Dict[str, Callable[[], Any]] = {
        "module-heavy": lambda: module_heavy(args.blocks),
        "module-heavy non-leaf": lambda: module_heavy_nonleaf(args.blocks),
        "dict": lambda: tensor_dict(args.dict_n, args.dict_size),
        "big": lambda: big(args.big_layers, args.big_width),
    }
    passes = [""] + ([" after torch.compile"] if args.after_compile else [])
    for when in passes:
        if when:
            switch.native()
            torch.compile(nn.Linear(4, 4), backend="eager")(torch.randn(2, 4))
        for case in args.cases.split(","):
            rounds = args.rounds if case != "big" else max(5, args.rounds // 3)
            run(case, builders[case](), switch, rounds, args.clock, when)
    switch.restore()
    return 0


if __name__ == "__main__":
    sys.exit(main())
