"""Mode strict's refusal: raised where torch refuses, reported in full only when read.

`refuse()` is called inside the very `Tensor.__deepcopy__` call torch refused, and its error
is raised there, with torch's error as its cause: code that catches the refusal inside a copy
(a `__deepcopy__` with a fallback) sees exactly what it sees without the shim, and a strict
copy fails exactly where a native one fails.  What the error says, its `.paths` and
`.tensors`, names every tensor with history the top-level copy would meet if it went on to its
end: a survey of that copy (see `_survey`), made without copying any tensor's data, when the
error is first read, once per top-level copy however many refusals it raised.  A refusal that
nobody reads costs what torch's own refusal costs.  A refusal read while a copy runs in the
reading thread (caught inside a `__deepcopy__`) is not surveyed there: the survey would call
copy methods that are still running; it names the refused tensor, says the list may be
incomplete, and is surveyed when read again after the copy.
"""

from __future__ import annotations

import itertools
import sys
import threading
import weakref
from typing import Any, Callable, ContextManager, Dict, FrozenSet, List, Optional, Tuple

import torch

from . import _protocol, _report, _survey
from ._access import Entry
from ._errors import NonLeafTensorError
from ._modes import Mode, ModeSetting
from ._record import Tracker, copied_by, copy_running, steps, top_level

__all__ = ["refuse"]

__tracebackhide__ = True

_Hold = Callable[[], ContextManager[Any]]


class _RefusedCopy:
    """A top-level copy that strict refused, once or more (where code caught a refusal and
    went on), and what a survey of it met, once someone reads one of its refusals."""

    __slots__ = ("root_frame", "memo", "start", "hold", "_found", "_lock", "__weakref__")

    def __init__(self, root_frame: Any, memo: Any, start: _Start, hold: _Hold) -> None:
        self.root_frame = root_frame
        self.memo = memo
        self.start = start
        self.hold = hold
        self._found: Optional[Tuple[List[Entry], Optional[str]]] = None
        self._lock = threading.Lock()

    def found(self) -> Tuple[List[Entry], Optional[str]]:
        """What a survey of this copy met, and why it is incomplete (None: it is not)."""
        with self._lock:
            if self._found is None:
                self._found = self._survey()
            return self._found

    def _survey(self) -> Tuple[List[Entry], Optional[str]]:
        root = copied_by(self.root_frame)
        try:
            memo = _survey.dry_memo(self.memo, self._before_the_copy())
            entries, error = _survey.run(root, memo, self.hold)
        except Exception as exc:  # the survey itself could not start
            return [], f"{type(exc).__name__}: {exc}"
        return entries, error

    def _before_the_copy(self) -> Dict[Any, Any]:
        """The memo's entries that were there before the copy began (a memo used again, one
        filled by hand): of those it held at the copy's first refusal, the copy's own are the
        first of the objects it was then on its way to, and everything after it."""
        memo = self.memo
        _, length, on_the_way = self.start
        if not isinstance(memo, dict) or not length:
            return {}
        keys = list(itertools.islice(dict.keys(memo), length))
        first = next((i for i, key in enumerate(keys) if key in on_the_way), len(keys))
        return {key: dict.__getitem__(memo, key) for key in keys[:first]}


# Where a top-level copy stood at its first refusal: (ids of its root frame, its root and its
# memo; how many entries the memo held; ids of the objects the copy was on its way to).  Only
# ids and counts: a refusal caught and dropped (a fallback that copies without the tensor)
# lets go of its copy, and a later refusal of the same copy still knows where the copy began
# (the memo's entries made after that point, such as the fallback's own, are the copy's).
_Start = Tuple[Tuple[int, int, int], Optional[int], FrozenSet[int]]
_latest = threading.local()  # the last refused copy of this thread, weakly; where it began


def _start(root_frame: Any, memo: Any, walked: List[Any]) -> _Start:
    root = copied_by(root_frame)
    key = (id(root_frame), id(root), id(memo))
    known: Optional[_Start] = getattr(_latest, "start", None)
    if known is not None and known[0] == key:
        return known
    start = (key, len(memo) if isinstance(memo, dict) else None,
             frozenset((id(root), *(id(copied_by(frame)) for frame in walked))))
    _latest.start = start
    return start


def refuse(tensor: torch.Tensor, caller: Any, setting: ModeSetting, error: RuntimeError,
           hold: _Hold) -> NonLeafTensorError:
    """The `NonLeafTensorError` for `tensor`, which torch refused with `error` (its cause),
    met by the frame `caller` in mode strict (`setting`); `hold()` keeps the patch installed
    for a survey made later.  The caller raises it."""
    root_frame, walked = top_level(caller)
    torch_words = str(error)
    if root_frame is None:  # a direct __deepcopy__ call: the tensor is all there is
        entries = [Entry(tensor, "", None)]
        refusal = NonLeafTensorError(
            _report.strict_refusal(tensor, setting, entries, None, torch_words),
            paths=[e.label for e in entries], mode=Mode.STRICT, tensors=[tensor],
        )
        refusal.__cause__ = error
        return refusal
    cached = getattr(_latest, "copy", None)
    refused = cached() if cached is not None else None
    if refused is None or refused.root_frame is not root_frame:
        # The root's memo (the module copier's, under a deepcopy written in C, is named alike).
        memo = root_frame.f_locals.get(_protocol.MEMO_LOCAL)
        refused = _RefusedCopy(root_frame, memo, _start(root_frame, memo, walked), hold)
        _latest.copy = weakref.ref(refused)

    def report() -> Tuple[str, List[str], List[torch.Tensor], bool]:
        # The survey copies the root again, through every copy method on the way.  While a
        # copy runs in this thread (this one, caught and read inside a __deepcopy__, or
        # another around it) that would call a method that is still running (one holding a
        # lock would wait for itself): only the refused tensor is named there, and the full
        # list is made when the error is read again once no copy runs.
        inside = copy_running(sys._getframe(1))
        entries, problem = ([], _report.READ_INSIDE_A_COPY) if inside else refused.found()
        if not any(e.tensor is tensor for e in entries):
            own = Tracker(copied_by(root_frame))
            own.add(tensor, steps(walked), None)
            entries = [*own.entries(), *entries]
            problem = problem or "the survey of the copy did not meet this tensor"
        message = _report.strict_refusal(copied_by(root_frame), setting, entries, problem, torch_words)
        return message, [e.label for e in entries], [e.tensor for e in entries], not inside

    refusal = NonLeafTensorError._deferred(report)
    refusal.__cause__ = error
    return refusal
