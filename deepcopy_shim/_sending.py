"""Sending to another process in a mode: the tensors with history torch's multiprocessing refuses.

Everything multiprocessing sends to another process (a queue's item, a connection's message, a
pool's task and result, a spawn or forkserver child's `Process` object, DataLoader workers' batches)
is pickled by `multiprocessing.reduction.ForkingPickler`, whose instances copy the class's
`_extra_reducers` into their own dispatch table.  torch registers its `reduce_tensor` there for
`torch.Tensor`, `nn.Parameter` and the legacy typed tensor classes; it puts a tensor's storage in
shared memory (or hands out a CUDA IPC handle) and refuses a tensor with autograd history.

While the shim is installed (see `_patch`), three things that exist change, and nothing is added:

* every `_extra_reducers` entry whose value is torch's `reduce_tensor` becomes one wrapper
  function (`SendingPatch.reduce`): picklers made from then on use it;
* `ForkingPickler.dumps` (a classmethod: connections, queues, pools) and the module function
  `multiprocessing.reduction.dump` (spawn and forkserver start a child with it) become wrapt
  wrappers that make each call a *send* (`Send`), where a mode applies.

A send is made and ended by the call that starts it, and lives in a context variable while it
runs: its root (the object sent), setting, memo, the tensors with history it detached and their
copies.  Where no mode applies to the call (none in this thread or task: a queue's feeder thread
and a pool's handler threads see the process-wide setting only), the wrappers call straight
through and the reducer calls torch's, which raises its own error from its own frame.  Where one
applies, the reducer answers a tensor with history:

- silent, warn: with torch's reduction of a detached copy (the copy torch's `Tensor.__deepcopy__`
  makes of `tensor.detach()` with the send's memo, whose storage memo makes tensors with history
  that share a storage share one new storage, strides and offsets kept; then `requires_grad` as
  the tensor's): it arrives as a leaf that shares no memory with the sender's tensor.  A plain
  dense tensor is copied by the same steps directly (`_plain_copy`): the generic deepcopy of the
  storage objects took half the time of a send of small tensors.  When the send is complete, warn names
  every such tensor in one `DetachedTensorsWarning` (paths from a survey, see `_send_survey`);
- strict: `NonLeafTensorError`, raised where torch raises, with torch's error as its cause,
  naming every tensor with history the send would meet.

Leaves, parameters and tensors without history go to torch's reducer untouched (shared memory,
CUDA IPC).  A copy must outlive the send while a spawn or forkserver child is being started:
then torch hands the child the copy's shared-memory descriptor without duplicating it, so the
copies are kept as long as that child's `Popen` object.  Elsewhere they are dropped when the send
ends: a queue or connection duplicates the descriptor at once, the `file_system` strategy adds a
reference to the file, and CUDA keeps sent blocks alive itself.
"""

from __future__ import annotations

import contextvars
import weakref
from multiprocessing import context as mp_context
from multiprocessing.reduction import ForkingPickler
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import wrapt

from . import _modes, _report
from ._access import Entry
from ._errors import DetachedTensorsWarning, NonLeafTensorError
from ._modes import Mode, ModeSetting, Source
from ._notices import warn_in_user_code
from ._record import entries, unplaced
from ._send_survey import Met, survey

__all__ = ["Send", "SendingPatch"]

# pytest leaves this module's frames out of the tracebacks it shows: a strict refusal is raised
# here, inside torch's reducer call, and should read as the user's send failing.
__tracebackhide__ = True

_Reducer = Callable[[Any], Any]
_current_setting = _modes.current_setting
# This context's running send: set by the call that starts it, reset in that call's `finally`.
_current: contextvars.ContextVar[Optional[Send]] = contextvars.ContextVar(
    "deepcopy_shim_send", default=None)
# True while a survey runs in this context: the objects it reduces again may send something
# themselves (a `__reduce__` that calls `ForkingPickler.dumps`); such a send did its reporting
# or refusing in the real send, so in the survey it detaches without a word, in mode silent.
_surveying: contextvars.ContextVar[bool] = contextvars.ContextVar("deepcopy_shim_send_survey", default=False)
_QUIET = ModeSetting(Mode.SILENT, Source.SCOPE, "the survey of a send")
# A spawn or forkserver child's Popen -> the copies its start needs (see the module docstring).
# Weak keys: the copies go with the Popen object.  Changed only by one-step dict operations.
_kept: weakref.WeakKeyDictionary[Any, List[torch.Tensor]] = weakref.WeakKeyDictionary()
# Why a tensor the send met has no path, where the survey went to its end without meeting it
# (an object that reduces to other objects at each call).
_NOT_MET = "the survey of the send did not meet it"


