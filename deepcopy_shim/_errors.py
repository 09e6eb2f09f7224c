"""The package's warnings and errors.

Every warning deepcopy-shim emits derives from `DeepcopyShimWarning`, so one filter
covers them all: `python -W error:deepcopy_shim` at the command line (every message starts
with `deepcopy_shim`), or `error::deepcopy_shim.DeepcopyShimWarning` in pytest's
`filterwarnings` and in `warnings.filterwarnings` calls.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Sequence, Tuple

from ._modes import Mode

if TYPE_CHECKING:
    import torch

# What a refusal says: its message, paths and tensors (weak references).
_Report = Tuple[str, Tuple[str, ...], Tuple[Any, ...]]

__all__ = [
    "DeepcopyShimWarning",
    "DetachedCopyError",
    "DetachedTensorsWarning",
    "NonLeafTensorError",
    "PatchConflictWarning",
    "TorchCompatibilityWarning",
]


class DeepcopyShimWarning(UserWarning):
    """Root of every warning deepcopy-shim emits.

    Escalate or silence them all with `python -W error:deepcopy_shim` (a message filter:
    CPython cannot name a third-party category in `-W` at start-up), or with
    `"error::deepcopy_shim.DeepcopyShimWarning"` in pytest's `filterwarnings`.
    """

    __module__ = "deepcopy_shim"


class DetachedTensorsWarning(DeepcopyShimWarning):
    """Mode `warn`: a deep copy detached tensors with autograd history.

    One per top-level copy, emitted when the copy has completed.  `paths` names every
    detached tensor, in the order the copy met them (the message lists the first 20, each with
    its `grad_fn`, shape, dtype and device), and `tensors` gives the same tensors (those of the
    source), in the same order, while they live: the warning holds them weakly, so that a
    recorded warning keeps no tensor, and no autograd graph, alive (`None` for one since freed).
    """

    __module__ = "deepcopy_shim"

    def __init__(self, message: str, paths: Sequence[str] = (),
                 tensors: Sequence[torch.Tensor] = ()) -> None:
        super().__init__(message)
        self.paths: Tuple[str, ...] = tuple(paths)
        self._tensors = _weakly(tensors)

    @property
    def tensors(self) -> Tuple[Optional[torch.Tensor], ...]:
        return tuple(ref() for ref in self._tensors)

    def __reduce__(self) -> Any:
        # Pickled (sent back from a worker process) as what it says; its tensors, which cannot
        # be pickled, come back absent.
        return (_rebuild_warning, (type(self), str(self), self.paths, len(self._tensors)))


def _rebuild_warning(cls: Any, message: str, paths: Tuple[str, ...], count: int) -> Any:
    made = cls(message, paths)
    made._tensors = (_absent,) * count
    return made


def _absent() -> None:
    """What a tensor an unpickled warning or error named is: absent (as a weak reference to a
    tensor since freed answers)."""
    return None


class PatchConflictWarning(DeepcopyShimWarning):
    """Someone else replaced an attribute deepcopy-shim had patched; theirs was left in place."""

    __module__ = "deepcopy_shim"


class TorchCompatibilityWarning(DeepcopyShimWarning):
    """The installed torch is newer than any deepcopy-shim was tested with, or it no longer
    refuses non-leaf tensors the way the shim expects (then the shim stays out of the way)."""

    __module__ = "deepcopy_shim"


class NonLeafTensorError(RuntimeError):
    """Mode `strict`: the copy met a tensor with autograd history, so it was refused.

    Raised where torch raises its own refusal, inside that tensor's `__deepcopy__`, with
    torch's error as `__cause__`: a `RuntimeError` like torch's, so code that catches the
    refusal (`except RuntimeError`, inside a copy or around it) behaves as without the shim,
    and the message keeps torch's words ("graph leaves").  No part of the copy escapes and
    nothing in the source is detached.

    The message, `paths` and `tensors` name every tensor with history the copy would have met
    if it had gone on to its end (what mode `silent` would detach), worked out by the copy
    that raised the error as it ends with it, without copying any tensor's data; reading the
    error runs nothing.  Where that list cannot be complete (the copy went on past the
    refusal, ran inside another copy, or could not be followed without the data), the message
    says why and how to get the rest, and still names the refused tensor.

    Attributes:
        paths: those tensors in the order the copy meets them, as Python access paths from the
            copied object (`''` is the object itself).
        tensors: the same tensors (those of the source), in the same order, while they live:
            held weakly, as the warning's are (`None` for one since freed).
        mode: the mode that refused (`Mode.STRICT`).
    """

    __module__ = "deepcopy_shim"

    def __init__(self, message: str = "", *, paths: Sequence[str] = (), mode: Mode = Mode.STRICT,
                 tensors: Sequence[torch.Tensor] = ()) -> None:
        # (Every argument but the message has a default: `raise type(exc)(f"...: {exc}")`, an
        # idiom for adding context, makes one as it makes any RuntimeError.)
        super().__init__(message)
        self.mode = mode
        self._report: Optional[_Report] = (message, tuple(paths), _weakly(tensors))
        self._make: Optional[Callable[[], Tuple[str, List[str], List[Any]]]] = None
        self._args: Optional[Tuple[Any, ...]] = None  # args code gave it, as given

    @classmethod
    def _deferred(cls, make: Callable[[], Tuple[str, List[str], List[Any]]]) -> NonLeafTensorError:
        """An error whose message, paths and tensors are `make()`'s answer, asked at each read,
        until `_settle` gives its final ones."""
        error = cls("", paths=(), mode=Mode.STRICT)
        error._report = None
        error._make = make
        return error

    def _settle(self, message: str, paths: Sequence[str], tensors: Sequence[Any]) -> None:
        """The final message, paths and tensors; `make()` is let go.  Args code gave the error
        meanwhile (`exc.args = (f"while ...: {exc}",)`, to add context) stay, the words they
        quote of the error replaced by the final ones."""
        if self._args is not None:
            make = self._make
            try:
                said = make()[0] if make is not None else ""
            except Exception:
                said = ""
            if said:
                self._args = tuple(a.replace(said, message) if isinstance(a, str) else a
                                   for a in self._args)
            message = _as_str(self._args)
        self._report = (message, tuple(paths), _weakly(tensors))
        self._make = None

    def _resolved(self) -> _Report:
        # Read in this order: `_settle` sets the report before it lets `make` go.
        make = self._make
        report = self._report
        if report is not None:
            return report
        assert make is not None
        message, paths, tensors = make()
        return message, tuple(paths), _weakly(tensors)

    @property
    def paths(self) -> Tuple[str, ...]:
        return self._resolved()[1]

    @property
    def tensors(self) -> Tuple[Optional[torch.Tensor], ...]:
        return tuple(ref() for ref in self._resolved()[2])

    @property
    def args(self) -> Tuple[Any, ...]:
        return self._args if self._args is not None else (self._resolved()[0],)

    @args.setter
    def args(self, value: Sequence[Any]) -> None:
        rest = self._resolved()[1:]
        self._args = tuple(value)
        self._report = (_as_str(self._args), *rest)

    def __str__(self) -> str:
        return self._resolved()[0]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self)!r})"

    def __reduce__(self) -> Any:
        # Pickled (sent back from a worker process) as what it says; the tensors, which hold
        # autograd history and cannot be pickled, come back absent.
        message, paths, tensors = self._resolved()
        return (_rebuild_refusal, (type(self), message, paths, self.mode, len(tensors)))


def _as_str(args: Tuple[Any, ...]) -> str:
    """What `str()` of an exception with these args is (BaseException's rule)."""
    return "" if not args else str(args[0]) if len(args) == 1 else str(args)


def _weakly(tensors: Sequence[Any]) -> Tuple[Any, ...]:
    return tuple(weakref.ref(tensor) for tensor in tensors)


def _rebuild_refusal(cls: Any, message: str, paths: Tuple[str, ...], mode: Mode,
                     count: int) -> NonLeafTensorError:
    made: NonLeafTensorError = cls(message, paths=paths, mode=mode)
    made._report = (message, tuple(paths), (_absent,) * count)
    return made


class DetachedCopyError(RuntimeError):
    """torch could not copy the detached twin of a tensor with autograd history.

    Raised instead of torch's "graph leaves" refusal when torch's own code fails on the shim's
    copy (a tensor subclass that torch cannot deep-copy even as a leaf, for instance); torch's
    error is the `__cause__`.  An error raised by other code on the way (a `__deepcopy__` of a
    value in the tensor's dict) is not wrapped: it arrives unchanged, as natively.  `path`
    names the tensor as in `NonLeafTensorError`.
    """

    __module__ = "deepcopy_shim"

    def __init__(self, message: str = "", *, path: str = "") -> None:
        # (The path has a default, as every argument but the message of NonLeafTensorError:
        # an exception is unpickled, and remade by `raise type(exc)(...)`, from its message.)
        super().__init__(message)
        self.path = path
