"""Nothing the shim raises or warns can hang a program: every exception and warning class of the
package round-trips through pickle with its message and fields.

multiprocessing sends a worker's exception back to the parent by pickling it; one that does not
survive the round trip kills the parent's result-handler thread, and `Pool.map()` never returns.
Tensors an error or warning names are held weakly and cannot be pickled: they come back absent.
"""

from __future__ import annotations

import pickle
import sys
import textwrap
from typing import Any, List

import pytest
import torch
from support.models import with_history
from support.processes import clean_env, describe, run_code

import deepcopy_shim
from deepcopy_shim import (
    DeepcopyShimWarning,
    DetachedCopyError,
    DetachedTensorsWarning,
    Mode,
    ModeValueError,
    NonLeafTensorError,
    PatchConflictWarning,
    TorchCompatibilityWarning,
)


def _made(tensor: torch.Tensor) -> List[Any]:
    return [
        DeepcopyShimWarning("deepcopy_shim: a note"),
        PatchConflictWarning("deepcopy_shim: someone else's patch"),
        TorchCompatibilityWarning("deepcopy_shim: torch 9.9"),
        DetachedTensorsWarning("deepcopy_shim: detached", ["a.b", "c"], [tensor, tensor]),
        NonLeafTensorError("deepcopy_shim: refused", paths=["a.b"], mode=Mode.STRICT, tensors=[tensor]),
        DetachedCopyError("deepcopy_shim: cannot", path="a.b"),
        ModeValueError("deepcopy_shim: invalid mode 'x'"),
    ]


def _fields(made: Any) -> Any:
    fields = {name: getattr(made, name) for name in ("paths", "path", "mode") if hasattr(made, name)}
    tensors = getattr(made, "tensors", None)
    return type(made), str(made), made.args, fields, None if tensors is None else len(tensors)


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_every_exception_and_warning_round_trips_through_pickle(protocol: int) -> None:
    tensor = with_history()  # alive while the test runs: the errors hold it weakly
    for made in _made(tensor):
        loaded = pickle.loads(pickle.dumps(made, protocol))
        assert _fields(loaded) == _fields(made)
        if hasattr(made, "tensors"):
            assert made.tensors[0] is not None and loaded.tensors == (None,) * len(made.tensors)


def test_a_refusal_and_a_warning_made_by_a_copy_round_trip_with_their_words() -> None:
    root = {"t": with_history()}
    with pytest.raises(NonLeafTensorError) as info:
        deepcopy_shim.deepcopy(root, "strict")
    with pytest.warns(DetachedTensorsWarning) as caught:
        deepcopy_shim.deepcopy(root, "warn")
    for made in (info.value, caught[0].message):
        loaded = pickle.loads(pickle.dumps(made))
        assert str(loaded) == str(made) and loaded.paths == made.paths == ("['t']",)


_WORKER = textwrap.dedent(
    """
    import copy, multiprocessing as mp, sys, torch, deepcopy_shim

    class Sub(torch.Tensor):  # torch cannot deep-copy it even as a leaf
        __torch_function__ = torch._C._disabled_torch_function_impl

    def work(mode):
        deepcopy_shim.enable(mode)
        copy.deepcopy({"sub": (torch.ones(2, requires_grad=True) * 2).as_subclass(Sub)})

    if __name__ == "__main__":
        with mp.get_context("fork").Pool(1) as pool:
            try:
                pool.map_async(work, [sys.argv[1]]).get(timeout=60)
            except mp.TimeoutError:
                print("HUNG")
            except Exception as error:
                print(type(error).__name__, getattr(error, "path", None))
                print(str(error).splitlines()[0])
    """
)


@pytest.mark.skipif(sys.platform == "win32", reason="fork")
@pytest.mark.parametrize("mode", ["silent", "warn"])
def test_a_detached_copy_error_in_a_pool_worker_reaches_the_parent(mode: str) -> None:
    done = run_code(sys.executable, _WORKER.replace('sys.argv[1]', repr(mode)), clean_env(), timeout=120)
    assert done.returncode == 0, describe(done)
    lines = done.stdout.splitlines()
    expected = ["DetachedCopyError ['sub']",
                "deepcopy_shim: cannot deep-copy ['sub'], a tensor with autograd history:"]
    assert lines == expected, describe(done)


def test_the_tensors_a_warning_names_are_the_sources_until_pickled() -> None:
    tensor = with_history()
    warning = DetachedTensorsWarning("m", ["t"], [tensor])
    assert warning.tensors == (tensor,)
    assert torch.is_tensor(warning.tensors[0])
