"""What the shim says: the warning hierarchy, the strict error, and one report per top-level copy.

A "top-level copy" is one ``copy.deepcopy`` call and everything it copies with the same ``memo``.
Its :class:`CopyReport` lives *inside* that memo (torch keeps its storage memo there too, under
the key ``"torch"``), so it is created at the first moment the shim has something to say and dies
with the copy: nothing global, nothing to clean up, correct across threads.
"""

from __future__ import annotations

import copy
import sys
import warnings
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Set, Tuple

from ._modes import Mode
from ._scan import describe_tensor, find_nonleaf_tensors

if TYPE_CHECKING:
    import torch

__all__ = [
    "DeepcopyShimWarning",
    "DetachedTensorsWarning",
    "PatchConflictWarning",
    "NonLeafTensorError",
    "CopyReport",
    "report_for",
]


class DeepcopyShimWarning(UserWarning):
    """Root of every warning deepcopy-shim emits; filter or escalate them all with
    ``-W error::deepcopy_shim.DeepcopyShimWarning``."""


class DetachedTensorsWarning(DeepcopyShimWarning):
    """Mode ``warn``: a deep copy detached non-leaf tensors (one warning per top-level copy)."""


class PatchConflictWarning(DeepcopyShimWarning):
    """Someone else replaced an attribute deepcopy-shim had patched; it was left in place."""


class NonLeafTensorError(RuntimeError):
    """Mode ``strict``: the object holds tensors with autograd history, so nothing was copied.

    A ``RuntimeError`` like torch's own refusal, so ``except RuntimeError`` code keeps working.
    ``paths`` names every offending tensor (``''`` is the copied object itself) and ``mode``
    is the mode that refused.
    """

    def __init__(self, message: str, *, paths: Tuple[str, ...], mode: Mode) -> None:
        super().__init__(message)
        self.paths = paths
        self.mode = mode


for _cls in (DeepcopyShimWarning, DetachedTensorsWarning, PatchConflictWarning, NonLeafTensorError):
    _cls.__module__ = "deepcopy_shim"

_UNKNOWN_PATH = "<reached only through a custom copy protocol>"
# Frames of these packages are never "the user's call site" a warning should point at.
_INTERNAL_PACKAGES = ("copy", "torch", "wrapt", "deepcopy_shim")
_DEEPCOPY_CODE = copy.deepcopy.__code__


class _ReportKey:
    """The memo key of a copy's report; not an int, so it can never collide with an ``id()``."""

    def __repr__(self) -> str:
        return "<deepcopy_shim report>"


_KEY = _ReportKey()


