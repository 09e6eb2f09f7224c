"""The record of one top-level copy: which tensors it detached, where they sit, and when it ends.

What mode `warn` reports and what mode `strict` refuses comes from the copy itself, not from
a second walk that would have to predict it: a tensor enters the record when the copy meets it
(and torch refuses it), with the path along which the copy reached it.  Whatever the copy does
not meet (a tensor dropped by a custom `__deepcopy__`, one a memo already supplies, one behind
a reduction that leaves it out) is never reported.

A top-level copy is the outermost `copy.deepcopy` call on the stack.  Its end is observed
through deepcopy's own protocol: the last thing deepcopy does for an object it copied is
`_keep_alive(x, memo)`, i.e. `memo[id(memo)].append(x)`.  While a record is open, that
keep-alive list is a `_KeepAlive` whose `append` closes the record when `x` is the
root and the caller is the root's own deepcopy frame: the copy is then complete, and still on
the stack, so a strict refusal propagates from `copy.deepcopy` itself and no part of the copy
escapes.  Where that cannot be observed (no deepcopy frame, a memo that is not a plain dict, a
`copy` module that keeps objects alive differently) each tensor is reported as it is copied.
"""

from __future__ import annotations

import sys
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

import torch

from . import _protocol, _report
from ._modes import Mode, ModeSetting
from ._paths import Locator, display
from ._warnings import DetachedTensorsWarning, NonLeafTensorError, warn_in_user_code

__all__ = ["CopyRecord", "Entry", "path_here", "record_for"]


class Entry(NamedTuple):
    """One tensor the copy detached (or, in mode strict, would have detached)."""

    tensor: torch.Tensor
    path: str
    """Python access from the copied object (see `_paths`)."""
    why: Optional[str]
    """None when `path` reaches the tensor; else why the rest of the way has no spelling."""

    @property
    def label(self) -> str:
        """The path as reported: `head.last_out`, or `hooks[0] <copied by X.__deepcopy__>`."""
        path = display(self.path)
        if self.why is None:
            return path
        return f"{path} <{self.why}>" if path else f"<{self.why}>"


class CopyRecord:
    """Everything the shim reports about one top-level copy.

    An `immediate` record reports its one tensor as soon as that tensor is copied: it serves a
    copy whose end cannot be observed.
    """

    __slots__ = ("root", "setting", "met", "closed", "immediate", "_frames")

    def __init__(self, root: Any, setting: ModeSetting, immediate: bool) -> None:
        self.root = root
        self.setting = setting
        # The tensors met, each with the copy frames it was met under, up to a frame captured
        # for an earlier tensor: reading the objects those frames copy (their locals) is the
        # dearest part of a path, so it waits for the end, once per frame, in one warm pass.
        self.met: List[_Met] = []
        self.closed = False
        self.immediate = immediate
        # id(frame) -> frame, for every copy frame captured: a frame above a module is the same
        # for all of its tensors.  Holding them keeps their ids their own until the end.
        self._frames: Dict[int, Any] = {}

    def meet(self, tensor: torch.Tensor, caller: Any) -> _Met:
        """Enter `tensor`, which the copy has just met, with the frames it was met under.

        `caller` is the frame that called `Tensor.__deepcopy__`: when that is a deepcopy
        frame, the object it copies is `tensor` itself (bound as the method's `self`), so
        the walk starts above it.
        """
        captured = self._frames
        copy_frames = _protocol.COPY_FRAMES
        frames = []
        frame = caller.f_back if caller.f_code is _protocol.DEEPCOPY_CODE else caller
        while frame is not None:
            if id(frame.f_code) in copy_frames:
                if captured.get(id(frame)) is frame:
                    frames.append(frame)
                    break
                captured[id(frame)] = frame
                frames.append(frame)
            frame = frame.f_back
        frames.reverse()
        met = _Met(tensor, frames)
        self.met.append(met)
        return met

    def forget(self, met: _Met) -> None:
        """Take `met` out again: its copy failed, so nothing was detached."""
        for index, found in enumerate(self.met):
            if found is met:
                del self.met[index]
                return

    def copied(self, met: _Met) -> None:
        """`met`'s tensor is copied; a record that reports tensor by tensor reports it now."""
        if self.immediate:
            self.met = [met]
            self.close()

    def entries(self) -> List[Entry]:
        """Every tensor met, in order, with its path from the root."""
        locator = Locator(self.root)
        copy_frames = _protocol.COPY_FRAMES
        copied: Dict[int, Any] = {}  # id(frame) -> the object it copies
        # id(object met) -> the object the copy went through just before it
        up: Dict[int, Tuple[Any, Any]] = {id(self.root): (self.root, None)}
        found = []
        for tensor, frames in self.met:
            chain: List[Any] = []
            for frame in frames:
                x = copied.get(id(frame), _protocol.NIL)
                if x is _protocol.NIL:
                    x = copied[id(frame)] = frame.f_locals[copy_frames[id(frame.f_code)]]
                if not chain or chain[-1] is not x:
                    chain.append(x)
            if not chain or chain[-1] is not tensor:
                chain.append(tensor)
            for before, obj in zip(chain, chain[1:]):
                if id(obj) not in up:
                    up[id(obj)] = (obj, before)
            head = chain[0]
            while not locator.knows(head):  # met before, but not reachable: go further up
                link = up.get(id(head))
                if link is None or link[1] is None:
                    break
                head = link[1]
                chain.insert(0, head)
            found.append(Entry(tensor, *locator.locate(chain)))
        return found

    def close(self) -> None:
        """The copy is complete: warn (mode warn) or refuse (mode strict), naming every entry.

        Raises `NonLeafTensorError` in mode strict, and whatever the warning filters make
        of the warning in mode warn.
        """
        self.closed = True
        self._frames.clear()  # the frames are finishing; holding them would hold their locals
        if not self.met:
            return
        entries = self.entries()
        paths = tuple(e.label for e in entries)
        if self.setting.mode is Mode.STRICT:
            raise NonLeafTensorError(
                _report.strict_refusal(self.root, self.setting, entries),
                paths=paths, mode=Mode.STRICT, tensors=[e.tensor for e in entries],
            )
        warn_in_user_code(DetachedTensorsWarning(
            _report.detached_warning(self.root, self.setting, entries), paths
        ))
        _report.note_untested_torch_once()


