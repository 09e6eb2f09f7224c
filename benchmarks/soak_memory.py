"""Resident memory under a long mixed load, with the shim and the same work done natively.

Four threads and two asyncio tasks copy small models with cached activations for `--seconds`:
with the shim (every door: scopes in every mode, explicit copies, failing copies,
`find_nonleaf_tensors`, enable/disable), and natively (the same objects with their activations
detached beforehand, copied by plain `copy.deepcopy`, failing copies included).  Each arm runs
in a fresh interpreter; resident memory (RSS, from /proc/self/statm) is sampled every second.
Flat is right: the shim keeps nothing of a copy once it is over, failed or not.

    .venv/bin/python benchmarks/soak_memory.py                # 30 s per arm
    .venv/bin/python benchmarks/soak_memory.py --seconds 120
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap

ARM = textwrap.dedent(
    """
    import asyncio, copy, gc, json, os, random, sys, threading, time, warnings
    import torch, torch.nn as nn

    SHIM, SECONDS = sys.argv[1] == "shim", float(sys.argv[2])
    if SHIM:
        import deepcopy_shim
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    PAGE = os.sysconf("SC_PAGE_SIZE")

    def rss_mb():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * PAGE / 2**20

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(32, 32), nn.Linear(32, 4)
        def forward(self, x):
            self.hidden = self.a(x).relu()
            return self.b(self.hidden)

    class Fails:
        def __deepcopy__(self, memo):
            raise ValueError("cannot copy this")

    def source():
        net = Net()
        net(torch.randn(8, 32))
        if not SHIM:  # the detaching oracle: what the shim's copy amounts to
            net.hidden = net.hidden.detach().clone().requires_grad_(net.hidden.requires_grad)
        return net

    def step(rng):
        net = source()
        choice = rng.randrange(5)
        if not SHIM:
            if choice == 4:
                try:
                    copy.deepcopy({"net": net, "x": Fails()})
                except ValueError:
                    pass
            else:
                copy.deepcopy(net)
            return
        if choice == 0:
            with deepcopy_shim.enabled(rng.choice(["warn", "silent"])):
                copy.deepcopy(net)
        elif choice == 1:
            try:
                with deepcopy_shim.enabled("strict"):
                    copy.deepcopy(net)
            except deepcopy_shim.NonLeafTensorError as exc:
                str(exc)
        elif choice == 2:
            deepcopy_shim.deepcopy(net, "silent")
        elif choice == 3:
            deepcopy_shim.find_nonleaf_tensors(net)
        else:
            try:
                with deepcopy_shim.enabled("warn"):
                    copy.deepcopy({"net": net, "x": Fails()})
            except ValueError:
                pass

    def worker(seed, deadline):
        rng = random.Random(seed)
        while time.monotonic() < deadline:
            step(rng)

    async def task(seed, deadline):
        rng = random.Random(seed)
        while time.monotonic() < deadline:
            step(rng)
            await asyncio.sleep(0)

    if SHIM:
        deepcopy_shim.enable("silent")
    deadline = time.monotonic() + SECONDS
    samples = []
    def sampler():
        while time.monotonic() < deadline:
            samples.append(rss_mb())
            time.sleep(1)
    threads = [threading.Thread(target=worker, args=(i, deadline)) for i in range(4)]
    threads.append(threading.Thread(target=sampler))
    for t in threads:
        t.start()
    async def tasks():
        await asyncio.gather(task(10, deadline), task(11, deadline))
    asyncio.run(tasks())
    for t in threads:
        t.join()
    gc.collect()
    print(json.dumps({"samples": samples, "after_gc": rss_mb()}))
    """
)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="load per arm")
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if k != "DEEPCOPY_SHIM"}
    print(f"{'arm':<7} {'RSS at 3 s':>11} {'RSS at end':>11} {'growth':>9} {'after gc':>9}")
    for arm in ("native", "shim"):
        proc = subprocess.run([sys.executable, "-c", ARM, arm, str(args.seconds)], env=env,
                              capture_output=True, text=True, check=True)
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        samples = result["samples"]
        start = samples[min(3, len(samples) - 1)]
        end = samples[-1]
        print(f"{arm:<7} {start:>9.1f}MB {end:>9.1f}MB {end - start:>+7.1f}MB "
              f"{result['after_gc']:>7.1f}MB")


if __name__ == "__main__":
    main()