class CopyReport:
    """Everything the shim knows about one top-level copy: its root and what it detached."""

    __slots__ = ("root", "_findings", "_reported", "strict_checked")

    def __init__(self, root: Any) -> None:
        self.root = root
        self._findings: Optional[List[Tuple[str, torch.Tensor]]] = None
        self._reported: Set[int] = set()
        self.strict_checked = False

    def attach(self, memo: Dict[Any, Any]) -> None:
        memo[_KEY] = self

    @property
    def findings(self) -> List[Tuple[str, torch.Tensor]]:
        """The non-leaf tensors reachable from the root; scanned once, on first use."""
        if self._findings is None:
            self._findings = find_nonleaf_tensors(self.root)
        return self._findings

    def check_strict(self) -> None:
        """Raise :class:`NonLeafTensorError` if the root holds any non-leaf tensor (once)."""
        if not self.strict_checked:
            self.strict_checked = True
            if self.findings:
                raise self._strict_error(self.findings)

    def refuse(self, tensor: torch.Tensor) -> NonLeafTensorError:
        """The strict error for a copy that has just met the non-leaf ``tensor``."""
        return self._strict_error(self._with(tensor))

    def warn_detached(self, tensor: torch.Tensor) -> None:
        """Mode ``warn``: emit the copy's single warning, naming every tensor it detaches.

        Called for each detached tensor; only the first call of a copy warns, listing all the
        scan found.  A tensor the scan could not see (hidden behind a custom ``__reduce__`` or
        ``__deepcopy__``) gets one more warning of its own, since it could not be named earlier.
        """
        if id(tensor) in self._reported:
            return
        items = self._with(tensor)
        fresh = [(p, t) for p, t in items if id(t) not in self._reported]
        self._reported.update(id(t) for _, t in items)
        count = len(fresh)
        message = (
            f"deepcopy_shim (mode='warn'): deep copy of {_name(self.root)} detached "
            f"{count} non-leaf tensor{'s' if count != 1 else ''} (tensors with autograd history); "
            "each copy is a leaf with the same values and requires_grad, without the graph:\n"
            f"{_lines(fresh)}\n"
            "Silence with mode='silent', refuse with mode='strict', or detach/drop these tensors "
            "before copying."
        )
        warnings.warn(message, DetachedTensorsWarning, stacklevel=_user_stacklevel(self))

    def _with(self, tensor: torch.Tensor) -> List[Tuple[str, torch.Tensor]]:
        items = self.findings
        if any(t is tensor for _, t in items):
            return items
        return [*items, (_UNKNOWN_PATH, tensor)]

    def _strict_error(self, items: List[Tuple[str, torch.Tensor]]) -> NonLeafTensorError:
        count = len(items)
        example = next((p for p, _ in items if p and not any(c in p for c in "[{<")), None)
        how = f" (e.g. `obj.{example} = obj.{example}.detach()` or `del obj.{example}`)" if example else ""
        message = (
            f"deepcopy_shim (mode='strict') refused to deep-copy {_name(self.root)}: "
            f"{count} non-leaf tensor{'s' if count != 1 else ''} (tensors with autograd history) "
            f"{'are' if count != 1 else 'is'} reachable from it:\n{_lines(items)}\n"
            "Nothing was copied and the source is unchanged. To copy anyway, use mode='warn' or "
            "mode='silent' (deepcopy_shim.enabled(mode='warn'), deepcopy_shim.deepcopy(obj, "
            "mode='warn')) to get detached leaf copies; or detach or remove these tensors "
            f"before copying{how}."
        )
        return NonLeafTensorError(message, paths=tuple(p for p, _ in items), mode=Mode.STRICT)


def report_for(memo: Dict[Any, Any], obj: Any) -> CopyReport:
    """The report of the top-level copy that ``memo`` belongs to, created on first use.

    Its root is the object handed to the outermost ``copy.deepcopy`` call that uses ``memo``
    (found on the Python stack), or ``obj`` when there is none (a C implementation of deepcopy,
    or a direct ``__deepcopy__(memo)`` call).
    """
    report = memo.get(_KEY)
    if report is None:
        frame = _outermost_copy_frame(memo)
        report = CopyReport(frame.f_locals.get("x") if frame is not None else obj)
        report.attach(memo)
    return report


def _outermost_copy_frame(memo: Dict[Any, Any]) -> Any:
    found = None
    frame: Any = sys._getframe(1)
    while frame is not None:
        if frame.f_code is _DEEPCOPY_CODE and frame.f_locals.get("memo") is memo:
            found = frame
        frame = frame.f_back
    return found


def _user_stacklevel(report: CopyReport) -> int:
    """``stacklevel`` for a ``warnings.warn`` made by the caller of this function's caller.

    It points at the first frame above the outermost ``copy.deepcopy`` of this copy that is not
    in copy, torch, wrapt or deepcopy_shim: the user's line, also when the copy was made by
    library code such as ``AveragedModel(model)``.
    """
    memo_frame = None
    frames = []
    frame: Any = sys._getframe(1)  # the frame that calls warnings.warn
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    memo = None
    for frame in frames:
        local_memo = frame.f_locals.get("memo") if frame.f_code is _DEEPCOPY_CODE else None
        if isinstance(local_memo, dict) and local_memo.get(_KEY) is report:
            memo, memo_frame = local_memo, frame
    start = frames.index(memo_frame) + 1 if memo is not None else 0
    for level in range(start, len(frames)):
        module = frames[level].f_globals.get("__name__", "")
        if module.split(".", 1)[0] not in _INTERNAL_PACKAGES:
            return level + 1
    return len(frames)


def _name(obj: Any) -> str:
    cls = type(obj)
    if cls.__module__ == "builtins":
        return f"a {cls.__qualname__}"
    return f"a {cls.__module__}.{cls.__qualname__}"


def _lines(items: List[Tuple[str, Any]]) -> str:
    return "\n".join(f"  {path or '<the copied object itself>'}: {describe_tensor(t)}" for path, t in items)
