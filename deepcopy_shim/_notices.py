"""How the shim tells the user: a warning at the user's own line, or one line on stderr where
neither a warning nor an exception may escape."""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any, Optional, Tuple

from ._sites import library_dirs

__all__ = ["is_user_code", "notify", "print_notice", "warn_in_user_code"]

# pytest leaves this module's frames out of the tracebacks it shows (a warning escalated to an
# error by -W error is raised in warn_in_user_code): what a user reads ends at their own line.
__tracebackhide__ = True

_library_dirs: Optional[Tuple[str, ...]] = None


def _libraries() -> Tuple[str, ...]:
    global _library_dirs
    if _library_dirs is None:
        _library_dirs = library_dirs()
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
