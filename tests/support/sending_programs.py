"""Child programs for the tests of sending to another process, and what their children run.

Run as ``python -m support.sending_programs PROGRAM START_METHOD`` from ``tests/`` (so that spawn
and forkserver children import this module again, as ``__mp_main__``), the mode given by
``DEEPCOPY_SHIM`` alone: nothing here imports deepcopy_shim, so each program is a user's program
with no change of code.  A program prints one line ``RESULT <json>`` at its end: what arrived
where, and what was raised (see ``outcome``).  Every wait has a time limit: a hang ends in an
error here, and the test's own subprocess limit ends the rest.

Programs:

* ``queues``: a ``SimpleQueue`` put in the sending process; a ``Queue`` put and got in the
  sending process; a ``Queue`` to a child (leaves and a parameter, then tensors with history and
  non-leaf views of one storage, then an end mark: a dropped item is seen as the end mark coming
  first), the child writing into everything it received; a ``Process`` whose arguments hold a
  module caching an activation (spawn and forkserver; fork pickles nothing); a ``Pool`` whose
  arguments, then whose results, have history.
* ``tm_spawn``: ``torch.multiprocessing.spawn`` of a hook-based ``weight_norm`` Linear after a
  forward with grad and of a module caching its output.
* ``dataloader``: a ``DataLoader`` with 2 workers over samples with history, with the default
  collate, a custom collate and ``batch_size=None``; under spawn also a dataset holding a tensor
  with history, which is sent to the workers.
"""

from __future__ import annotations

import json
import os
import queue
import sys
import tempfile
import traceback
from typing import Any, Dict, List, Optional

import torch
import torch.multiprocessing as tmp
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

WAIT = 180  # seconds any one wait may take, child start-up (a torch import) included


def describe(tensor: torch.Tensor) -> Dict[str, Any]:
    return {
        "type": type(tensor).__name__, "leaf": tensor.is_leaf, "requires_grad": tensor.requires_grad,
        "grad_fn": type(tensor.grad_fn).__name__ if tensor.grad_fn is not None else None,
        "values": tensor.tolist(), "dtype": str(tensor.dtype), "shape": list(tensor.shape),
        "device": str(tensor.device), "shared": tensor.is_shared(),
    }


def outcome(error: BaseException) -> Dict[str, Any]:
    """An error as the tests read it: its class, words and paths, and its cause's."""
    cause = error.__cause__
    return {
        "error": type(error).__name__, "message": str(error),
        "paths": list(getattr(error, "paths", []) or []),
        "cause": type(cause).__name__ if cause is not None else None,
        "cause_message": str(cause) if cause is not None else None,
    }


class CachingNet(nn.Module):
    """Keeps its last output: a tensor with history after a forward with grad."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.last = self.fc(x)
        return self.last


def caching_net() -> CachingNet:
    torch.manual_seed(0)
    net = CachingNet()
    with torch.enable_grad():
        net(torch.ones(1, 3))
    assert not net.last.is_leaf
    return net


def weight_normed() -> nn.Linear:
    """A hook-based weight_norm Linear after a forward with grad: its `weight` has history."""
    torch.manual_seed(0)
    layer = torch.nn.utils.weight_norm(nn.Linear(3, 2))
    with torch.enable_grad():
        layer(torch.ones(1, 3))
    assert not layer.weight.is_leaf
    return layer


# --- what the children run -------------------------------------------------------------------


def receive(inbox: Any, outbox: Any) -> None:
    """Describe what arrives until the end mark, writing into every tensor received; then report."""
    report: Dict[str, Any] = {"order": []}
    while True:
        item = inbox.get(timeout=WAIT)
        report["order"].append(item[0])
        if item[0] == "end":
            break
        if item[0] == "leaves":
            _, leaf, parameter = item
            report["leaf"], report["parameter"] = describe(leaf), describe(parameter)
            report["parameter_is_parameter"] = isinstance(parameter, nn.Parameter)
            with torch.no_grad():
                leaf.add_(1)
                parameter.add_(1)
        elif item[0] == "history":
            _, sent, (first, rest) = item
            report["history"] = describe(sent)
            report["views"] = {
                "first": describe(first), "rest": describe(rest),
                "one_storage": first.untyped_storage().data_ptr() == rest.untyped_storage().data_ptr(),
                "offsets": [first.storage_offset(), rest.storage_offset()],
                "strides": [list(first.stride()), list(rest.stride())],
            }
            with torch.no_grad():
                sent.add_(100)
                first.add_(100)
    outbox.put(report)


def receive_arguments(net: CachingNet, outbox: Any) -> None:
    outbox.put({"last": describe(net.last), "out": net(torch.ones(1, 3)).tolist()})


def describe_remote(tensor: torch.Tensor) -> Dict[str, Any]:
    return describe(tensor)


def make_history(scale: int) -> torch.Tensor:
    with torch.enable_grad():
        return torch.ones(2, requires_grad=True) * scale


def check_models(rank: int, normed: nn.Linear, net: CachingNet, path: str) -> None:
    """torch.multiprocessing.spawn's function: what arrived, written to `path`."""
    with open(path, "w") as out:
        json.dump({"weight": describe(normed.weight), "last": describe(net.last),
                   "normed_out": normed(torch.ones(1, 3)).tolist(),
                   "net_out": net(torch.ones(1, 3)).tolist()}, out)


