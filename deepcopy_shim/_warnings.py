"""The package's warnings and errors, and the one rule for where a warning points.

Every warning deepcopy-shim emits derives from `DeepcopyShimWarning`, so one filter
covers them all: `python -W error:deepcopy_shim` at the command line (every message starts
with `deepcopy_shim`), or `error::deepcopy_shim.DeepcopyShimWarning` in pytest's
`filterwarnings` and in `warnings.filterwarnings` calls.
"""

from __future__ import annotations

import os
import site
import sys
import sysconfig
import threading
import warnings
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Sequence, Tuple

from ._modes import Mode

if TYPE_CHECKING:
    import torch

__all__ = [
    "DeepcopyShimWarning",
    "DetachedCopyError",
    "DetachedTensorsWarning",
    "NonLeafTensorError",
    "PatchConflictWarning",
    "TorchCompatibilityWarning",
    "print_notice",
    "warn_in_user_code",
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
    detached tensor, in the order the copy met them (the message lists the first 20), and
    `tensors` holds the same tensors (those of the source), in the same order.
    """

    __module__ = "deepcopy_shim"

    def __init__(self, message: str, paths: Sequence[str] = (),
                 tensors: Sequence[torch.Tensor] = ()) -> None:
        super().__init__(message)
        self.paths: Tuple[str, ...] = tuple(paths)
        self.tensors: Tuple[torch.Tensor, ...] = tuple(tensors)


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
    the source is unchanged.

    The message, `paths` and `tensors` name every tensor with history the copy would have met
    if it had gone on to its end (what mode `silent` would detach); they are worked out when
    first read, without copying any tensor's data, so a refusal that code catches and handles
    costs what torch's own refusal costs.  Where that cannot be worked out in full, the message
    says why and still names the refused tensor.

    Attributes:
        paths: those tensors in the order the copy meets them, as Python access paths from the
            copied object (`''` is the object itself).
        tensors: the same tensors (those of the source), in the same order.
        mode: the mode that refused (`Mode.STRICT`).
    """

    __module__ = "deepcopy_shim"

    def __init__(self, message: str, *, paths: Sequence[str], mode: Mode,
                 tensors: Sequence[torch.Tensor] = ()) -> None:
        super().__init__(message)
        self.mode = mode
        self._report: Optional[Tuple[str, Tuple[str, ...], Tuple[Any, ...]]] = (
            message, tuple(paths), tuple(tensors))
        self._make: Optional[Callable[[], Tuple[str, List[str], List[Any]]]] = None
        self._lock = threading.Lock()

    @classmethod
    def _deferred(cls, make: Callable[[], Tuple[str, List[str], List[Any]]]) -> NonLeafTensorError:
        """An error whose message, paths and tensors `make()` returns when first read."""
        error = cls("", paths=(), mode=Mode.STRICT)
        error._report = None
        error._make = make
        return error

    def _resolved(self) -> Tuple[str, Tuple[str, ...], Tuple[Any, ...]]:
        with self._lock:
            if self._report is None:
                assert self._make is not None
                message, paths, tensors = self._make()
                self._report = (message, tuple(paths), tuple(tensors))
                self._make = None
            return self._report

    @property
    def paths(self) -> Tuple[str, ...]:
        return self._resolved()[1]

    @property
    def tensors(self) -> Tuple[torch.Tensor, ...]:
        return self._resolved()[2]

    @property
    def args(self) -> Tuple[str, ...]:
        return (self._resolved()[0],)

    @args.setter
    def args(self, value: Sequence[Any]) -> None:
        self._report = (str(value[0]) if value else "", *self._resolved()[1:])

    def __str__(self) -> str:
        return self._resolved()[0]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self)!r})"

    def __reduce__(self) -> Any:
        # Pickled (sent back from a worker process) as what it says; the tensors, which hold
        # autograd history and cannot be pickled, stay behind.
        message, paths, _ = self._resolved()
        return (_rebuild_refusal, (message, paths, self.mode))