class _Met(NamedTuple):
    tensor: torch.Tensor
    frames: List[Any]


class _KeepAlive(list):  # type: ignore[type-arg]
    """The memo's keep-alive list while a record is open; closes it at the end of the copy."""

    __slots__ = ("record", "root_frame")

    def __init__(self, items: Any, record: CopyRecord, root_frame: Any) -> None:
        super().__init__(items)
        self.record = record
        self.root_frame = root_frame

    def append(self, obj: Any) -> None:
        list.append(self, obj)
        # Frames: 0 this method, 1 copy._keep_alive, 2 the deepcopy call that copied obj.
        if obj is self.record.root and self.root_frame is not None and sys._getframe(2) is self.root_frame:
            self.root_frame = None  # also breaks the cycle memo -> this list -> frame -> memo
            self.record.close()


def record_for(memo: Any, setting: ModeSetting, tensor: torch.Tensor) -> Optional[CopyRecord]:
    """The open record of the copy that `memo` belongs to, created on its first `tensor`.

    None in mode silent: nothing is reported, so nothing is recorded.
    """
    if setting.mode is Mode.SILENT:
        return None
    record = _open_record(memo)
    if record is not None and record.setting is setting:
        return record
    frames = _deepcopy_frames(sys._getframe(1))
    root_frame, root_memo = _root_of(frames, memo, setting)
    if root_frame is None:
        # No deepcopy frame to observe: __deepcopy__ was called directly (or by a deepcopy
        # written in C); the tensor is all there is to report.
        return CopyRecord(tensor, setting, immediate=True)
    root = root_frame.f_locals[_protocol.X_LOCAL]
    record = _open_record(root_memo)
    if record is None or record.setting is not setting:  # the copy's first tensor to report
        if not _closes(root_memo):
            return CopyRecord(root, setting, immediate=True)
        record = CopyRecord(root, setting, immediate=False)
        _install(root_memo, record, root_frame)
    if memo is not root_memo:
        _install(memo, record, None)  # the same record, found fast; only the root memo closes it
    return record


def path_here(memo: Any, tensor: torch.Tensor, setting: ModeSetting) -> str:
    """The path of `tensor`, being copied now with `memo`, from the outermost copy's root."""
    frames = _deepcopy_frames(sys._getframe(1))
    if not frames:
        return ""
    record = CopyRecord(frames[0].f_locals[_protocol.X_LOCAL], setting, immediate=True)
    record.meet(tensor, sys._getframe(1))
    return record.entries()[0].label


def _open_record(memo: Any) -> Optional[CopyRecord]:
    """The record still open in `memo`'s keep-alive slot, if any."""
    keep = _protocol.own_get(memo, id(memo))
    if type(keep) is _KeepAlive and not keep.record.closed:
        return keep.record
    return None


def _install(memo: Any, record: CopyRecord, root_frame: Any) -> None:
    previous = _protocol.own_get(memo, id(memo))
    _protocol.own_set(memo, id(memo), _KeepAlive(previous or (), record, root_frame))


def _closes(memo: Any) -> bool:
    # copy._keep_alive goes through memo[id(memo)]: only where that is dict's own lookup does
    # the append reach the _KeepAlive installed with dict's own __setitem__.
    return (
        _protocol.KEEP_ALIVE_CALLS_APPEND
        and isinstance(memo, dict)
        and type(memo).__getitem__ is dict.__getitem__
    )


def _deepcopy_frames(frame: Any) -> List[Any]:
    """The frames of `copy.deepcopy` calls on the stack from `frame` out, outermost first."""
    found = []
    while frame is not None:
        if frame.f_code is _protocol.DEEPCOPY_CODE:
            found.append(frame)
        frame = frame.f_back
    found.reverse()
    return found


def _root_of(frames: List[Any], memo: Any, setting: ModeSetting) -> Tuple[Any, Any]:
    """The frame and memo of the top-level copy that a tensor copied with `memo` belongs to.

    The outermost deepcopy on the stack, also when a custom `__deepcopy__` started a fresh
    copy inside it: the user made one copy and gets one report.  If that outer copy already
    reports in another mode (a scope opened inside it), the outermost deepcopy with `memo`.
    """
    if not frames:
        return None, None
    outer = frames[0]
    outer_memo = outer.f_locals[_protocol.MEMO_LOCAL]
    reporting = _open_record(outer_memo)
    if reporting is None or reporting.setting is setting:
        return outer, outer_memo
    for frame in frames:
        if frame.f_locals[_protocol.MEMO_LOCAL] is memo:
            return frame, memo
    return None, None