class Send:
    """One send in a mode: the object sent, the setting, the memo of its copies, the tensors with
    history it detached (in order) and their copies.  Made and ended by the call that starts the
    send (`_send`), or by the reducer for a tensor pickled where no send runs."""

    __slots__ = ("root", "setting", "protocol", "pickler", "memo", "met", "sources", "copies")

    def __init__(self, root: Any, setting: ModeSetting, protocol: Optional[int], pickler: Any) -> None:
        self.root = root
        self.setting = setting
        self.protocol = protocol
        self.pickler = pickler  # the pickler class: its reducers are the survey's
        self.memo: Dict[Any, Any] = {}
        self.met: List[torch.Tensor] = []
        # The detached tensors the copies were made from: the memo is keyed by their ids, which
        # must stay theirs while the send runs.
        self.sources: List[torch.Tensor] = []
        self.copies: List[torch.Tensor] = []

    def detached(self, tensor: torch.Tensor, original: _Reducer,
                 tensor_deepcopy: Callable[[torch.Tensor, Any], torch.Tensor]) -> Any:
        """torch's reduction (`original`) of the detached copy of `tensor`, entered in this send."""
        source = tensor.detach()
        made = _plain_copy(source, self.memo) if _plain(source) else tensor_deepcopy(source, self.memo)
        made.requires_grad_(tensor.requires_grad)
        self.met.append(tensor)
        self.sources.append(source)
        self.copies.append(made)
        return original(made)

    def refusal(self, tensor: torch.Tensor, torch_words: str) -> NonLeafTensorError:
        """Mode strict: the error refusing this send, which met `tensor`, naming every tensor with
        history the send would meet."""
        met, failed = self.survey()
        found = entries(self.root, met)
        if not any(entry.tensor is tensor for entry in found):
            found.append(unplaced(tensor, failed or _NOT_MET))
        return NonLeafTensorError(
            _report.send_refusal(self.root, self.setting, found, failed, torch_words),
            paths=[entry.label for entry in found], mode=Mode.STRICT,
            tensors=[entry.tensor for entry in found])

    def report(self) -> None:
        """Mode warn, the send complete: one `DetachedTensorsWarning` naming every tensor it
        detached, at the user's line.  Raises whatever the warning filters make of it."""
        if not self.met or self.setting.mode is not Mode.WARN:
            return
        met, failed = self.survey()
        located = {id(entry.tensor): entry for entry in entries(self.root, met)}
        why = failed or _NOT_MET
        found: List[Entry] = [located.get(id(tensor)) or unplaced(tensor, why) for tensor in self.met]
        warn_in_user_code(DetachedTensorsWarning(
            _report.send_detached_warning(self.root, self.setting, found),
            [entry.label for entry in found], [entry.tensor for entry in found]))
        _report.note_untested_torch_once()

    def survey(self) -> Tuple[List[Met], Optional[str]]:
        """The tensors with history the send meets, located by a survey (see `_send_survey`)."""
        token = _surveying.set(True)
        try:
            return survey(self.root, self.protocol, self.pickler._extra_reducers)
        finally:
            _surveying.reset(token)

    def end(self) -> None:
        """The send's call ends: the copies are kept as long as the spawn or forkserver child
        being started in this thread (none on CUDA, where torch keeps sent blocks itself), else
        let go of; so are the memo and the tensors met."""
        popen = mp_context.get_spawning_popen()
        if popen is not None:
            kept = [made for made in self.copies if made.device.type != "cuda"]
            if kept:
                _kept.setdefault(popen, []).extend(kept)
        self.sources, self.copies, self.memo = [], [], {}


