"""Where a copy starts and ends, and which tensors it met on the way.

A *top-level copy* is the outermost copy frame (a `copy.deepcopy` call, or the module copier a
deepcopy written in C calls directly) on the stack below the innermost scope's boundary: the
frame that entered `deepcopy_shim.enabled(...)`, or the `deepcopy_shim.deepcopy()` /
`find_nonleaf_tensors()` call itself.  So a copy started inside a custom `__deepcopy__`
(with a fresh memo or the same one) is part of the copy around it, and a copy started inside a
scope, or by an explicit call, is a copy of its own wherever it is made.

Mode `warn` keeps a `CopyRecord` of each top-level copy that detaches something: the tensors
met, in order, each with the copy frames it was met under, kept as (frame id, the object the
frame copies), each frame's object read once, when it is first walked.  A record never holds a
frame or the memo: a frame holds its locals, the memo among them and through it the copy made
so far, which a failed copy must free as soon as its error is handled, as natively.  Records
live in the thread that copies, never in anything the copy touches, and each is found again by
walking from the tensor being copied to the first frame a record captured (the same id, code
and object: a frame gone since may have left its id to another): a second `enable()`, a scope
opened inside the copy or another thread cannot reach it.  Each record ends exactly once:

- a module at the root: the module copier that copies it finishes the record when it returns
  and discards it when it raises (try/except owned by the call that makes the copy);
- any other root (a dict, a list, an object, a tensor): the end is seen through deepcopy's own
  protocol, its last `_keep_alive(x, memo)` for the root (see `_protocol.KEEP_ALIVE_DEPTH`),
  through a stand-in for the memo's keep-alive list, installed only while records of that memo
  are open.  If that copy fails instead, the record is discarded when the memo is freed with
  the error (the stand-in, held by the memo alone, goes with it), or when the scope or
  explicit call it ran in ends, or (under `enable()` alone, the memo kept by the caller) when
  the next record of this thread is made or the global setting changes;
- no copy frame at all (a direct `__deepcopy__` call), or a memo whose `__getitem__` is not
  dict's own: the tensor is reported as soon as it is copied.
"""

from __future__ import annotations

import functools
import sys
import threading
import weakref
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
    "steps",
    "top_level",
    "walk",
]

# pytest leaves this module's frames out of the tracebacks it shows: a refused or failed copy
# ends in the user's code or copy's, not in the shim's bookkeeping.
__tracebackhide__ = True

_Frame = Any
# A copy frame as a record keeps it: (its id, the object it copies).  Never the frame itself:
# a frame holds its locals, the memo among them and through it the copy made so far, which
# must be freed when a failed copy's error is handled, as natively, whoever keeps a record.
_Step = Tuple[int, Any]
# id(frame) -> (its code, the object it copies, the owner): the frames an owner (a record, a
# survey) has walked.  A frame's id can be taken again by a new frame once it is gone: an
# entry counts only for a frame running the same code on the same object (see `walk`).
_Captured = Dict[int, Tuple[Any, Any, Any]]


# One tensor met: (tensor, the steps it was met under, outermost first).  Plain tuples, here
# and in walk()'s answer: a NamedTuple's __new__ is a Python call, once per tensor met.
_Met = Tuple[torch.Tensor, List[_Step]]
# What walk() found: (the copy frames from the caller outward, innermost first, none the walk
# stopped at; the frame it stopped at, found in `captured`, and that entry, or None; the
# outermost root frame walked, the top-level copy so far; the module copier frame that copies
# what that outermost frame copies, if any).
_Walk = Tuple[List[_Frame], Optional[Tuple[_Frame, Tuple[Any, Any, Any]]], Optional[_Frame],
              Optional[_Frame]]


