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
from typing import Any, Callable, ContextManager, Dict, List, Optional, Tuple

import torch

from . import _report, _survey
from ._access import Entry
from ._errors import NonLeafTensorError
from ._modes import ModeSetting
from ._record import Copy, copy_running, entries

__all__ = ["refuse"]

__tracebackhide__ = True

_Hold = Callable[[], ContextManager[Any]]


class _RefusedCopy:
    """A top-level copy that strict refused, once or more (where code caught a refusal and
    went on), and what a survey of it met, once someone reads one of its refusals.  It holds
    the copy's root (and its memo, where the memo held entries before the copy began) until
    the survey is made, and then only what the survey found."""

    __slots__ = ("root", "memo", "kind", "before", "hold", "_found", "_lock")

    def __init__(self, copy_: Copy, hold: _Hold) -> None:
        self.root = copy_.root
        self.kind = type(copy_.memo)  # the survey's memo is of its class
        self.before = copy_.start or 0  # the memo's entries made before the copy began
        self.memo = copy_.memo if self.before else None
        self.hold = hold
        self._found: Optional[Tuple[List[Entry], Optional[str]]] = None
        self._lock = threading.Lock()

    def found(self) -> Tuple[List[Entry], Optional[str]]:
        """What a survey of this copy met, and why it is incomplete (None: it is not)."""
        with self._lock:
            if self._found is None:
                self._found = self._survey()
                self.root = self.memo = None
            return self._found

    def _survey(self) -> Tuple[List[Entry], Optional[str]]:
        try:
            memo = _survey.dry_memo(self.kind, self._before_the_copy())
            return _survey.run(self.root, memo, self.hold)
        except Exception as exc:  # the survey itself could not start
            return [], f"{type(exc).__name__}: {exc}"

    def _before_the_copy(self) -> Dict[Any, Any]:
        """The memo's entries that were there before the copy began (a memo used again, one
        filled by hand): its first entries, as many as it held then."""
        memo = self.memo
        if memo is None:
            return {}
        keys = list(itertools.islice(dict.keys(memo), self.before))
        return {key: dict.__getitem__(memo, key) for key in keys if key in memo}


def refuse(tensor: torch.Tensor, caller: Any, setting: ModeSetting, error: RuntimeError,
           hold: _Hold, copy_: Copy) -> NonLeafTensorError:
    """The `NonLeafTensorError` for `tensor`, which torch refused with `error` (its cause),
    met by the frame `caller` in mode strict (`setting`) in the top-level copy `copy_`;
    `hold()` keeps the patch installed for a survey made later.  The caller raises it."""
    refused = copy_.refused
    if refused is None:
        refused = copy_.refused = _RefusedCopy(copy_, hold)
    torch_words = str(error)
    # The copy's root and the refused tensor's way from it, for a message made where no
    # survey runs: held until the error's answer is final, then dropped with this closure.
    root, node = copy_.root, copy_.tensor_node(tensor, caller)

    def report() -> Tuple[str, List[str], List[torch.Tensor], bool]:
        # The survey copies the root again, through every copy method on the way.  While a
        # copy runs in this thread (this one, caught and read inside a __deepcopy__, or
        # another around it) that would call a method that is still running (one holding a
        # lock would wait for itself): only the refused tensor is named there, and the full
        # list is made when the error is read again once no copy runs.
        inside = copy_running(sys._getframe(1))
        found, problem = ([], _report.READ_INSIDE_A_COPY) if inside else refused.found()
        if not any(e.tensor is tensor for e in found):
            (own,) = entries(root, [(tensor, node)])
            # A tensor a reduction makes afresh at each call is met by the survey as a tensor
            # of its own, in the same place: named once.  Any other the survey did not meet is
            # named, and said to be missing from the survey.
            if problem is not None or not any(e.label == own.label for e in found):
                found = [own, *found]
                problem = problem or "the survey of the copy did not meet this tensor"
        message = _report.strict_refusal(root, setting, found, problem, torch_words)
        return message, [e.label for e in found], [e.tensor for e in found], not inside

    refusal = NonLeafTensorError._deferred(report)
    refusal.__cause__ = error
    return refusal