class HistoryDataset(Dataset):  # type: ignore[type-arg]
    """Samples with history: `w * (i + 1)`, `w` a leaf that requires grad; each sample's index is
    put on `fetched` as it is made."""

    def __init__(self, size: int, fetched: Any) -> None:
        self.w = torch.ones(3, requires_grad=True)
        self.size = size
        self.fetched = fetched

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        self.fetched.put(index)
        return self.w * (index + 1)


class HoldingDataset(Dataset):  # type: ignore[type-arg]
    """A dataset holding a tensor with history (`cached`), whose samples say what it is in the worker."""

    def __init__(self) -> None:
        with torch.enable_grad():
            self.cached = torch.ones(3, requires_grad=True) * 2

    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> torch.Tensor:
        cached = self.cached
        return torch.tensor([float(cached.is_leaf), float(cached.requires_grad),
                             float(cached.detach().sum())])


def as_list(batch: List[torch.Tensor]) -> List[torch.Tensor]:
    return list(batch)


def pool_result(pool: Any, function: Any, arguments: List[Any]) -> Any:
    try:
        return pool.map_async(function, arguments).get(timeout=WAIT)
    except Exception as exc:
        return outcome(exc)


# --- the programs ----------------------------------------------------------------------------


def queues(method: str) -> Dict[str, Any]:
    ctx = tmp.get_context(method)
    out: Dict[str, Any] = {}
    with torch.enable_grad():
        w = torch.ones(3, requires_grad=True)
        history = w * 2
        base = w * 3
        views = (base[0:1], base[1:])
    leaf, parameter = torch.zeros(2), nn.Parameter(torch.zeros(2))

    simple = ctx.SimpleQueue()
    try:
        simple.put(history)
        out["simple"] = describe(simple.get())
    except Exception as exc:
        out["simple"] = outcome(exc)

    here = ctx.Queue()
    here.put(history)
    try:
        out["same_process"] = describe(here.get(timeout=3))
    except queue.Empty:
        out["same_process"] = "timed out"

    inbox, outbox = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=receive, args=(inbox, outbox))
    child.start()
    inbox.put(("leaves", leaf, parameter))
    inbox.put(("history", history, views))
    inbox.put(("end",))
    out["child"] = outbox.get(timeout=WAIT)
    child.join(WAIT)
    out["leaf_shared"], out["leaf_after"] = leaf.is_shared(), leaf.tolist()
    out["parameter_after"] = parameter.tolist()
    out["history_after"] = history.tolist()
    history.sum().backward()
    out["w_grad"] = w.grad.tolist() if w.grad is not None else None

    if method != "fork":  # a forked child gets its arguments by inheritance: nothing is sent
        results = ctx.Queue()
        process = ctx.Process(target=receive_arguments, args=(caching_net(), results))
        try:
            process.start()
        except Exception as exc:
            out["process"] = outcome(exc)
        else:
            out["process"] = results.get(timeout=WAIT)
            process.join(WAIT)

    with ctx.Pool(1) as pool:
        with torch.enable_grad():
            argument = torch.ones(2, requires_grad=True) * 5
        out["pool_arguments"] = pool_result(pool, describe_remote, [argument])
        results = pool_result(pool, make_history, [7])
        out["pool_results"] = results if isinstance(results, dict) else describe(results[0])
    return out


