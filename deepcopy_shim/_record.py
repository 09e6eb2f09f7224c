"""A top-level copy in a mode: its state, owned by the call that starts it, and what it met.

A *top-level copy* is a copy the shim sees start, in a thread or task where a mode applies:

- `copy.deepcopy` asks its dispatch table for a copier for every object it copies; while the
  shim is installed, that table answers the first object of a copy made where a mode applies
  (no copy of the shim's running in this context) with `_dispatch.copy_root`,
  which makes a `Copy`, runs the object's copy, and closes the `Copy` in its own `finally`;
- a tensor's `__deepcopy__` called directly where no `Copy` is running (by code of its own, or
  by a deepcopy that is not the standard library's) makes one for that tensor's copy.

The `Copy` lives in a context variable while its call runs (`_modes.running_copy`): every
object copied below it in the same thread or task, also by a copy a custom `__deepcopy__` starts
with a fresh memo, belongs to it, and is named once however often it is met; a copy made in a
scope entered inside it (or by `deepcopy_shim.deepcopy()`, `find_nonleaf_tensors()`) is a
top-level copy of its own, because entering a scope hides the running copy until the scope is
left.  Nothing of it is ever found again on the stack or in the memo: when its call ends, it ends,
whatever the caller keeps (a memo, an error).

What a `Copy` met is kept as *nodes*: `(object, parent node)`, from its root down to each
tensor with history, read off the copy frames between that tensor and the frame that started
the copy at the moment the tensor is met (see `Copy.meet`).  Each frame is read once: the
`Copy` holds the copy frames of the stack it read last, outermost first, so a frame's id names
that frame for as long as it is looked up; the next tensor's walk stops at the first of them
still on its stack and lets go of those read after it, which have returned.  What is held is
never more than one stack: the frames a copy has left, and everything their locals hold, are
not kept alive until it ends.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import torch

from . import _modes, _protocol, _report
from ._access import Entry, Locator
from ._errors import DetachedTensorsWarning
from ._modes import ModeSetting
from ._notices import warn_in_user_code

__all__ = ["Copy", "Node", "current", "current_copy", "entries", "opened", "surveying", "unplaced"]

# pytest leaves this module's frames out of the tracebacks it shows: a refused or failed copy
# ends in the user's code or copy's, not in the shim's bookkeeping.
__tracebackhide__ = True

_Frame = Any
_DEEPCOPY_CODE = _protocol.DEEPCOPY_CODE
_X_LOCAL = _protocol.X_LOCAL  # the local of a deepcopy frame that holds the object it copies
# (object, parent node): one object a copy went through, linked towards the copy's root.
Node = Tuple[Any, Any]
# One tensor met: (tensor, its node).
_Met = Tuple[torch.Tensor, Node]


class Copy:
    """One top-level copy: its root, memo and setting, the frame that started it, and the
    tensors with history it met, in order.

    Made and closed by the call that starts the copy (`DispatchTable.copy_root`, or `_tensor` for a
    tensor copied by a direct call); between the two it is this context's current copy (see
    `opened`).  Closing it lets go of the frames it walked; `met` and the nodes stay for its
    report, which its owner makes and then drops.
    """

    __slots__ = ("root", "memo", "start", "setting", "survey", "frame", "root_node", "met",
                 "named", "failed", "walked", "walked_at", "refused", "walking", "open")

    def __init__(self, root: Any, memo: Any, setting: Optional[ModeSetting], frame: _Frame,
                 survey: Any = None) -> None:
        self.root = root
        self.memo = memo
        # How many entries the memo held before the copy began (a memo used again, or filled by
        # hand): the survey of a strict refusal starts from those.  None: not a dict.
        self.start: Optional[int] = len(memo) if isinstance(memo, dict) else None
        self.setting = setting
        self.survey = survey  # the survey this copy is made for (see _survey), if any
        self.frame = frame  # the frame that started it: a walk up from a tensor stops there
        self.root_node: Node = (root, None)
        self.met: List[_Met] = []
        # id(tensor) -> its entry in `met`: a tensor met again (copied again without the memo)
        # is named once, where the copy met it first.  Its id is its own: `met` holds it.
        self.named: Dict[int, _Met] = {}
        self.failed: Set[int] = set()  # ids of entries of `met` whose copy failed
        # The copy frames of the stack read last, outermost first, each with its node; and
        # id(frame) -> its index there (an id is safe to look up: `walked` holds the frame).
        self.walked: List[Tuple[_Frame, Node]] = []
        self.walked_at: Dict[int, int] = {}
        self.walking = False  # True while `node_of` changes `walked`
        self.refused: Any = None  # its strict refusals (a _refusal.RefusedCopy), once one was raised
        self.open = True

    def node_of(self, caller: _Frame) -> Node:
        """The node of the innermost object being copied at the frame `caller` (the frame that
        called a tensor's `__deepcopy__`), reading each copy frame between it and the frame
        that started this copy once; the root's node where `caller` is not inside this copy."""
        if self.walking:
            # Re-entered while `walked` changes: code a deallocation or the garbage collector
            # ran in the middle (a finalizer that copies a tensor).  Read, change nothing.
            return self._read(caller)[0]
        self.walking = True
        try:
            node, kept, read = self._read(caller)
            if kept is None:
                return node
            walked, walked_at = self.walked, self.walked_at
            # Frames read at an earlier tensor that have returned since: released as this
            # call ends (`gone`), once `walked` is whole again, whatever their locals run then.
            gone = walked[kept:]
            del walked[kept:]
            for frame, _ in gone:
                del walked_at[id(frame)]
            for entry in read:
                walked_at[id(entry[0])] = len(walked)
                walked.append(entry)
            return node
        finally:
            self.walking = False

    def _read(self, caller: _Frame) -> Tuple[Node, Optional[int], List[Tuple[_Frame, Node]]]:
        """`(node, kept, read)`: the node at the frame `caller`; how many frames of `walked`
        are still on its stack (None where it is not below the frame that started this copy);
        and the copy frames above those, outermost first, each with its node.  Changes nothing."""
        walked, walked_at = self.walked, self.walked_at
        stop = self.frame
        pending: List[_Frame] = []
        node, kept = self.root_node, 0
        frame = caller
        while frame is not stop:
            if frame is None:
                return self.root_node, None, []
            index = walked_at.get(id(frame))
            if index is not None and index < len(walked) and walked[index][0] is frame:
                # Still running, so are the frames before it in `walked` (its callers); those
                # after it were read at an earlier tensor and have returned since.
                node, kept = walked[index][1], index + 1
                break
            if frame.f_code is _DEEPCOPY_CODE:
                pending.append(frame)
            frame = frame.f_back
        read = []
        for frame in reversed(pending):
            obj = frame.f_locals[_X_LOCAL]
            if obj is not node[0]:
                node = (obj, node)
            read.append((frame, node))
        return node, kept, read

    def tensor_node(self, tensor: torch.Tensor, caller: _Frame) -> Node:
        """The node of `tensor`, met by the frame `caller` (that called its `__deepcopy__`)."""
        node = self.root_node if tensor is self.root else self.node_of(caller)
        return node if node[0] is tensor else (tensor, node)

    def meet(self, tensor: torch.Tensor, caller: _Frame, setting: ModeSetting) -> Optional[_Met]:
        """Enter `tensor`, met by the frame `caller` in mode warn (`setting`, which the report
        names), to be reported when the copy is complete; None where this copy met it already
        (it is named once, where it was met first)."""
        self.setting = setting
        if id(tensor) in self.named:
            return None
        met = self.named[id(tensor)] = (tensor, self.tensor_node(tensor, caller))
        self.met.append(met)
        return met

    def forget(self, met: Optional[_Met]) -> None:
        """Leave `met` out of the report: its copy failed, so nothing was detached (met again
        later, it is named where its copy succeeds)."""
        if met is not None:
            self.failed.add(id(met))
            del self.named[id(met[0])]

    def path_of(self, tensor: torch.Tensor, caller: _Frame) -> str:
        """The path of `tensor`, being copied now (called by the frame `caller`)."""
        (entry,) = entries(self.root, [(tensor, self.tensor_node(tensor, caller))])
        return entry.label

    def inside_another_copy(self) -> bool:
        """True if a `copy.deepcopy` frame is on the stack below the frame that started this
        copy, other than the call that copies its root: this copy runs inside another, native
        or not."""
        own_call = True
        frame = self.frame.f_back if self.frame is not None else None
        while frame is not None:
            if frame.f_code is _DEEPCOPY_CODE:
                if not (own_call and frame.f_locals.get(_X_LOCAL) is self.root):
                    return True
                own_call = False
            frame = frame.f_back
        return False

    def close(self) -> None:
        """The copy's call ends: let go of the frames it walked, the memo, the copies and the
        refusals."""
        self.open = False
        self.walked.clear()
        self.walked_at.clear()
        self.named.clear()
        self.frame = self.memo = self.refused = None

    def report(self) -> None:
        """Mode warn, the copy complete: one `DetachedTensorsWarning` naming every tensor it
        detached, at the user's line; then let go of them.  Raises whatever the warning filters
        make of the warning (`-W error`)."""
        found = entries(self.root, [m for m in self.met if id(m) not in self.failed])
        self.met, self.failed, self.named = [], set(), {}
        if not found or self.setting is None:
            return
        warn_in_user_code(DetachedTensorsWarning(
            _report.detached_warning(self.root, self.setting, found),
            [e.label for e in found], [e.tensor for e in found],
        ))
        _report.note_untested_torch_once()


# current() -> the Copy running in this thread or task (see `_modes.running_copy`), open or not.
current: Callable[[], Optional[Copy]] = _modes.running_copy


def current_copy() -> Optional[Copy]:
    """The copy running in this thread or task, if it is still open; else None."""
    found = current()
    return found if found is not None and found.open else None


def surveying() -> bool:
    """True while a survey's copy (see `_survey`) runs in this thread or task."""
    found = current()
    return found is not None and found.open and found.survey is not None


class opened:
    """`with opened(copy_):` makes `copy_` this context's current copy, and closes it at the
    end, whatever happens in between; a copy strict refused gives its refusals their final
    words there, before its error reaches the caller (see `_refusal`)."""

    __slots__ = ("copy", "token")

    def __init__(self, copy_: Copy) -> None:
        self.copy = copy_

    def __enter__(self) -> Copy:
        self.token = _modes.start_copy(self.copy)
        return self.copy

    def __exit__(self, kind: Any, error: Optional[BaseException], traceback: Any) -> None:
        _modes.end_copy(self.token)
        copy_ = self.copy
        try:
            if copy_.refused is not None:
                copy_.refused.settle(copy_, error)
        finally:
            copy_.close()


def entries(root: Any, met: List[_Met]) -> List[Entry]:
    """Every tensor of `met`, in order, with its path from `root`.  A path that cannot be
    found (an object on the way whose own methods raise when read, as a mapping whose `items`
    does) leaves that tensor unplaced, with the reason; the others keep theirs."""
    locator = Locator(root)
    found = []
    for tensor, node in met:
        try:
            # Entry's own __new__ is a Python call; tuple's makes the same Entry.
            found.append(tuple.__new__(Entry, (tensor, *locator.locate(node))))
        except Exception as exc:
            found.append(unplaced(tensor, f"{type(exc).__name__}: {exc}"))
    return found


def unplaced(tensor: torch.Tensor, why: str) -> Entry:
    """`tensor`, named without a path: none could be found, for the reason `why`."""
    return Entry(tensor, "", f"not located: {why}")

