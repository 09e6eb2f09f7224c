"""Mode strict's refusal: raised where torch refuses, its words made by the copy that raised it.

`refuse()` is called inside the very `Tensor.__deepcopy__` call torch refused, and its error
is raised there, with torch's error as its cause: code that catches the refusal inside a copy
(a `__deepcopy__` with a fallback) sees exactly what it sees without the shim, and a strict
copy fails exactly where a native one fails.

What the error says, its `.paths` and `.tensors`, is made final by the call that started the
top-level copy, as that call ends (`RefusedCopy.settle`, from `_record.opened`), never later:

- the copy ends with the refusal (raised, or the cause or context of what is raised): a survey
  of the copy (see `_survey`) names every tensor with history it would meet if it went on to
  its end, without copying any tensor's data; one survey serves every refusal of the copy.
  It runs there, before the error reaches the caller, with none of the copy's methods still
  running;
- the copy ends otherwise (code inside it caught the refusal and went on, or another error
  ended it), or it ran inside another copy on this thread's stack, whose copy methods a survey
  could call while they are still running, or its survey was interrupted: the refusal names
  the tensor it refused and says the list may be incomplete and how to get the rest.

Read before its copy has ended (caught inside a `__deepcopy__`), a refusal names the refused
tensor and says the same.  Reading a refusal never calls a copy method, and once its copy has
ended the error holds only what it says: no root, no memo, its tensors weakly.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, ContextManager, Dict, List, Optional, Tuple

import torch

from . import _report, _survey
from ._access import Entry
from ._errors import NonLeafTensorError
from ._modes import ModeSetting
from ._record import Copy, Node, entries, unplaced

__all__ = ["RefusedCopy", "refuse"]

__tracebackhide__ = True

_Hold = Callable[[], ContextManager[Any]]
_Answer = Tuple[str, List[str], List[torch.Tensor]]


class _Refusal:
    """One refusal of a copy, and what its words are made from: the refused tensor and its
    node.  Called (by the error, read before the copy has ended), it answers for that tensor
    alone."""

    __slots__ = ("error", "tensor", "node", "root", "setting", "torch_words")

    def __init__(self, copy_: Copy, tensor: torch.Tensor, node: Node, setting: ModeSetting,
                 torch_words: str) -> None:
        self.error: Optional[NonLeafTensorError] = None
        self.tensor, self.node, self.root = tensor, node, copy_.root
        self.setting, self.torch_words = setting, torch_words

    def own(self) -> Entry:
        """The refused tensor, located."""
        (entry,) = entries(self.root, [(self.tensor, self.node)])
        return entry

    def __call__(self) -> _Answer:
        return self.answer([self.own()], _report.READ_BEFORE_THE_END)

    def answer(self, found: List[Entry], problem: Optional[str]) -> _Answer:
        message = _report.strict_refusal(self.root, self.setting, found, problem, self.torch_words)
        return message, [e.label for e in found], [e.tensor for e in found]


class RefusedCopy:
    """A top-level copy that strict refused, once or more (where code caught a refusal and
    went on): its refusals, and what a survey of it needs (its root, and its memo where the
    memo held entries before the copy began), until the copy's call ends."""

    __slots__ = ("root", "memo", "kind", "before", "hold", "refusals")

    def __init__(self, copy_: Copy, hold: _Hold) -> None:
        self.root = copy_.root
        self.kind = type(copy_.memo)  # the survey's memo is of its class
        self.before = copy_.start or 0  # the memo's entries made before the copy began
        self.memo = copy_.memo if self.before else None
        self.hold = hold
        self.refusals: List[_Refusal] = []

    def settle(self, copy_: Copy, ended_by: Optional[BaseException]) -> None:
        """`copy_`'s call ends, raising `ended_by` (None: it completed): give each refusal it
        raised its final words, and let go of everything else.  An interruption of the survey
        (KeyboardInterrupt) goes on from here, each refusal naming its own tensor."""
        refusals, self.refusals = self.refusals, []
        found: Optional[List[Entry]] = None
        problem: Optional[str] = _report.SURVEY_INTERRUPTED
        try:
            # (An interruption, KeyboardInterrupt or SystemExit, is no refusal's end: it goes on
            # at once, whatever it was raised from.)
            if not isinstance(ended_by, Exception) or not any(
                    _raised_by(ended_by, r.error) for r in refusals):
                problem = _report.NOT_THE_END
            elif copy_.inside_another_copy():
                problem = _report.INSIDE_ANOTHER_COPY
            else:
                found, problem = self._survey()
        finally:
            self.root = self.memo = None
            # (Made where no torch function mode of the user's sees the shim's reads.)
            with torch._C.DisableTorchFunction():
                for refusal in refusals:
                    assert refusal.error is not None
                    try:
                        refusal.error._settle(*_words(refusal, found, problem))
                    finally:  # interrupted meanwhile: final words all the same, no path
                        if refusal.error._make is not None:
                            refusal.error._settle(*refusal.answer(
                                [unplaced(refusal.tensor, "interrupted")], problem))

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


def _words(refusal: _Refusal, found: Optional[List[Entry]], problem: Optional[str]) -> _Answer:
    """A refusal's final words: what the survey `found`, with the refused tensor where the
    survey did not meet it (None: there was no survey: that tensor alone)."""
    if found is None:
        return refusal.answer([refusal.own()], problem)
    if not any(e.tensor is refusal.tensor for e in found):
        own = refusal.own()
        # A tensor a reduction makes afresh at each call is met by the survey as a tensor of
        # its own, in the same place: named once.  Any other the survey did not meet is
        # named, and said to be missing from the survey.
        if problem is not None or not any(e.label == own.label for e in found):
            return refusal.answer([own, *found],
                                  problem or "the survey of the copy did not meet this tensor")
    return refusal.answer(found, problem)


def _raised_by(ended_by: Optional[BaseException], error: Optional[BaseException]) -> bool:
    """True if `error` is `ended_by`, or its cause or context, or theirs."""
    seen: List[BaseException] = []
    pending = [ended_by]
    while pending:
        each = pending.pop()
        if each is None or any(each is s for s in seen):
            continue
        if each is error:
            return True
        seen.append(each)
        pending += [each.__cause__, each.__context__]
    return False


def refuse(tensor: torch.Tensor, caller: Any, setting: ModeSetting, error: RuntimeError,
           hold: _Hold, copy_: Copy) -> NonLeafTensorError:
    """The `NonLeafTensorError` for `tensor`, which torch refused with `error` (its cause),
    met by the frame `caller` in mode strict (`setting`) in the top-level copy `copy_`;
    `hold()` keeps the patch installed for the survey made when the copy ends.  The caller
    raises it."""
    refused = copy_.refused
    if refused is None:
        refused = copy_.refused = RefusedCopy(copy_, hold)
    made = _Refusal(copy_, tensor, copy_.tensor_node(tensor, caller), setting, str(error))
    refusal = made.error = NonLeafTensorError._deferred(made)
    refused.refusals.append(made)
    refusal.__cause__ = error
    return refusal
