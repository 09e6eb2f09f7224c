"""Mode strict's refusal: raised where torch refuses, reported in full only when read.

`refuse()` is called inside the very `Tensor.__deepcopy__` call torch refused, and its error
is raised there, with torch's error as its cause: code that catches the refusal inside a copy
(a `__deepcopy__` with a fallback) sees exactly what it sees without the shim, and a strict
copy fails exactly where a native one fails.  What the error says, its `.paths` and
`.tensors`, names every tensor with history the top-level copy would meet if it went on to its
end: a survey of that copy (see `_survey`), made without copying any tensor's data, when the
error is first read, once per top-level copy however many refusals it raised.  A refusal that
nobody reads costs what torch's own refusal costs.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from typing import Any, Callable, ContextManager, Dict, List, Optional, Tuple

import torch

from . import _protocol, _report, _survey
from ._access import Entry
from ._errors import NonLeafTensorError
from ._modes import Mode, ModeSetting
from ._record import Tracker, copied_by, top_level

__all__ = ["refuse"]

__tracebackhide__ = True

_Hold = Callable[[], ContextManager[Any]]


class _RefusedCopy:
    """A top-level copy that strict refused, once or more (where code caught a refusal and
    went on), and what a survey of it met, once someone reads one of its refusals."""

    __slots__ = ("root_frame", "memo", "length", "hold", "_found", "_lock", "__weakref__")

    def __init__(self, root_frame: Any, memo: Any, hold: _Hold) -> None:
        self.root_frame = root_frame
        self.memo = memo
        # The memo's entries made before this copy began come first in its order; how many
        # it had at the first refusal bounds what the copy had made by then.
        self.length = len(memo) if isinstance(memo, dict) else None
        self.hold = hold
        self._found: Optional[Tuple[List[Entry], Optional[str]]] = None
        self._lock = threading.Lock()

    def found(self, walked: List[Any]) -> Tuple[List[Entry], Optional[str]]:
        """What a survey of this copy met, and why it is incomplete (None: it is not)."""
        with self._lock:
            if self._found is None:
                self._found = self._survey(walked)
            return self._found

    def _survey(self, walked: List[Any]) -> Tuple[List[Entry], Optional[str]]:
        root = copied_by(self.root_frame)
        try:
            memo = _survey.dry_memo(self.memo, self._before_the_copy(root, walked))
            entries, error = _survey.run(root, memo, self.hold)
        except Exception as exc:  # the survey itself could not start
            return [], f"{type(exc).__name__}: {exc}"
        return entries, error

    def _before_the_copy(self, root: Any, walked: List[Any]) -> Dict[Any, Any]:
        """The memo's entries that were there before the copy began (a memo used again, one
        filled by hand): those the copy was on its way to, and everything after the first of
        them, are the copy's own."""
        memo = self.memo
        if not isinstance(memo, dict) or not self.length:
            return {}
        keys = list(itertools.islice(dict.keys(memo), self.length))
        on_the_way = {id(root), *(id(copied_by(frame)) for frame in walked)}
        first = next((i for i, key in enumerate(keys) if key in on_the_way), len(keys))
        return {key: dict.__getitem__(memo, key) for key in keys[:first]}


_latest = threading.local()  # the last refused copy of this thread, weakly


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
        refused = _RefusedCopy(root_frame, root_frame.f_locals.get(_protocol.MEMO_LOCAL), hold)
        _latest.copy = weakref.ref(refused)

    def report() -> Tuple[str, List[str], List[torch.Tensor]]:
        entries, problem = refused.found(walked)
        if not any(e.tensor is tensor for e in entries):
            own = Tracker(copied_by(root_frame))
            own.add(tensor, walked, None)
            entries = [*own.entries(), *entries]
            problem = problem or "the survey of the copy did not meet this tensor"
        message = _report.strict_refusal(copied_by(root_frame), setting, entries, problem, torch_words)
        return message, [e.label for e in entries], [e.tensor for e in entries]

    refusal = NonLeafTensorError._deferred(report)
    refusal.__cause__ = error
    return refusal
