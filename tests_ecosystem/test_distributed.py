"""Distributed copies (issue 27): torchrun with 2 ranks on gloo (CPU, loopback), activated by
`DEEPCOPY_SHIM` alone, as a training job is: a DTensor with history copied (its placements and
mesh kept), the `copy.deepcopy(ddp.module)` EMA idiom on a module caching an activation, and
FSDP2's own refusal of deep copies passing through unchanged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = '''"""Run under torchrun (2 ranks, gloo, CPU), activated by DEEPCOPY_SHIM alone."""
import copy, json, os, sys
import torch
import torch.nn as nn
import torch.distributed as dist

assert "deepcopy_shim" in sys.modules, "not activated by DEEPCOPY_SHIM"
import deepcopy_shim  # noqa: E402  (already imported at start-up)
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
report = {"rank": rank, "mode": str(deepcopy_shim.current_mode().mode)}

# (a) a DTensor with history: copied detached, its placements and mesh kept
mesh = init_device_mesh("cpu", (2,))
leaf = distribute_tensor(torch.arange(8.0).reshape(4, 2).requires_grad_(True), mesh, [Shard(0)])
with_history = leaf * 2
assert with_history.grad_fn is not None
with deepcopy_shim.enabled("off"):
    try:
        copy.deepcopy(with_history)
        report["dtensor_native"] = "copied"
    except RuntimeError as exc:
        report["dtensor_native"] = "graph leaves" if "graph leaves" in str(exc) else repr(exc)
made = copy.deepcopy(with_history)
report["dtensor"] = {
    "type": type(made).__name__,
    "placements_kept": tuple(made.placements) == tuple(with_history.placements),
    "mesh_kept": made.device_mesh == with_history.device_mesh,
    "leaf": made.grad_fn is None and made.is_leaf,
    "requires_grad": made.requires_grad,
    "values": torch.equal(made.to_local(), with_history.to_local().detach()),
    "own_storage": made.to_local().data_ptr() != with_history.to_local().data_ptr(),
}
replicated = distribute_tensor(torch.ones(3, requires_grad=True), mesh, [Replicate()]) + 1
report["dtensor_replicated"] = copy.deepcopy(replicated).placements == replicated.placements

# (b) the EMA idiom: copy.deepcopy(ddp.module) of a module caching an activation
class Caches(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        self.last = self.fc(x).relu()
        return self.last.sum()

ddp = DDP(Caches())
ddp(torch.randn(2, 4)).backward()
ema = copy.deepcopy(ddp.module)
report["ema"] = {
    "cache_leaf": ema.last.grad_fn is None and ema.last.is_leaf,
    "params_equal": all(torch.equal(a, b) for a, b in zip(ema.parameters(), ddp.module.parameters())),
    "params_own": all(a.data_ptr() != b.data_ptr()
                      for a, b in zip(ema.parameters(), ddp.module.parameters())),
}
with torch.no_grad():
    for e, p in zip(ema.parameters(), ddp.module.parameters()):
        e.mul_(0.9).add_(p, alpha=0.1)

# (c) FSDP2's own refusal of deepcopy passes through unchanged
try:
    from torch.distributed.fsdp import fully_shard
except ImportError:  # older torch
    from torch.distributed._composable.fsdp import fully_shard
sharded = fully_shard(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2)), mesh=mesh)
outcomes = []
for mode in ("off", "warn"):
    with deepcopy_shim.enabled(mode):
        try:
            copy.deepcopy(sharded)
            outcomes.append("copied")
        except Exception as exc:
            outcomes.append(f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}")
report["fsdp2"] = outcomes

with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
    json.dump(report, f)
dist.destroy_process_group()
'''


def test_distributed_copies_under_torchrun(tmp_path: Path) -> None:
    script = tmp_path / "dist_copies.py"
    script.write_text(SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH",)}
    env.update(DEEPCOPY_SHIM="silent", GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    # `python -m torch.distributed.run` is what the `torchrun` script runs; each rank is a
    # fresh interpreter of this environment, activated by the .pth hook and the variable.
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node=2", str(script), str(out)],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for rank in (0, 1):
        report = json.loads((out / f"rank{rank}.json").read_text())
        assert report["rank"] == rank and report["mode"] == "silent"
        assert report["dtensor_native"] == "graph leaves"  # what the shim is for, on DTensors too
        assert report["dtensor"] == {
            "type": "DTensor", "placements_kept": True, "mesh_kept": True, "leaf": True,
            "requires_grad": True, "values": True, "own_storage": True}
        assert report["dtensor_replicated"] is True
        assert report["ema"] == {"cache_leaf": True, "params_equal": True, "params_own": True}
        native, shimmed = report["fsdp2"]
        assert native != "copied" and shimmed == native  # FSDP2's own refusal, unchanged