def walk(caller: _Frame, boundary: _Frame, captured: _Captured) -> _Walk:
    """The copy frames from `caller` out to `boundary` (excluded), or to the first frame in
    `captured` (see `_Captured`) that runs the code and copies the object its entry names.

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
            # The entry of a frame gone since, whose id this one took, is no hit: the same id,
            # code and object is the same frame (an object copied again is a memo hit, which
            # meets no tensor under a frame of its own).
            if hit is not None and hit[0] is code and copied_by(frame) is hit[1]:
                return walked, (frame, hit), outermost, owner
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


def steps(frames: List[_Frame]) -> List[_Step]:
    """`frames` as a record keeps them: (id, the object each copies)."""
    return [(id(frame), copied_by(frame)) for frame in frames]


class Tracker:
    """The tensors one copy met, in order, with the steps (frames' ids, the objects they copy)
    each was met under; their paths.  No frame is held: see `_Step`."""

    __slots__ = ("root", "met", "failed", "__weakref__")

    def __init__(self, root: Any) -> None:
        self.root = root
        self.met: List[_Met] = []
        # ids of the entries of `met` whose copy failed: not reported, but their frames stay
        # captured, so a later tensor met under them continues their chain.
        self.failed: Set[int] = set()

    def add(self, tensor: torch.Tensor, walked: List[_Step], joined: Optional[_Step]) -> _Met:
        """Enter `tensor`, met under the copy frames `walked` (innermost first, none of them
        captured before) below the captured one `joined` (None: `walked` reaches the root)."""
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
        """Let go of what the copy met: its tensors and the source objects on their way."""
        self.met.clear()
        self.failed.clear()

    def entries(self) -> List[Entry]:
        """Every tensor met, in order, with its path from the root."""
        locator = Locator(self.root)
        # id(object met) -> the object the copy went through just before it (the first way
        # met): only asked for on a chain whose start is not yet known, so the chains met
        # since it was last asked wait in `unlinked` until then.
        up: Dict[int, Tuple[Any, Any]] = {id(self.root): (self.root, None)}
        unlinked: List[List[Any]] = []
        # id(first object of a chain) -> the chain of objects it starts, from a located one:
        # the tensors met under one frame (a module's children) share it.
        starts: Dict[int, List[Any]] = {}
        found = []
        failed = self.failed
        for met in self.met:
            tensor, frames = met
            # Each frame copies another object (deepcopy's own frame of a module copier it
            # calls was not walked; the tensor's own frame neither): no object twice in a row.
            chain: List[Any] = [x for _, x in frames]
            chain.append(tensor)
            unlinked.append(chain)
            start = starts.get(id(chain[0])) if frames else None
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
                    starts[id(chain[0])] = start
            if id(met) not in failed:
                # Entry's own __new__ is a Python call; tuple's makes the same Entry.
                found.append(tuple.__new__(Entry, (tensor, *locator.locate(start + chain[1:]))))
        return found


class CopyRecord(Tracker):
    """What mode `warn` reports about one top-level copy; see the module docstring for when
    and by whom it ends.

    It holds the source objects it met, and ids of frames, never a frame or the memo: a copy
    that fails is freed when its error is handled, as natively, while its record waits to be
    discarded.  Where a keep-alive list watches for its end, the record also ends when the
    memo is freed (the list with it): a failed copy's memo is freed with its error.
    """

    __slots__ = ("root_frame", "boundary", "setting", "owner", "watch", "finished_by_owner",
                 "captured", "thread")

    def __init__(self, root: Any, root_frame: Optional[_Frame], boundary: _Frame,
                 setting: ModeSetting) -> None:
        super().__init__(root)
        # id of the root's copy frame: the frame that finishes it is that one, while it runs.
        self.root_frame = id(root_frame) if root_frame is not None else None
        self.boundary = boundary
        self.setting = setting
        self.owner: Optional[int] = None  # id of the shim frame that finishes it, if any
        # A weak reference to the keep-alive list that watches for its end, if any.
        self.watch: Optional[weakref.ref[_KeepAlive]] = None
        self.finished_by_owner = False  # no keep-alive list: the owner finishes it as it returns
        self.captured: List[int] = []  # ids of the frames its thread's registry holds for it
        self.thread = _state.get()  # its thread's records and registry

    @property
    def immediate(self) -> bool:
        """True for a record whose end cannot be seen: it reports each tensor as copied."""
        return self.watch is None and not self.finished_by_owner

    def finish(self, memo: Any = None) -> None:
        """The copy is complete (with `memo`, whose keep-alive list saw it end, if any): one
        `DetachedTensorsWarning` naming every tensor detached.

        Raises whatever the warning filters make of the warning (`-W error`).
        """
        self._end(memo)
        if not self.reported:
            return
        entries = self.entries()
        self.release()
        warn_in_user_code(DetachedTensorsWarning(
            _report.detached_warning(self.root, self.setting, entries),
            [e.label for e in entries], [e.tensor for e in entries],
        ))
        _report.note_untested_torch_once()

    def capture(self, walked: List[_Frame], taken: List[_Step]) -> None:
        """Register `walked` (as `taken`, its steps) in this thread's registry: a later
        tensor's walk stops there."""
        captured = self.thread.captured
        for frame, (key, x) in zip(walked, taken):
            captured[key] = (frame.f_code, x, self)
            self.captured.append(key)

    def discard(self, memo: Any = None) -> None:
        """The copy failed (with `memo`, if known): nothing was detached, nothing is said."""
        self._end(memo)
        self.release()

    def _end(self, memo: Any) -> None:
        # Called once: an ended record is in no registry, no keep-alive list and no count.
        thread = self.thread
        if self in thread.records:
            thread.records.remove(self)
            captured = thread.captured
            for key in self.captured:
                entry = captured.get(key)
                if entry is not None and entry[2] is self:  # not a later frame's, of that id
                    del captured[key]
            self.captured.clear()
        watch, self.watch = self.watch, None
        keep = watch() if watch is not None else None
        if keep is not None:
            _unhook(memo, keep, self)
        if self.finished_by_owner:
            self.finished_by_owner = False
            _owned(self, -1)


class _KeepAlive(list):  # type: ignore[type-arg]
    """Stands in a memo for its keep-alive list while records whose root that memo copies are
    open: the append deepcopy makes for a record's root, from the root's own frame, finishes
    it.  It holds nothing itself: every append goes on to the memo's own list (`kept`), which
    goes back in its place, the very same list, when the last of those records finishes.  So
    hooking a memo shared by many copies costs the same however much it keeps alive.  It holds
    neither the memo nor a frame: when the memo is freed (a failed copy's, with its error), so
    is this list, and the records it watched are discarded (see `_memo_freed`)."""

    __slots__ = ("records", "kept", "__weakref__")
    records: List[CopyRecord]
    kept: List[Any]

    def append(self, obj: Any) -> None:
        self.kept.append(obj)
        if not self.records:
            # Left watching nothing by a failed copy's record, discarded where its memo was
            # not known: the memo is the caller's (copy._keep_alive's, or the shim's), which
            # gets its own list back now.
            memo = sys._getframe(1).f_locals.get(_protocol.MEMO_LOCAL)
            if memo is not None:
                _unhook(memo, self, None)
            return
        for record in self.records:
            if obj is record.root:
                frame = sys._getframe(_KEEP_ALIVE_DEPTH)
                # The root's own frame is running (it calls): its id is its own.
                if id(frame) == record.root_frame:
                    record.finish(frame.f_locals[_protocol.MEMO_LOCAL])
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
    if type(keep) is not _KeepAlive:
        hooked = _KeepAlive()
        hooked.records = []
        # The memo's own list, or the one deepcopy would have made on its first keep-alive.
        hooked.kept = keep if type(keep) is list else [] if keep is None else _Foreign(keep)
        _protocol.own_set(memo, id(memo), hooked)
        keep = hooked
    keep.records.append(record)
    record.watch = weakref.ref(keep, functools.partial(_memo_freed, weakref.ref(record)))


def _memo_freed(record: weakref.ref[CopyRecord], _: Any) -> None:
    """The keep-alive list watching `record`'s end is freed with its memo: the copy is over
    without its root's keep-alive (it failed, and its error has been handled)."""
    alive = record()
    if alive is not None and alive.watch is not None:
        alive.watch = None  # the list is gone: nothing to give back
        alive.discard()


class _Foreign(list):  # type: ignore[type-arg]
    """A keep-alive entry that is not a plain list (someone else's object): appends go to it
    as they would without the hook, and it goes back in its place."""

    __slots__ = ("target",)

    def __init__(self, target: Any) -> None:
        super().__init__()
        self.target = target

    def append(self, obj: Any) -> None:
        self.target.append(obj)


def _unhook(memo: Any, keep: _KeepAlive, record: Optional[CopyRecord]) -> None:
    """`record` (if any) no longer watches `keep`.  With `memo` (the one `keep` stands in,
    known where the copy finished, or found in the failed copy's traceback) and no other
    record watching, the memo gets its own list back; without it (a failed copy's record,
    discarded after its error was handled, its memo living on) `keep` stays, forwarding every
    append to that list, until the memo's next keep-alive append or record gives it back."""
    if record is not None and record in keep.records:
        keep.records.remove(record)
    if not keep.records and memo is not None and _protocol.own_get(memo, id(memo)) is keep:
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


class _Thread:
    """One thread's open records, oldest first, and the registry of the frames they walked."""

    __slots__ = ("records", "captured")

    def __init__(self) -> None:
        self.records: List[CopyRecord] = []
        self.captured: _Captured = {}


class _ThreadState(threading.local):
    def __init__(self) -> None:
        # An object of its own, so that a record can reach its thread's from anywhere (a
        # keep-alive list freed in another thread discards it there).
        self.thread = _Thread()

    def get(self) -> _Thread:
        return self.thread


_state = _ThreadState()


def record_for(tensor: torch.Tensor, caller: _Frame, setting: ModeSetting
               ) -> Tuple[CopyRecord, _Met]:
    """The open record of the top-level copy now meeting `tensor` (called by the frame
    `caller`), made on its first tensor; and the tensor's entry in it."""
    thread = _state.get()
    boundary = _boundary()
    walked, hit, outermost, owner = walk(caller, boundary, thread.captured)
    if hit is not None and hit[1][2].boundary is boundary:
        frame, (_, x, record) = hit
        taken = steps(walked)
        record.capture(walked, taken)
        return record, record.add(tensor, taken, (id(frame), x))
    # The first tensor of a copy.  Every open record of this scope is of a copy that ended
    # without saying so (a failure): its frames would have been met on the way.
    for stale in [r for r in thread.records if r.boundary is boundary]:
        stale.discard()
    if outermost is None:  # no copy frame: __deepcopy__ was called directly
        record = CopyRecord(tensor, None, boundary, setting)
        return record, record.add(tensor, [], None)
    record = CopyRecord(copied_by(outermost), outermost, boundary, setting)
    # A module at the root: its copier finishes the record when it returns, and discards it if
    # it raises.  Any other root: deepcopy's own last keep-alive append for it finishes it (a
    # Python call for every object the copy completes: the module copier's one look on return
    # is far cheaper, so modules never take this way).
    if owner is not None:
        record.owner = id(owner)
        _owned(record, +1)
        record.finished_by_owner = True
    elif outermost.f_code is _protocol.DEEPCOPY_CODE:
        memo = outermost.f_locals[_protocol.MEMO_LOCAL]
        if _hookable(memo):
            _hook(memo, record)
    taken = steps(walked)
    if not record.immediate:
        thread.records.append(record)
        # A tensor at the root: its own deepcopy frame (the caller) is the root frame, and the
        # tensors its copy meets (its dict, its grad) are met under it.
        if outermost is caller:
            record.capture([*walked, caller], [*taken, (id(caller), tensor)])
        else:
            record.capture(walked, taken)
    return record, record.add(tensor, taken, None)


def module_copy_ended(module: Any, failed: bool) -> None:
    """The module copier that copies `module` (its caller's frame) raises (`failed`), or
    returns: discard the records it owns, or finish those only it can see end.  Looks at
    frames only for a record whose root is `module`."""
    for record in _state.get().records:
        # The caller is running: its id is its own.
        if record.root is module and record.owner == id(sys._getframe(1)):
            if failed:
                record.discard()
            elif record.finished_by_owner:
                record.finish()
            return


def scope_ended(boundary: _Frame, tb: Any = None) -> None:
    """A scope entered by `boundary` ends (`boundary` None: the global setting changes, by
    `enable()` or `disable()`), with the traceback `tb` of the error it ends with, if any: a
    record of it whose copy is no longer running in this thread is of a copy that failed.
    (One still running, a scope left inside its own copy, goes on.)  The failed copy's root
    frame, in `tb`, names its memo, which gets its own keep-alive list back."""
    records = [r for r in _state.get().records if r.boundary is boundary]
    if records:
        running: Dict[int, _Frame] = {}
        frame: Optional[_Frame] = sys._getframe(1)
        while frame is not None:
            running[id(frame)] = frame
            frame = frame.f_back
        records = [r for r in records
                   if r.root_frame is None or not _runs(running.get(r.root_frame), r.root)]
    if not records:
        return
    failed = {}  # id(frame) -> frame, for the frames of the traceback (alive: it holds them)
    while tb is not None:
        failed[id(tb.tb_frame)] = tb.tb_frame
        tb = tb.tb_next
    for record in records:
        root = failed.get(record.root_frame) if record.root_frame is not None else None
        record.discard(root.f_locals.get(_protocol.MEMO_LOCAL) if root is not None else None)


def _runs(frame: Optional[_Frame], root: Any) -> bool:
    """True if `frame`, a running frame whose id a record took for its root's copy frame, is
    that frame: a root frame copying that root (a frame gone since may have left its id to
    another)."""
    return (frame is not None and id(frame.f_code) in _protocol.ROOT_FRAMES
            and copied_by(frame) is root)


def open_records() -> List[CopyRecord]:
    """This thread's open records (the module copier asks before looking for its own)."""
    return _state.get().records


def path_here(tensor: torch.Tensor, caller: _Frame) -> str:
    """The path of `tensor`, being copied now (called by the frame `caller`), from the root
    of its top-level copy."""
    root_frame, walked = top_level(caller)
    if root_frame is None:
        return ""
    tracker = Tracker(copied_by(root_frame))
    tracker.add(tensor, steps(walked), None)
    (entry,) = tracker.entries()
    return entry.label


# Last: a scope that ends in another thread reaches scope_ended only once this module is whole.
_modes.scope_end_hook = scope_ended