def _rebuild_refusal(message: str, paths: Tuple[str, ...], mode: Mode) -> NonLeafTensorError:
    return NonLeafTensorError(message, paths=paths, mode=mode)


class DetachedCopyError(RuntimeError):
    """torch could not copy the detached twin of a tensor with autograd history.

    Raised instead of torch's "graph leaves" refusal when the shim's own copy fails (a tensor
    subclass that torch cannot deep-copy even as a leaf, for instance); torch's error is the
    `__cause__`.  `path` names the tensor as in `NonLeafTensorError`.
    """

    __module__ = "deepcopy_shim"

    def __init__(self, message: str, *, path: str) -> None:
        super().__init__(message)
        self.path = path


# --- where a warning points ------------------------------------------------------------------

# pytest leaves this module's frames out of the tracebacks it shows (a warning escalated to an
# error by -W error is raised in warn_in_user_code): what a user reads ends at their own line.
__tracebackhide__ = True

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_library_dirs: Optional[Tuple[str, ...]] = None


def _libraries() -> Tuple[str, ...]:
    global _library_dirs
    if _library_dirs is None:
        paths = {sysconfig.get_paths().get(key, "") for key in ("stdlib", "platstdlib", "purelib", "platlib")}
        try:
            paths.update(site.getsitepackages())
        except AttributeError:  # virtualenv's old site.py has no getsitepackages
            pass
        paths.add(site.getusersitepackages() if site.ENABLE_USER_SITE else "")
        paths.add(_PACKAGE_DIR)
        _library_dirs = tuple(
            os.path.join(os.path.normcase(os.path.abspath(p)), "") for p in paths if p
        )
    return _library_dirs


def is_user_code(filename: str) -> bool:
    """True for a file of the user's own code: not the standard library, not an installed
    package (site-packages or dist-packages anywhere), not deepcopy_shim, not frozen."""
    if filename.startswith("<frozen"):
        return False
    if filename.startswith("<"):  # <string>, <stdin>, a notebook cell: the user typed it
        return True
    path = os.path.normcase(os.path.abspath(filename))
    if f"{os.sep}site-packages{os.sep}" in path or f"{os.sep}dist-packages{os.sep}" in path:
        return False
    return not path.startswith(_libraries())


def warn_in_user_code(warning: Warning) -> None:
    """Emit `warning` at the first frame of the user's own code on the calling stack.

    Also when a library made the call (Lightning, timm, trl, torch's `AveragedModel`): the
    line reported is the user's, so the default filter shows a warning once per user line.
    Without any frame of user code (all library code), the outermost frame is used.  Raises
    whatever the warning filters make of it (`-W error` turns it into an exception).
    """
    frame: Any = sys._getframe(1)
    target = None
    while frame is not None:
        target = frame
        if is_user_code(frame.f_code.co_filename):
            break
        frame = frame.f_back
    if target is None:  # pragma: no cover - there is always at least this frame's caller
        warnings.warn(warning, stacklevel=2)
        return
    module_globals = target.f_globals
    registry = module_globals.setdefault("__warningregistry__", {})
    warnings.warn_explicit(
        warning, type(warning), target.f_code.co_filename, target.f_lineno,
        module_globals.get("__name__", "<unknown>"), registry,
    )


def print_notice(text: str) -> None:
    """Write `text` as one line on stderr, whatever state stderr is in; never raises.

    The fallback for contexts where neither a warning nor an exception may escape: interpreter
    start-up (the `.pth` hook) and the post-import hook inside the user's `import torch`.
    """
    try:
        stream = sys.stderr
        if stream is not None:
            stream.write(" ".join(str(text).split()) + "\n")
            stream.flush()
    except Exception:  # stderr closed or unencodable: start-up goes on regardless
        pass


def notify(warning: Warning) -> None:
    """`warn_in_user_code()`, degrading to `print_notice()` if the warning raises
    (filters escalated to errors): for code that runs inside someone else's import."""
    try:
        warn_in_user_code(warning)
    except Exception:
        print_notice(str(warning))