def _plain(tensor: torch.Tensor) -> bool:
    """True for a plain dense tensor on the CPU or a CUDA device (no subclass, conjugate or
    negative bit, quantization or nesting): what `_plain_copy` copies as torch would."""
    return (type(tensor) is torch.Tensor and tensor.layout is torch.strided
            and tensor.device.type in _PLAIN_DEVICES
            and not (tensor.is_quantized or tensor.is_nested or tensor.is_conj() or tensor.is_neg()))


_PLAIN_DEVICES = ("cpu", "cuda")


def _plain_copy(tensor: torch.Tensor, memo: Dict[Any, Any]) -> torch.Tensor:
    """torch's `Tensor.__deepcopy__` of the plain `tensor` (see `_plain`), the same way: its
    storage cloned once per memo (torch's storage memo, `memo["torch"]`, which torch's own copies
    with this memo share), the copy set on it with the same offset, sizes and strides; without
    the generic deepcopy of the storage objects, which costs more than the clone of a small one.
    `tensor` must outlive the memo (the key is its storage's address)."""
    storage: Any = tensor.untyped_storage()  # (typeshed-less: torch's storage methods are untyped)
    storages = memo.setdefault("torch", {})
    new_storage = storages.get(storage._cdata)
    if new_storage is None:
        new_storage = storages[storage._cdata] = storage.clone()
    made = tensor.new_empty([])
    made.set_(new_storage, tensor.storage_offset(), tensor.size(), tensor.stride())
    return made


class SendingPatch:
    """One installation's changes to multiprocessing: made outside the patch's lock (reading
    what is there), applied and removed under it (see `_patch`).

    `tensor_deepcopy` is torch's own `Tensor.__deepcopy__`, which makes the detached copies.
    """

    __slots__ = ("reducers", "original", "keys", "reduce", "pickler",
                 "dumps", "dumps_patch", "module", "dump", "dump_patch")

    def __init__(self, tensor_deepcopy: Callable[[torch.Tensor, Any], torch.Tensor]) -> None:
        from multiprocessing import reduction

        from torch.multiprocessing import reductions

        self.pickler: Any = reduction.ForkingPickler
        self.reducers: Dict[type, _Reducer] = vars(self.pickler)["_extra_reducers"]
        self.original: _Reducer = reductions.reduce_tensor
        self.keys = [cls for cls, reducer in list(self.reducers.items()) if reducer is self.original]
        self.reduce = _reducer(self.original, tensor_deepcopy)
        self.dumps = vars(self.pickler)["dumps"]
        # The wrappers hold the pickler class, not this patch (which holds them): no reference
        # cycle, so an installation removed is freed at once, without the garbage collector.
        self.dumps_patch = wrapt.FunctionWrapper(self.dumps, _sender(_dumps_arguments, self.pickler),
                                                 enabled=_wanted)
        self.module: Any = reduction
        self.dump = reduction.dump
        self.dump_patch = wrapt.FunctionWrapper(self.dump, _sender(_dump_arguments, self.pickler),
                                                enabled=_wanted)

    def unchanged(self) -> bool:
        """True if what this patch read is still there (nobody changed it meanwhile)."""
        return (vars(self.pickler).get("dumps") is self.dumps and self.module.dump is self.dump
                and all(self.reducers.get(cls) is self.original for cls in self.keys))

    def apply(self) -> None:
        """Write the reducer entries and both functions."""
        for cls in self.keys:
            self.reducers[cls] = self.reduce
        self.pickler.dumps = self.dumps_patch
        self.module.dump = self.dump_patch

    def remove(self) -> List[str]:
        """Restore what is still ours; return the names of what someone else replaced since."""
        conflicts = []
        replaced = []
        for cls in self.keys:
            if self.reducers.get(cls) is self.reduce:
                self.reducers[cls] = self.original
            elif self.reducers.get(cls) is not self.original:  # put back by torch itself: no conflict
                replaced.append(f"{cls.__module__}.{cls.__qualname__}")
        if replaced:
            shown = ", ".join(replaced[:3]) + (f" and {len(replaced) - 3} more" if len(replaced) > 3 else "")
            conflicts.append(f"multiprocessing.reduction.ForkingPickler._extra_reducers[{shown}]")
        if vars(self.pickler).get("dumps") is self.dumps_patch:
            self.pickler.dumps = self.dumps
        else:
            conflicts.append("multiprocessing.reduction.ForkingPickler.dumps")
        if self.module.dump is self.dump_patch:
            self.module.dump = self.dump
        else:
            conflicts.append("multiprocessing.reduction.dump")
        return conflicts


