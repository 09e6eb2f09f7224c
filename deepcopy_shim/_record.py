"""Where a copy starts and ends, and which tensors it met on the way.

A *top-level copy* is the outermost copy frame (a `copy.deepcopy` call, or the module copier a
deepcopy written in C calls directly) on the stack below the innermost scope's boundary: the
frame that entered `deepcopy_shim.enabled(...)`, or the `deepcopy_shim.deepcopy()` /
`find_nonleaf_tensors()` call itself.  So a copy started inside a custom `__deepcopy__`
(with a fresh memo or the same one) is part of the copy around it, and a copy started inside a
scope, or by an explicit call, is a copy of its own wherever it is made.

Mode `warn` keeps a `CopyRecord` of each top-level copy that detaches something: the tensors
met, in order, each with the copy frames it was met under (reading the objects those frames
copy, their locals, is the dearest part of a path, so it waits for the end, once per frame).
Records live in the thread that copies, never in anything the copy touches, and each is found
again by walking from the tensor being copied to the first frame a record captured: a second
`enable()`, a scope opened inside the copy or another thread cannot reach it.  Each record
ends exactly once:

- a module at the root: the module copier that copies it finishes the record when it returns
  and discards it when it raises (try/except owned by the call that makes the copy);
- a tensor with history at the root: the tensor copier, likewise;
- any other root (a dict, a list, an object): the end is seen through deepcopy's own protocol,
  its last `_keep_alive(x, memo)` for the root (see `_protocol.KEEP_ALIVE_DEPTH`), through a
  keep-alive list installed in the root's memo only while the record is open.  If that copy
  fails instead, the scope or explicit call it ran in discards the record when it ends; under
  `enable()` alone the next record made in the same thread does;
- no copy frame at all (a direct `__deepcopy__` call), or a memo whose `__getitem__` is not
  dict's own: the tensor is reported as soon as it is copied.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Dict, List, Optional, Set, Tuple

import torch

from . import _modes, _protocol, _report
from ._access import Entry, Locator
from ._errors import DetachedTensorsWarning
from ._modes import ModeSetting
from ._notices import warn_in_user_code

__all__ = [
    "CopyRecord",
    "OWNED",
    "Tracker",
    "copied_by",
    "copy_running",
    "module_copy_ended",
    "open_records",
    "path_here",
    "record_for",
    "scope_ended",
    "top_level",
    "walk",
]

# pytest leaves this module's frames out of the tracebacks it shows: a refused or failed copy
# ends in the user's code or copy's, not in the shim's bookkeeping.
__tracebackhide__ = True

_Frame = Any
_Captured = Dict[int, Tuple[_Frame, Any]]


# One tensor met: (tensor, the copy frames it was met under, outermost first).  Plain tuples,
# here and in walk()'s answer: a NamedTuple's __new__ is a Python call, once per tensor met.
_Met = Tuple[torch.Tensor, List[_Frame]]
# What walk() found: (the copy frames from the caller outward, innermost first, none the walk
# stopped at; the `captured` entry (frame, owner) it stopped at, or None; the outermost root
# frame walked, the top-level copy so far; the module copier frame that copies what that
# outermost frame copies, if any).
_Walk = Tuple[List[_Frame], Optional[Tuple[_Frame, Any]], Optional[_Frame], Optional[_Frame]]


def walk(caller: _Frame, boundary: _Frame, captured: _Captured) -> _Walk:
    """The copy frames from `caller` out to `boundary` (excluded), or to the first frame in
    `captured` (id -> (frame, owner)).

    `caller` itself counts as a root frame when it is the deepcopy frame of the object being
    copied, but is not walked (the object it copies is the one being met).  A module copier
    called by deepcopy copies the very object its caller copies: it is not walked either,
    only remembered as that frame's owner.
    """
    copy_frames = _protocol.COPY_FRAMES
    root_frames = _protocol.ROOT_FRAMES
    owner_frames = _protocol.OWNER_FRAMES
    deepcopy_code = _protocol.DEEPCOPY_CODE
    own = caller.f_code is deepcopy_code
    outermost = caller if own else None
    owner = inner = None
    frame = caller.f_back if own else caller
    walked: List[_Frame] = []
    while frame is not None and frame is not boundary:
        code = frame.f_code
        key = id(code)
        if key in copy_frames:
            hit = captured.get(id(frame))
            if hit is not None and hit[0] is frame:
                return walked, hit, outermost, owner
            back = frame.f_back
            if key in owner_frames and back is not None and back.f_code is deepcopy_code:
                inner = frame  # deepcopy's own frame, next, copies the same module
            else:
                walked.append(frame)
                if key in root_frames:
                    outermost = frame
                    owner = inner if inner is not None and inner.f_back is frame else (
                        frame if key in owner_frames else None)
        frame = frame.f_back
    return walked, None, outermost, owner


def _boundary() -> _Frame:
    scope = _modes.current_scope()
    return scope.boundary if scope is not None else None


def top_level(caller: _Frame) -> Tuple[Optional[_Frame], List[_Frame]]:
    """The root frame of the top-level copy `caller` is part of (None: no copy frame), and the
    copy frames from it in to `caller`, innermost first."""
    walked, _, outermost, _ = walk(caller, _boundary(), {})
    # The outermost copy frame walked is a root frame: a copy frame that is not one (the
    # module copier's dict copier) always has a module copier above it, walked or owned.
    return outermost, walked


def copy_running(frame: Optional[_Frame]) -> bool:
    """True if a copy frame (see `_protocol.COPY_FRAMES`) is `frame` or one of its callers."""
    copy_frames = _protocol.COPY_FRAMES
    while frame is not None:
        if id(frame.f_code) in copy_frames:
            return True
        frame = frame.f_back
    return False


def copied_by(frame: _Frame) -> Any:
    """The object the copy frame `frame` copies."""
    return frame.f_locals[_protocol.COPY_FRAMES[id(frame.f_code)]]


class Tracker:
    """The tensors one copy met, in order, with the frames each was met under; their paths.

    The frames are held (in each tensor's chain) until the paths are made: that keeps their
    ids their own, and their locals readable, until the end.
    """

    __slots__ = ("root", "met", "failed")

    def __init__(self, root: Any) -> None:
        self.root = root
        self.met: List[_Met] = []
        # ids of the entries of `met` whose copy failed: not reported, but their frames stay
        # captured, so a later tensor met under them continues their chain.
        self.failed: Set[int] = set()

    def add(self, tensor: torch.Tensor, walked: List[_Frame], joined: Optional[_Frame]) -> _Met:
        """Enter `tensor`, met under the copy frames `walked` (innermost first, none of them
        captured before) below the captured frame `joined` (None: `walked` reaches the root)."""
        chain = walked[::-1]
        if joined is not None:
            chain.insert(0, joined)
        met = (tensor, chain)
        self.met.append(met)
        return met

    def forget(self, met: _Met) -> None:
        """Leave `met` out of the report: its copy failed, so nothing was detached.  Its
        chain stays: the frames it was met under stay captured, and a tensor met under them
        later has its path through that chain."""
        self.failed.add(id(met))

    @property
    def reported(self) -> bool:
        """True if a tensor met was detached (its copy did not fail)."""
        return len(self.met) > len(self.failed)

    def release(self) -> None:
        """Let go of the frames: once the copy is over, holding them would hold their locals
        (the copy made so far) in cycles only the garbage collector could free."""
        self.met.clear()
        self.failed.clear()

    def entries(self) -> List[Entry]:
        """Every tensor met, in order, with its path from the root."""
        locator = Locator(self.root)
        nil = _protocol.NIL
        copied: Dict[int, Any] = {}  # id(frame) -> the object it copies
        # id(object met) -> the object the copy went through just before it (the first way
        # met): only asked for on a chain whose start is not yet known, so the chains met
        # since it was last asked wait in `unlinked` until then.
        up: Dict[int, Tuple[Any, Any]] = {id(self.root): (self.root, None)}
        unlinked: List[List[Any]] = []
        # id(first frame of a chain) -> the chain of objects it starts, from a located one:
        # the tensors met under one frame (a module's children) share it.
        starts: Dict[int, List[Any]] = {}
        found = []
        failed = self.failed
        for met in self.met:
            tensor, frames = met
            # Each frame copies another object (deepcopy's own frame of a module copier it
            # calls was not walked; the tensor's own frame neither): no object twice in a row.
            chain: List[Any] = []
            for frame in frames:
                x = copied.get(id(frame), nil)
                if x is nil:
                    x = copied[id(frame)] = copied_by(frame)
                chain.append(x)
            chain.append(tensor)
            unlinked.append(chain)
            start = starts.get(id(frames[0])) if frames else None
            if start is None:
                for seen in unlinked:
                    for before, obj in zip(seen, seen[1:]):
                        if id(obj) not in up:
                            up[id(obj)] = (obj, before)
                unlinked.clear()
                head = chain[0]
                start = [head]
                while not locator.knows(head):  # met before, but not reachable: go further up
                    link = up.get(id(head))
                    if link is None or link[1] is None:
                        break
                    head = link[1]
                    start.insert(0, head)
                if frames:
                    starts[id(frames[0])] = start
            if id(met) not in failed:
                # Entry's own __new__ is a Python call; tuple's makes the same Entry.
                found.append(tuple.__new__(Entry, (tensor, *locator.locate(start + chain[1:]))))
        return found


class CopyRecord(Tracker):
    """What mode `warn` reports about one top-level copy; see the module docstring for when
    and by whom it ends."""

    __slots__ = ("root_frame", "boundary", "setting", "owner", "memo", "finished_by_owner", "captured")

    def __init__(self, root: Any, root_frame: Optional[_Frame], boundary: _Frame,
                 setting: ModeSetting) -> None:
        super().__init__(root)
        self.root_frame = root_frame
        self.boundary = boundary
        self.setting = setting
        self.owner: Optional[_Frame] = None  # the shim frame that finishes it, if any
        self.memo: Any = None  # the memo whose keep-alive list watches for its end, if any
        self.finished_by_owner = False  # no keep-alive list: the owner finishes it as it returns
        self.captured: List[int] = []  # ids of the frames this thread's registry holds for it

    @property
    def immediate(self) -> bool:
        """True for a record whose end cannot be seen: it reports each tensor as copied."""
        return self.memo is None and not self.finished_by_owner

    def finish(self) -> None:
        """The copy is complete: one `DetachedTensorsWarning` naming every tensor detached.

        Raises whatever the warning filters make of the warning (`-W error`).
        """
        self._end()
        if not self.reported:
            return
        entries = self.entries()
        self.release()
        warn_in_user_code(DetachedTensorsWarning(
            _report.detached_warning(self.root, self.setting, entries),
            [e.label for e in entries], [e.tensor for e in entries],
        ))
        _report.note_untested_torch_once()

    def capture(self, walked: List[_Frame]) -> None:
        """Register `walked` in this thread's registry: a later tensor's walk stops there."""
        captured = _state.captured
        for frame in walked:
            captured[id(frame)] = (frame, self)
            self.captured.append(id(frame))

    def discard(self) -> None:
        """The copy failed: nothing was detached, nothing is said."""
        self._end()
        self.release()

    def _end(self) -> None:
        # Called once: an ended record is in no registry, no keep-alive list and no count.
        state = _state
        if self in state.records:
            state.records.remove(self)
            for key in self.captured:
                del state.captured[key]
        if self.memo is not None:
            _unhook(self.memo, self)
        if self.finished_by_owner:
            _owned(self, -1)


class _KeepAlive(list):  # type: ignore[type-arg]
    """Stands in a memo for its keep-alive list while records whose root that memo copies are
    open: the append deepcopy makes for a record's root, from the root's own frame, finishes
    it.  It holds nothing itself: every append goes on to the memo's own list (`kept`), which
    goes back in its place, the very same list, when the last of those records ends.  So
    hooking a memo shared by many copies costs the same however much it keeps alive."""

    __slots__ = ("records", "kept")
    records: List[CopyRecord]
    kept: List[Any]

    def append(self, obj: Any) -> None:
        self.kept.append(obj)
        for record in self.records:
            if obj is record.root and sys._getframe(_KEEP_ALIVE_DEPTH) is record.root_frame:
                record.finish()
                return


_KEEP_ALIVE_DEPTH = _protocol.KEEP_ALIVE_DEPTH or 0


def _hookable(memo: Any) -> bool:
    # copy._keep_alive goes through memo[id(memo)]: only where that is dict's own lookup does
    # the append reach the list installed with dict's own __setitem__.
    return (
        _protocol.KEEP_ALIVE_DEPTH is not None
        and isinstance(memo, dict)
        and type(memo).__getitem__ is dict.__getitem__
    )


def _hook(memo: Any, record: CopyRecord) -> None:
    keep = _protocol.own_get(memo, id(memo))
    if type(keep) is _KeepAlive:
        keep.records.append(record)
        return
    hooked = _KeepAlive()
    hooked.records = [record]
    # The memo's own list, or the one deepcopy would have made on its first keep-alive.
    hooked.kept = keep if type(keep) is list else [] if keep is None else _Foreign(keep)
    _protocol.own_set(memo, id(memo), hooked)


class _Foreign(list):  # type: ignore[type-arg]
    """A keep-alive entry that is not a plain list (someone else's object): appends go to it
    as they would without the hook, and it goes back in its place."""

    __slots__ = ("target",)

    def __init__(self, target: Any) -> None:
        super().__init__()
        self.target = target

    def append(self, obj: Any) -> None:
        self.target.append(obj)


def _unhook(memo: Any, record: CopyRecord) -> None:
    keep = _protocol.own_get(memo, id(memo))
    if type(keep) is not _KeepAlive:
        return
    if record in keep.records:
        keep.records.remove(record)
    if not keep.records:  # give the memo back its own list, with everything it keeps alive
        kept = keep.kept
        _protocol.own_set(memo, id(memo), kept.target if type(kept) is _Foreign else kept)


# id(root module) -> how many open records (in all threads) its module copier finishes as
# it returns: every other module copier only looks its own id up there.
OWNED: Dict[int, int] = {}
_owned_lock = threading.Lock()


def _owned(record: CopyRecord, change: int) -> None:
    key = id(record.root)
    with _owned_lock:
        count = OWNED.get(key, 0) + change
        if count:
            OWNED[key] = count
        else:
            del OWNED[key]


class _ThreadState(threading.local):
    def __init__(self) -> None:
        self.records: List[CopyRecord] = []  # open records of this thread, oldest first
        self.captured: _Captured = {}  # id(frame) -> (frame, record) for those records


_state = _ThreadState()


def record_for(tensor: torch.Tensor, caller: _Frame, setting: ModeSetting
               ) -> Tuple[CopyRecord, _Met]:
    """The open record of the top-level copy now meeting `tensor` (called by the frame
    `caller`), made on its first tensor; and the tensor's entry in it."""
    state = _state
    boundary = _boundary()
    walked, hit, outermost, owner = walk(caller, boundary, state.captured)
    if hit is not None and hit[1].boundary is boundary:
        record: CopyRecord = hit[1]
        record.capture(walked)
        return record, record.add(tensor, walked, hit[0])
    # The first tensor of a copy.  Every open record of this scope is of a copy that ended
    # without saying so (a failure): its frames would have been met on the way.
    for stale in [r for r in state.records if r.boundary is boundary]:
        stale.discard()
    if outermost is None:  # no copy frame: __deepcopy__ was called directly
        record = CopyRecord(tensor, None, boundary, setting)
        return record, record.add(tensor, [], None)
    record = CopyRecord(copied_by(outermost), outermost, boundary, setting)
    # A module at the root: its copier finishes the record when it returns, and discards it if
    # it raises.  Any other root: deepcopy's own last keep-alive append for it finishes it (a
    # Python call for every object the copy completes: the module copier's one look on return
    # is far cheaper, so modules never take this way).
    record.owner = owner
    if owner is not None:
        _owned(record, +1)
        record.finished_by_owner = True
    elif outermost.f_code is _protocol.DEEPCOPY_CODE:
        memo = outermost.f_locals[_protocol.MEMO_LOCAL]
        if _hookable(memo):
            _hook(memo, record)
            record.memo = memo
    if not record.immediate:
        state.records.append(record)
        # A tensor at the root: its own deepcopy frame (the caller) is the root frame, and the
        # tensors its copy meets (its dict, its grad) are met under it.
        record.capture([*walked, caller] if outermost is caller else walked)
    return record, record.add(tensor, walked, None)


def module_copy_ended(module: Any, failed: bool) -> None:
    """The module copier that copies `module` (its caller's frame) raises (`failed`), or
    returns: discard the records it owns, or finish those only it can see end.  Looks at
    frames only for a record whose root is `module`."""
    for record in _state.records:
        if record.root is module and record.owner is sys._getframe(1):
            if failed:
                record.discard()
            elif record.finished_by_owner:
                record.finish()
            return


def scope_ended(boundary: _Frame) -> None:
    """A scope entered by `boundary` ends (`boundary` None: the global setting changes, by
    `enable()` or `disable()`): a record of it whose copy is no longer running in this thread
    is of a copy that failed.  (One still running, a scope left inside its own copy, goes on.)"""
    records = [r for r in _state.records if r.boundary is boundary]
    if records:
        running = set()
        frame: Optional[_Frame] = sys._getframe(1)
        while frame is not None:
            running.add(id(frame))
            frame = frame.f_back
        records = [r for r in records if id(r.root_frame) not in running]
    for record in records:
        record.discard()


def open_records() -> List[CopyRecord]:
    """This thread's open records (the module copier asks before looking for its own)."""
    return _state.records


def path_here(tensor: torch.Tensor, caller: _Frame) -> str:
    """The path of `tensor`, being copied now (called by the frame `caller`), from the root
    of its top-level copy."""
    root_frame, walked = top_level(caller)
    if root_frame is None:
        return ""
    tracker = Tracker(copied_by(root_frame))
    tracker.add(tensor, walked, None)
    (entry,) = tracker.entries()
    return entry.label
