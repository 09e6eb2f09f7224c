"""Installing and removing the patch: once, counted, under a lock, and exactly reversible.

Two attributes change while the patch is installed:

* ``torch.Tensor.__deepcopy__`` becomes a :class:`~deepcopy_shim._tensor.StableFunctionWrapper`
  around the original function; removal puts the very same function object back.
* ``torch.nn.Module.__deepcopy__`` (which torch does not define) is added as a
  :class:`~deepcopy_shim._module.ModuleDeepcopy` descriptor; removal deletes it, leaving
  ``vars(torch.nn.Module)`` exactly as it was.

Users of the patch (``enable()`` counts as one, each active ``enabled()`` scope as one) acquire and
release it; it is installed on the first acquire and removed on the last release.  Copies made in
a thread or task with no mode (see ``_modes``) see native behaviour even while it is installed.
If torch is not imported yet, installation waits for ``import torch`` through a wrapt post-import
hook, so enabling the shim never imports torch itself.
"""

from __future__ import annotations

import sys
import threading
import warnings
from typing import Any, Optional, cast

from ._report import PatchConflictWarning

__all__ = ["acquire", "release", "is_installed", "lock"]

# Reentrant: enable() holds it while acquiring, and a post-import hook may fire while an
# acquire() on the same thread is importing torch.
lock = threading.RLock()
_users = 0
_installed: Optional[_Installed] = None
_hook_registered = False


class _Installed:
    """The record of one installation: what was there before, and what we put there."""

    def __init__(self) -> None:
        import torch

        from ._module import ModuleDeepcopy
        from ._tensor import StableFunctionWrapper, make_tensor_deepcopy_wrapper

        # Typed as Any: the point is to assign attributes the type checker knows as methods.
        self.tensor_cls: Any = cast(Any, torch.Tensor)
        self.module_cls: Any = cast(Any, torch.nn.Module)
        if "__deepcopy__" in vars(self.module_cls):
            raise RuntimeError(
                "deepcopy_shim cannot install: torch.nn.Module already defines __deepcopy__ "
                f"({vars(self.module_cls)['__deepcopy__']!r}), so this torch release (or another "
                "patch) is not supported. Disable the other patch, or use torch's own copy."
            )
        self.original = vars(self.tensor_cls)["__deepcopy__"]
        self.tensor_patch = StableFunctionWrapper(
            self.original, make_tensor_deepcopy_wrapper(self.original)
        )
        self.module_patch = ModuleDeepcopy()
        self.tensor_cls.__deepcopy__ = self.tensor_patch
        self.module_cls.__deepcopy__ = self.module_patch

    def remove(self) -> None:
        if vars(self.tensor_cls).get("__deepcopy__") is self.tensor_patch:
            self.tensor_cls.__deepcopy__ = self.original
        else:
            _conflict("torch.Tensor.__deepcopy__")
        if vars(self.module_cls).get("__deepcopy__") is self.module_patch:
            del self.module_cls.__deepcopy__
        else:
            _conflict("torch.nn.Module.__deepcopy__")


def _conflict(name: str) -> None:
    # Restoring over someone else's patch would silently remove theirs; leaving ours below
    # theirs is harmless, since it behaves natively once no mode is active.
    warnings.warn(
        f"deepcopy_shim: {name} was replaced by someone else after deepcopy_shim patched it; "
        "their patch is left in place and deepcopy_shim's, beneath it, is now inert.",
        PatchConflictWarning,
        stacklevel=4,
    )


def is_installed() -> bool:
    """True while the patch is applied to torch (not merely waiting for ``import torch``)."""
    return _installed is not None


def acquire() -> None:
    """Count one more user; install now if torch is imported, else when it is.

    Raises ``RuntimeError`` (and counts nothing) if the patch cannot be installed.
    """
    global _users
    with lock:
        if _users == 0:
            _install_or_defer()
        _users += 1


def release() -> None:
    """Count one user less; the last one removes the patch."""
    global _users, _installed
    with lock:
        if _users <= 0:
            raise RuntimeError("deepcopy_shim: release() without a matching acquire()")
        _users -= 1
        if _users == 0 and _installed is not None:
            installed, _installed = _installed, None
            installed.remove()


def _install_or_defer() -> None:
    global _installed, _hook_registered
    if "torch" in sys.modules:
        _installed = _Installed()
    elif not _hook_registered:
        # Post-import hooks cannot be unregistered: register once per process, and let the
        # callback check whether anyone still wants the patch when torch finally arrives.
        # wrapt is imported here, not at module level: it costs ~30 ms at start-up, which a
        # program that imports deepcopy_shim without enabling it should not pay.
        import wrapt

        wrapt.register_post_import_hook(_on_torch_imported, "torch")
        _hook_registered = True


def _on_torch_imported(module: Any) -> None:
    global _installed
    with lock:
        if _users == 0 or _installed is not None:
            return
        try:
            _installed = _Installed()
        except Exception as exc:
            _report_deferred_failure(exc)


def _report_deferred_failure(exc: Exception) -> None:
    # This runs inside the user's `import torch`, and wrapt does not catch what a hook raises:
    # a warning escalated to an error (-W error, pytest filterwarnings) must not become an
    # ImportError of torch, so it degrades to one line on stderr.
    message = f"deepcopy_shim: the patch was not installed at `import torch`: {exc}"
    try:
        warnings.warn(message, PatchConflictWarning, stacklevel=3)
    except Exception:
        sys.stderr.write(message.replace("\n", " ") + "\n")
