"""Instructions per copy, counted by valgrind's callgrind: an A/B signal that load cannot blur.

Timings on a shared machine move by several percent from run to run; the instructions a copy
executes do not (hash seed fixed, collector off during the copies).  Each count is one process
under callgrind with collection on only inside `functools.reduce` over the timed copies, so
import, model construction and the warm-up copy are left out; the dealloc of each copy as the
next replaces it is counted (alike for every method).  Needs valgrind; ~1 minute per count.

    .venv/bin/python benchmarks/count_instructions.py                     # module-heavy, 100 blocks
    .venv/bin/python benchmarks/count_instructions.py --case non-leaf --mode warn --ref main
    .venv/bin/python benchmarks/count_instructions.py --method floor      # the hand-written floor

`--ref` copies with the package `deepcopy_shim` as committed there (see ab_module.py); without
it, with this checkout's.  `--mode native` removes nothing: it copies with the shim disabled;
`--mode installed` copies with the patch installed (`enable()`) inside a scope without the shim.
`--case plain` is `bench_copy.plain_data()`, data without a tensor.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import List, Optional

HERE = Path(__file__).resolve().parent


def inner(args: argparse.Namespace) -> None:
    import copy
    import functools
    import gc
    import warnings

    import torch

    import deepcopy_shim

    sys.path.insert(0, str(HERE))
    import ab_module
    import bench_copy
    import floor_module_heavy

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    builders = {
        "module-heavy": lambda: floor_module_heavy.module_heavy(args.blocks),
        "non-leaf": lambda: ab_module.module_heavy_nonleaf(args.blocks),
        "dict": lambda: ab_module.tensor_dict(args.dict_n, 8),
        "plain": bench_copy.plain_data,
    }
    obj = builders[args.case]()
    fn = copy.deepcopy
    shim = ab_module.load_old(args.ref) if args.ref else deepcopy_shim
    if args.method == "floor":
        fn = floor_module_heavy.copy_model
    elif args.mode == "installed":  # the patch installed, no mode where the copies are made
        shim.enable("warn")
        off = shim.enabled("off")
        off.start()
    elif args.mode != "native":
        shim.enable(args.mode)
    fn(obj)
    gc.collect()
    gc.disable()
    functools.reduce(lambda previous, _: fn(obj), range(args.copies), None)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--case", choices=("module-heavy", "non-leaf", "dict", "plain"),
                        default="module-heavy")
    parser.add_argument("--mode", choices=("silent", "warn", "strict", "native", "installed"),
                        default="silent")
    parser.add_argument("--method", choices=("deepcopy", "floor"), default="deepcopy")
    parser.add_argument("--ref", default=None, help="copy with the package as at this git ref")
    parser.add_argument("--blocks", type=int, default=100)
    parser.add_argument("--dict-n", type=int, default=1000)
    parser.add_argument("--copies", type=int, default=5)
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.inner:
        inner(args)
        return 0
    command = [
        "valgrind", "--tool=callgrind", "--collect-atstart=no", "--toggle-collect=functools_reduce",
        "--callgrind-out-file=/dev/null", sys.executable, __file__, "--inner", *(argv or sys.argv[1:]),
    ]
    result = subprocess.run(command, capture_output=True, text=True,
                            env={**os.environ, "PYTHONHASHSEED": "0"})
    found = re.search(r"Collected : (\d+)", result.stderr)
    if result.returncode != 0 or found is None:
        print(result.stderr[-2000:], file=sys.stderr)
        return 1
    per_copy = int(found.group(1)) / args.copies
    what = args.method if args.method == "floor" else f"{args.mode}" + (f" ({args.ref})" if args.ref else "")
    print(f"{args.case}, {what}: {per_copy / 1e6:.2f}M instructions per copy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
