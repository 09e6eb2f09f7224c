"""Where the tensors with history of a send sit: a survey of the send that shares and copies no data.

torch's multiprocessing pickler is the C pickler: no Python frame says which object it is saving
when torch's tensor reducer meets a tensor with autograd history.  A survey finds out by pickling
the object sent again, with the pure-Python pickler (`pickle._Pickler`), to a sink that keeps
nothing, with the send's protocol and `ForkingPickler`'s reducers, except:

- torch's tensor reducer (or the shim's wrapper of it) is a stub that records a tensor with
  history, with its node (the objects being saved, from the object sent down to it: see
  `_record`), and reduces every tensor to nothing;
- torch's other reducers (storages, CUDA events) and multiprocessing's own resource reducers
  (connections, sockets: they hand out file descriptors) reduce to nothing as well.

So no shared memory is made, no tensor data is copied and no descriptor is duplicated; every
other object is reduced as the send reduces it (its `__reduce_ex__`, `__getstate__`, copyreg
and third-party reducers run again), so the survey takes the send's own way to each tensor.
Pickle's memo saves an object once: each tensor is recorded once, where the send meets it first.
Only a send that met a tensor with history is surveyed (see `_sending`).
"""

from __future__ import annotations

import pickle
from multiprocessing.reduction import ForkingPickler
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from ._record import Node

__all__ = ["Met", "survey"]

__tracebackhide__ = True

# One tensor with history met by the survey: (tensor, its node).
Met = Tuple[torch.Tensor, Node]
# What every stubbed reducer returns: rebuilt as `tuple()`, written as two opcodes.
_NOTHING: Tuple[Any, Tuple[()]] = (tuple, ())
# multiprocessing's reducers that reduce an object to others (a bound method to its object, a
# partial to its function and arguments), which may lead to tensors: they run as in the send.
# Its other reducers send resources (file descriptors), which hold no tensor: stubbed.
_MULTIPROCESSING_PURE = ("_reduce_method", "_reduce_method_descriptor", "_reduce_partial")
_TORCH_REDUCTIONS = "torch.multiprocessing.reductions"
# The pure-Python pickler's own `save`, which the survey's runs around (typeshed does not list it).
_save: Callable[..., None] = vars(pickle._Pickler)["save"]


class _Sink:
    """A file that keeps nothing written to it."""

    def write(self, data: Any) -> None:
        pass


class _Survey(pickle._Pickler):
    """The pure-Python pickler with the survey's reducers, keeping the node of the object it
    saves (`node`) and the tensors with history it meets (`met`)."""

    def __init__(self, protocol: Optional[int], reducers: Dict[type, Callable[[Any], Any]]) -> None:
        super().__init__(_Sink(), protocol)
        self.node: Optional[Node] = None
        self.met: List[Met] = []
        table = dict(ForkingPickler._copyreg_dispatch_table)  # type: ignore[attr-defined]
        from torch.multiprocessing.reductions import reduce_tensor

        for cls, reducer in list(reducers.items()):
            if reducer is reduce_tensor or getattr(reducer, "__wrapped__", None) is reduce_tensor:
                table[cls] = self._tensor
            elif _stubbed(reducer):
                table[cls] = _nothing
            else:
                table[cls] = reducer
        self.dispatch_table = table

    def save(self, obj: Any, save_persistent_id: bool = True) -> None:
        outer = self.node
        if outer is None or obj is not outer[0]:
            self.node = (obj, outer)
        try:
            _save(self, obj, save_persistent_id)
        finally:
            self.node = outer

    def _tensor(self, tensor: torch.Tensor) -> Any:
        # torch's own test (reduce_tensor): what it refuses is what the send detaches.
        if tensor.requires_grad and not tensor.is_leaf:
            assert self.node is not None  # save() set it for this very tensor
            self.met.append((tensor, self.node))
        return _NOTHING


def _nothing(obj: Any) -> Any:
    return _NOTHING


def _stubbed(reducer: Any) -> bool:
    """True for a reducer of torch's (storages, events) or one of multiprocessing's that sends a
    resource (a connection, a socket)."""
    module = getattr(reducer, "__module__", None) or ""
    if module == _TORCH_REDUCTIONS:
        return True
    return (module.startswith("multiprocessing.")
            and getattr(reducer, "__name__", "") not in _MULTIPROCESSING_PURE)


def survey(root: Any, protocol: Optional[int], reducers: Dict[type, Callable[[Any], Any]]
           ) -> Tuple[List[Met], Optional[str]]:
    """Survey the send of `root` with `protocol` and the pickler's extra `reducers` (torch's
    tensor reducer, or a wrapper of it such as the shim's, among them).

    Returns the tensors with history it met, in the order the send meets them, each with its
    node, and what stopped the survey (`"TypeError: ..."`), if anything did (then the tensors are
    those met until then).  Raises nothing but what interrupts it (`KeyboardInterrupt`)."""
    pickler = _Survey(protocol, reducers)
    error = None
    try:
        pickler.dump(root)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"  # the words: the error would hold this frame
    return pickler.met, error
