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
import warnings
from typing import TYPE_CHECKING, Any, Optional, Sequence, Tuple

if TYPE_CHECKING:
    import torch

    from ._modes import Mode

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
    detached tensor, in the order the copy met them (the message lists the first 20).
    """

    __module__ = "deepcopy_shim"

    def __init__(self, message: str, paths: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.paths: Tuple[str, ...] = tuple(paths)


class PatchConflictWarning(DeepcopyShimWarning):
    """Someone else replaced an attribute deepcopy-shim had patched; theirs was left in place."""

    __module__ = "deepcopy_shim"


class TorchCompatibilityWarning(DeepcopyShimWarning):
    """The installed torch is newer than any deepcopy-shim was tested with, or it no longer
    refuses non-leaf tensors the way the shim expects (then the shim stays out of the way)."""

    __module__ = "deepcopy_shim"


class NonLeafTensorError(RuntimeError):
    """Mode `strict`: the copy met tensors with autograd history, so it was refused.

    A `RuntimeError` like torch's own refusal, so `except RuntimeError` code keeps working.
    No part of the copy escapes and the source is unchanged.

    Attributes:
        paths: every tensor the copy met that it would have had to detach, in the order met,
            as Python access paths from the copied object (`''` is the object itself).
        tensors: the same tensors (those of the source), in the same order.
        mode: the mode that refused (`Mode.STRICT`).
    """

    __module__ = "deepcopy_shim"

    def __init__(self, message: str, *, paths: Sequence[str], mode: Mode,
                 tensors: Sequence[torch.Tensor] = ()) -> None:
        super().__init__(message)
        self.paths: Tuple[str, ...] = tuple(paths)
        self.tensors: Tuple[torch.Tensor, ...] = tuple(tensors)
        self.mode = mode


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
