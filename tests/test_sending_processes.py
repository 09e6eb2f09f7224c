"""Sending to real processes in each mode: queues, pools, process arguments, torch.multiprocessing
spawn and DataLoader workers, under fork, spawn and forkserver.

Each case runs a child program of ``support/sending_programs.py`` with ``DEEPCOPY_SHIM`` set to the
mode (unset: off), so the mode reaches the program and every child it starts as it does a user's:
no line of the program names the shim (``PYTHONPATH``, where set, is kept: the children import the
package under test).  Every program runs once per start method and mode, with a hard time limit
(`run_bounded`: past it the program and every process it started are killed and the test fails);
each of its waits has its own (a dropped item ends a wait with an error, never a hang).  In mode
off each test first checks torch's own behaviour, which is what the modes change.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any, Dict, Tuple

import pytest
from support.processes import DEV_PYTHON, REPO, describe, run_bounded, same_code_env

MODES = ("off", "warn", "strict", "silent")
TORCH_WORDS = "Cowardly refusing to serialize non-leaf tensor which requires_grad"
AUTOGRAD_WORDS = "functions with out=... arguments don't support automatic differentiation"
# Seconds one program may run, every process it starts included: past it, all are killed and the
# test fails (see `run_bounded`).  The slowest, `dataloader` under spawn, takes about 40 s on a
# 2-core machine.
HARD_LIMIT = 300
_runs: Dict[Tuple[str, str, str], Tuple[Dict[str, Any], str]] = {}


def program(name: str, method: str, mode: str) -> Tuple[Dict[str, Any], str]:
    """The result and stderr of `python -m support.sending_programs name method` in `mode`, run once."""
    key = (name, method, mode)
    if key not in _runs:
        proc = run_bounded([DEV_PYTHON, "-m", "support.sending_programs", name, method],
                           cwd=REPO / "tests", env=same_code_env(None if mode == "off" else mode),
                           timeout=HARD_LIMIT)
        assert proc.returncode == 0, describe(proc)
        results = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        assert len(results) == 1, describe(proc)
        _runs[key] = (json.loads(results[0][len("RESULT "):]), proc.stderr)
    return _runs[key]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads a process's state in /proc")
def test_a_program_that_hangs_fails_and_leaves_no_process_behind(tmp_path: Path) -> None:
    """The hard limit itself: a program whose child never ends (and holds its pipes) fails the
    test at the limit, and both are gone."""
    pid_file = tmp_path / "child.pid"
    hanging = (f"import subprocess, sys, time\n"
               f"child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
               f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
               f"time.sleep(600)\n")
    started = time.monotonic()
    with pytest.raises(AssertionError, match="hung: killed after 8 s"):
        run_bounded([DEV_PYTHON, "-c", hanging], env=same_code_env(), timeout=8)
    assert time.monotonic() - started < 60
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (killed, not yet reaped by init) is gone for this purpose
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def assert_leaf(arrived: Dict[str, Any], values: Any, requires_grad: bool = True) -> None:
    assert arrived["leaf"] and arrived["grad_fn"] is None and arrived["requires_grad"] is requires_grad
    assert arrived["values"] == values and arrived["dtype"] == "torch.float32"


def assert_refused_by_torch(outcome: Dict[str, Any]) -> None:
    assert outcome["error"] == "RuntimeError" and outcome["message"].startswith(TORCH_WORDS), outcome


def assert_refused_by_the_shim(outcome: Dict[str, Any], paths: Any) -> None:
    assert outcome["error"] == "NonLeafTensorError", outcome
    assert outcome["paths"] == paths
    assert outcome["cause"] == "RuntimeError" and outcome["cause_message"].startswith(TORCH_WORDS)
    assert "Mode 'strict' is set by DEEPCOPY_SHIM=strict." in " ".join(outcome["message"].split())


def shim_lines(stderr: str) -> list:
    return [line for line in stderr.splitlines() if "deepcopy_shim" in line]


def warnings_in(stderr: str) -> list:
    return re.findall(r"DetachedTensorsWarning: (deepcopy_shim: [^\n]*)", stderr)


# --- queues, pools and process arguments ------------------------------------------------------

METHODS = ("fork", "spawn", "forkserver")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("method", METHODS)
def test_a_queue_to_a_child(method: str, mode: str) -> None:
    """Leaves and parameters go as torch sends them (shared memory: the child's writes show here).
    Tensors with history: natively the queue's feeder thread prints torch's error and drops the
    item (the end mark comes first); strict does the same with the shim's refusal; warn and silent
    deliver leaves of their own (the child's writes do not show here) whose views share a storage."""
    result, stderr = program("queues", method, mode)
    child = result["child"]
    assert child["leaf"]["shared"] and child["parameter_is_parameter"]
    assert child["parameter"]["requires_grad"] and result["leaf_shared"]
    assert result["leaf_after"] == [1.0, 1.0] and result["parameter_after"] == [1.0, 1.0]
    assert result["history_after"] == [2.0, 2.0, 2.0] and result["w_grad"] == [2.0, 2.0, 2.0]
    if mode in ("off", "strict"):
        assert child["order"] == ["leaves", "end"]  # the item with history was dropped
        assert f"RuntimeError: {TORCH_WORDS}" in stderr
        if mode == "off":
            assert "NonLeafTensorError" not in stderr and "deepcopy_shim" not in stderr
        else:
            printed = stderr.split("deepcopy_shim.NonLeafTensorError: ")[1:]  # by the feeder threads
            (refusal,) = [text for text in printed
                          if text.startswith("deepcopy_shim: refused to send a tuple")]
            assert refusal.startswith("deepcopy_shim: refused to send a tuple holding 3 tensors with "
                                      "autograd history to another process:\n"
                                      "  [1]: grad_fn=MulBackward0, shape=(3,)")
            assert "\n  [2][0]: grad_fn=SliceBackward0" in refusal
            assert "\n  [2][1]: grad_fn=SliceBackward0" in refusal
        return
    assert child["order"] == ["leaves", "history", "end"]
    assert_leaf(child["history"], [2.0, 2.0, 2.0])
    views = child["views"]
    assert views["one_storage"] and views["offsets"] == [0, 1] and views["strides"] == [[1], [1]]
    assert_leaf(views["first"], [3.0]) and assert_leaf(views["rest"], [3.0, 3.0])
    if mode == "warn":
        assert "sending a tuple to another process detached 3 tensors with autograd history:" in stderr
    else:
        assert shim_lines(stderr) == []


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("method", METHODS)
def test_a_simple_queue_and_a_queue_in_the_sending_process(method: str, mode: str) -> None:
    """`SimpleQueue.put` pickles in the caller: it raises (strict: the shim's refusal, torch's error
    its cause); a `Queue` item with history is dropped by its feeder, `get` times out."""
    result, _ = program("queues", method, mode)
    if mode == "off":
        assert_refused_by_torch(result["simple"])
        assert result["same_process"] == "timed out"
    elif mode == "strict":
        assert_refused_by_the_shim(result["simple"], [""])
        assert result["same_process"] == "timed out"
    else:
        assert_leaf(result["simple"], [2.0, 2.0, 2.0])
        assert_leaf(result["same_process"], [2.0, 2.0, 2.0])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("method", ("spawn", "forkserver"))
def test_process_arguments(method: str, mode: str) -> None:
    """A spawn or forkserver child's arguments are pickled in `start()`, where torch raises."""
    result, stderr = program("queues", method, mode)
    if mode == "off":
        assert_refused_by_torch(result["process"])
    elif mode == "strict":
        assert_refused_by_the_shim(result["process"], ["_args[0].last"])
    else:
        assert_leaf(result["process"]["last"], result["process"]["out"])
    if mode == "warn":
        process = {"spawn": "SpawnProcess", "forkserver": "ForkServerProcess"}[method]
        assert f"sending a {process} to another process detached 1 tensor with autograd history:\n" \
               "  _args[0].last: grad_fn=AddmmBackward0" in stderr


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("method", METHODS)
def test_a_pool_with_arguments_and_results_with_history(method: str, mode: str) -> None:
    """Arguments are pickled by the pool's handler thread (the error reaches `get`); results by the
    worker (natively a `MaybeEncodingError`)."""
    result, _ = program("queues", method, mode)
    arguments, results = result["pool_arguments"], result["pool_results"]
    if mode == "off":
        assert_refused_by_torch(arguments)
        assert results["error"] == "MaybeEncodingError" and TORCH_WORDS in results["message"]
    elif mode == "strict":
        assert_refused_by_the_shim(arguments, ["[3][0][1][0]"])
        assert results["error"] == "MaybeEncodingError"
        assert "NonLeafTensorError(\"deepcopy_shim: refused to send a tuple holding 1 tensor" \
               in results["message"]
    else:
        assert_leaf(arguments[0], [5.0, 5.0])
        assert_leaf(results, [7.0, 7.0])


# --- torch.multiprocessing.spawn, by DEEPCOPY_SHIM alone --------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_torch_multiprocessing_spawn_of_weight_norm_and_a_caching_module(mode: str) -> None:
    """A hook-based weight_norm Linear after a forward with grad (its `weight` has history) and a
    module caching its output, as `torch.multiprocessing.spawn` arguments."""
    result, stderr = program("tm_spawn", "spawn", mode)
    paths = ["_args[2][0].weight", "_args[2][1].last"]
    if mode == "off":
        assert_refused_by_torch(result["spawn"])
        return
    if mode == "strict":
        assert_refused_by_the_shim(result["spawn"], paths)
        return
    assert_leaf(result["weight"], result["weight"]["values"])
    assert_leaf(result["last"], result["last"]["values"])
    for name in ("normed_out", "net_out"):
        assert result[name][0] == pytest.approx(result[f"{name}_here"][0])  # the same model arrived
    if mode == "warn":
        assert warnings_in(stderr) == ["deepcopy_shim: sending a SpawnProcess to another process "
                                       "detached 2 tensors with autograd history:"]
        assert "\n  _args[2][0].weight: grad_fn=WeightNormInterfaceBackward0" in stderr
    else:
        assert shim_lines(stderr) == []


# --- DataLoader workers -----------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("method", ("fork", "spawn"))
def test_dataloader_workers_with_the_default_collate(method: str, mode: str) -> None:
    """Natively the worker's stack into shared memory refuses samples with history; in warn and
    silent the batch is their detached copies' (a leaf that requires grad), strict refuses it."""
    result, stderr = program("dataloader", method, mode)
    default = result["default"]
    if mode == "off":
        assert default["error"] == "RuntimeError" and AUTOGRAD_WORDS in default["message"]
        return
    if mode == "strict":
        assert default["error"] == "NonLeafTensorError"
        assert "deepcopy_shim: refused to collate 2 tensors with autograd history in a DataLoader worker" \
               in default["message"] and AUTOGRAD_WORDS in default["message"]
        return
    assert [batch["values"] for batch in default] == [[[1.0] * 3, [2.0] * 3], [[3.0] * 3, [4.0] * 3]]
    for batch in default:
        assert_leaf(batch, batch["values"])
        assert batch["shared"]
    said = "a DataLoader worker's default collate detached 2 tensors with autograd history"
    assert (said in stderr) is (mode == "warn")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("method", ("fork", "spawn"))
def test_dataloader_workers_with_a_custom_collate_and_without_batching(method: str, mode: str) -> None:
    """The samples are sent as they are: natively the worker's feeder drops them and the loader
    times out; strict does the same, saying why; warn and silent deliver leaves."""
    result, stderr = program("dataloader", method, mode)
    for name in ("custom", "unbatched"):
        loaded = result[name]
        if mode in ("off", "strict"):
            assert loaded["error"] == "RuntimeError"
            assert "DataLoader timed out after 3 seconds" in loaded["message"]
            continue
        samples = [sample for batch in loaded for sample in (batch if isinstance(batch, list) else [batch])]
        assert [sample["values"] for sample in samples] == [[float(i)] * 3 for i in range(1, 5)]
        for sample in samples:
            assert_leaf(sample, sample["values"])
    if mode == "off":
        assert f"RuntimeError: {TORCH_WORDS}" in stderr and "deepcopy_shim" not in stderr
    elif mode == "strict":
        assert "deepcopy_shim: refused to send a tuple holding 2 tensors with autograd history" in stderr


@pytest.mark.parametrize("mode", MODES)
def test_a_dataset_holding_a_tensor_with_history_sent_to_spawn_workers(mode: str) -> None:
    result, _ = program("dataloader", "spawn", mode)
    held = result["held"]
    if mode == "off":
        assert_refused_by_torch(held)
    elif mode == "strict":
        # The worker process's second argument is the dataset; torch 2.14 passes it in a list
        # (`dataset_holder`) that the worker can empty: the path follows what torch sends.
        from torch.utils.data._utils.worker import _worker_loop
        holder = list(inspect.signature(_worker_loop).parameters)[1] == "dataset_holder"
        assert_refused_by_the_shim(held, ["_args[1][0].cached" if holder else "_args[1].cached"])
    else:  # each worker's dataset holds a leaf copy: is_leaf, requires_grad, the values' sum
        assert [batch["values"] for batch in held] == [[[1.0, 1.0, 6.0], [1.0, 1.0, 6.0]]]