def _wanted() -> bool:
    """Whether a call of `dumps`/`dump` runs the shim's wrapper: where a mode applies, or where a
    send runs in this context (a send inside it, with no mode, must not be taken for part of it)."""
    return _current_setting() is not None or _current.get() is not None or _surveying.get()


def _dumps_arguments(obj: Any, protocol: Optional[int] = None) -> Tuple[Any, Optional[int]]:
    return obj, protocol


def _dump_arguments(obj: Any, file: Any, protocol: Optional[int] = None) -> Tuple[Any, Optional[int]]:
    return obj, protocol


def _sender(arguments: Callable[..., Tuple[Any, Optional[int]]], pickler: Any) -> Callable[..., Any]:
    """The wrapt wrapper of `dumps` or `dump` (whose arguments `arguments` reads): the call is a
    send of its own, made and ended here.  `pickler`: `ForkingPickler`, whose reducers the survey
    uses where the call is not the class's own (`dump`)."""

    def send(wrapped: Callable[..., Any], instance: Any, args: Tuple[Any, ...],
             kwargs: Dict[str, Any]) -> Any:
        setting = _QUIET if _surveying.get() else _current_setting()
        try:
            root, protocol = arguments(*args, **kwargs)
        except TypeError:  # not the function's arguments: it says what is wrong
            setting = None
        if setting is None:  # a send inside another, where no mode applies: native
            token = _current.set(None)
            try:
                return wrapped(*args, **kwargs)
            finally:
                _current.reset(token)
        running = Send(root, setting, protocol, instance if isinstance(instance, type) else pickler)
        token = _current.set(running)
        try:
            sent = wrapped(*args, **kwargs)
        finally:
            _current.reset(token)
            running.end()
        running.report()
        return sent

    return send


def _reduce_in(running: Send, tensor: torch.Tensor, original: _Reducer,
               tensor_deepcopy: Callable[[torch.Tensor, Any], torch.Tensor]) -> Any:
    """The reduction of the tensor with history `tensor`, met by the send `running`."""
    if running.setting.mode is Mode.STRICT:
        try:
            return original(tensor)  # torch refuses (the same test as the reducer's): its very error
        except RuntimeError as exc:
            raise running.refusal(tensor, str(exc)) from exc
    return running.detached(tensor, original, tensor_deepcopy)


def _alone(tensor: torch.Tensor, setting: ModeSetting, original: _Reducer,
           tensor_deepcopy: Callable[[torch.Tensor, Any], torch.Tensor]) -> Any:
    """The reduction of the tensor with history `tensor` as a send of its own (a pickler used
    directly, no send running)."""
    alone = Send(tensor, setting, None, ForkingPickler)
    token = _current.set(alone)
    try:
        reduced = _reduce_in(alone, tensor, original, tensor_deepcopy)
    finally:
        _current.reset(token)
        alone.end()
    alone.report()
    return reduced


def _reducer(original: _Reducer,
             tensor_deepcopy: Callable[[torch.Tensor, Any], torch.Tensor]) -> _Reducer:
    """The wrapper of torch's `reduce_tensor` (`original`) that the pickler's table holds.  What
    it calls is module functions, not closures of its own: nothing of an installation refers
    back to itself, so a removed one is freed at once, without the garbage collector."""
    current = _current.get
    current_setting = _current_setting

    def reduce_tensor(tensor: torch.Tensor) -> Any:
        running = current()
        setting = running.setting if running is not None else current_setting()
        if setting is None or not tensor.requires_grad or tensor.is_leaf:
            return original(tensor)
        if running is None:  # a ForkingPickler used directly: this tensor is a send of its own
            return _alone(tensor, setting, original, tensor_deepcopy)
        return _reduce_in(running, tensor, original, tensor_deepcopy)

    # Named and documented as torch's, unwrapping to it (as the tensor patch is: see `_tensor`).
    reduce_tensor.__wrapped__ = original  # type: ignore[attr-defined]
    for name in ("__module__", "__name__", "__qualname__", "__doc__"):
        setattr(reduce_tensor, name, getattr(original, name, None))
    return reduce_tensor