def tm_spawn(method: str) -> Dict[str, Any]:
    normed, net = weight_normed(), caching_net()
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "arrived.json")
        try:
            if method == "spawn":
                tmp.spawn(check_models, args=(normed, net, path), nprocs=1, join=True)
            else:
                tmp.start_processes(check_models, args=(normed, net, path), nprocs=1, join=True,
                                    start_method=method)
        except Exception as exc:
            return {"spawn": outcome(exc)}
        with open(path) as arrived:
            out: Dict[str, Any] = json.load(arrived)
    out["normed_out_here"] = normed(torch.ones(1, 3)).tolist()
    out["net_out_here"] = net(torch.ones(1, 3)).tolist()
    return out


def dataloader(method: str) -> Dict[str, Any]:
    # Where a batch is expected to be dropped (no mode, or strict), the loader's own time limit
    # says so, once the workers have made every sample (they are then sent or dropped at once);
    # elsewhere it only stops a hang.
    dropping = os.environ.get("DEEPCOPY_SHIM", "off") in ("off", "strict")
    out: Dict[str, Any] = {}
    for name, options in (("default", {"batch_size": 2}),
                          ("custom", {"batch_size": 2, "collate_fn": as_list}),
                          ("unbatched", {"batch_size": None})):
        timeout = 3 if dropping and name != "default" else WAIT
        fetched = tmp.get_context(method).Queue()
        loader = DataLoader(HistoryDataset(4, fetched), num_workers=2, multiprocessing_context=method,
                            timeout=timeout, **options)  # type: ignore[arg-type]
        out[name] = _load(loader, fetched)
    if method != "fork":
        loader = DataLoader(HoldingDataset(), num_workers=2, batch_size=2, multiprocessing_context=method,
                            timeout=WAIT)
        out["held"] = _load(loader)
    return out


def _load(loader: DataLoader, fetched: Any = None) -> Any:  # type: ignore[type-arg]
    """Every batch of `loader`, described; or the error that ended the loading.  With `fetched`
    (its dataset's queue), the first batch is waited for once the workers made all 4 samples
    (2 workers each prefetch 2 indices)."""
    try:
        batches = iter(loader)
        if fetched is not None:
            assert sorted(fetched.get(timeout=WAIT) for _ in range(4)) == [0, 1, 2, 3]
        return [_batch(batch) for batch in batches]
    except Exception as exc:
        return outcome(exc)


def _batch(batch: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        return describe(batch)
    return [describe(sample) for sample in batch]


def cuda_receive(inbox: Any, outbox: Any, count: int) -> None:
    """Receive `count` CUDA tensors, each checked and dropped at once; report what was wrong."""
    wrong: Optional[str] = None
    for index in range(count):
        tensor = inbox.get(timeout=WAIT)
        if wrong is None and not (tensor.is_leaf and tensor.requires_grad and tensor.is_cuda
                                  and float(tensor.detach().sum()) == 2.0 * tensor.numel()):
            wrong = f"item {index}: {describe(tensor)}"
        del tensor
    torch.cuda.synchronize()
    outbox.put(wrong)


PROGRAMS = {"queues": queues, "tm_spawn": tm_spawn, "dataloader": dataloader}


def main(argv: List[str]) -> int:
    program, method = argv
    try:
        result = PROGRAMS[program](method)
    except BaseException:
        traceback.print_exc()
        return 1
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
