"""Installing and removing the patch: counted, exactly reversible, and never deadlocking.

Two attributes that exist change while the patch is installed, and nothing is added anywhere:

* `torch.Tensor.__deepcopy__` becomes a `StableFunctionWrapper` (see `_tensor`) around the
  original function; removal puts the very same function object back.
* `copy._deepcopy_dispatch`, the table `copy.deepcopy` asks for a copier for every object,
  becomes a `DispatchTable` (see `_dispatch`) standing in for the original dict; removal puts
  the very same dict back, holding every change made to the table meanwhile.

Sending to another process changes what exists in the same way (see `_sending` and
`_worker_collate`, each recording what it replaced): the `ForkingPickler._extra_reducers` entries
holding torch's `reduce_tensor`, `ForkingPickler.dumps`, `multiprocessing.reduction.dump` and the
default collate's entry for tensors; removal puts the very same objects back.

Users of the patch (`enable()` counts as one, each active `enabled()` scope as one) call
`acquire()` and `release()`.  The user is counted *before* anything is installed, so a
post-import hook that fires at any moment sees it; installing waits for nothing while holding
this module's lock (imports happen outside it, only attribute writes inside), so an
`import torch` running in another thread can never deadlock with `enable()`.  If torch is not imported
yet, installation waits for `import torch` through a wrapt post-import hook: enabling the shim
never imports torch itself.  Copies made in a thread or task with no mode (see `_modes`) see
native behaviour even while the patch is installed.
"""

from __future__ import annotations

import copy
import os
import sys
import threading
from typing import Any, Dict, List, Optional

from ._errors import PatchConflictWarning, TorchCompatibilityWarning
from ._notices import notify, warn_in_user_code

__all__ = ["acquire", "holding", "inert_reason", "release", "settle", "state"]

# Guards the five variables below.  Held only for reads, counts and attribute writes: never
# while importing or warning (warning filters and showwarning hooks run arbitrary code).
_lock = threading.Lock()
_users = 0
# thread id -> how many of `_users` are that thread's own (scopes it is in): see acquire().
_users_here: Dict[int, int] = {}
_installed: Optional[_Patch] = None
_hook_registered = False
# Why the patch stays out of the way in this process (torch no longer refuses the way the shim
# expects); decided once, by the first installation attempt.
_inert: Optional[str] = None
# Set while this thread is inside wrapt.register_post_import_hook, which calls the hook at once
# if torch is (even partly) imported, still holding wrapt's own lock in wrapt 1.x.
_registering = threading.local()


class _Patch:
    """One installation: prepared outside the lock, applied and removed under it."""

    def __init__(self) -> None:
        """Raises `RuntimeError` (preparing nothing) if copy's dispatch table is not a dict: a
        patch this shim does not know replaced it."""
        # torch first: if another thread is importing it, wait here, holding no import lock
        # of ours; only then import the modules that import torch themselves.
        import torch

        from ._compiler import keep_out
        from ._dispatch import DispatchTable
        from ._sending import SendingPatch
        from ._tensor import refusal_problem, tensor_patch
        from ._worker_collate import CollatePatch

        keep_out()  # no frame of the shim's is ever compiled by torch.compile (see _compiler)

        # Typed as Any: the point is to assign attributes the type checker knows as methods.
        self.tensor_cls: Any = torch.Tensor
        self.original = vars(self.tensor_cls)["__deepcopy__"]
        self.problem = refusal_problem(self.original)
        self.tensor_patch = tensor_patch(self.original, holding)
        self.table = copy._deepcopy_dispatch  # type: ignore[attr-defined]
        if not isinstance(self.table, dict):
            raise RuntimeError(
                "deepcopy_shim cannot install: copy._deepcopy_dispatch is not the dict the "
                f"standard library makes but {type(self.table).__qualname__} (another patch "
                "replaced it). Disable the other patch, or use torch's own copy."
            )
        self.table_patch = DispatchTable.standing_in_for(self.table, holding)
        # Sending to another process: copies are made with torch's own Tensor.__deepcopy__.
        self.sending = SendingPatch(self.original)
        self.collate = CollatePatch()

    def unchanged(self) -> bool:
        """True if everything this patch read is still there (nobody replaced it meanwhile)."""
        return (vars(self.tensor_cls).get("__deepcopy__") is self.original
                and copy._deepcopy_dispatch is self.table  # type: ignore[attr-defined]
                and self.sending.unchanged() and self.collate.unchanged())

    def apply(self) -> None:
        """Write every attribute and entry."""
        self.tensor_cls.__deepcopy__ = self.tensor_patch
        copy._deepcopy_dispatch = self.table_patch  # type: ignore[attr-defined]
        self.sending.apply()
        self.collate.apply()

    def remove(self) -> List[str]:
        """Restore every attribute and entry where it is still ours; return the names of those
        that were not."""
        conflicts = []
        if vars(self.tensor_cls).get("__deepcopy__") is self.tensor_patch:
            self.tensor_cls.__deepcopy__ = self.original
        else:
            conflicts.append("torch.Tensor.__deepcopy__")
        if copy._deepcopy_dispatch is self.table_patch:  # type: ignore[attr-defined]
            copy._deepcopy_dispatch = self.table  # type: ignore[attr-defined]
        else:
            conflicts.append("copy._deepcopy_dispatch")
        return conflicts + self.sending.remove() + self.collate.remove()


def inert_reason() -> Optional[str]:
    """Why the shim stays out of the way in this process, or None."""
    return _inert


def state() -> str:
    """`installed`, `waiting for import torch`, `inert` or `off`, for the doctor."""
    if _installed is not None:
        return "installed"
    if _inert is not None:
        return "inert"
    if _users > 0:
        return "waiting for import torch"
    return "off"


def acquire(here: bool = False) -> None:
    """Count one more user, then install now if torch is imported, else when it is.  `here`:
    a user of this thread only (a scope, which this thread leaves), which a forked child,
    where only this thread lives on, forgets for every other thread.

    Raises `RuntimeError` if the patch cannot be installed; the user is then not counted.
    """
    global _users
    with _lock:
        _users += 1
        if here:
            ident = threading.get_ident()
            _users_here[ident] = _users_here.get(ident, 0) + 1
    try:
        _sync()
    except BaseException:
        release(here)
        raise


class holding:
    """A context manager that counts one user of the patch in this thread while it is
    entered: what a strict refusal read after its copy ended needs to survey that copy (see
    `_refusal`)."""

    def __enter__(self) -> None:
        acquire(here=True)

    def __exit__(self, *exc: Any) -> None:
        release(here=True)


def release(here: bool = False) -> None:
    """Count one user less (`here`: one that `acquire(here=True)` counted in this thread); the
    last one removes the patch.

    Raises `RuntimeError` without a matching `acquire()`.
    """
    global _users
    with _lock:
        if _users <= 0:
            raise RuntimeError("deepcopy_shim: release() without a matching acquire()")
        _users -= 1
        if here:
            ident = threading.get_ident()
            left = _users_here.get(ident, 0) - 1
            if left > 0:
                _users_here[ident] = left
            else:
                _users_here.pop(ident, None)
    _sync()


def settle() -> None:
    """Bring torch in line with the users counted now, releasing none: `disable()` with no
    user of its own to release calls it, so that the users a forked child forgot (see
    `_forget_other_threads`) leave no patch behind once nothing else holds it."""
    _sync()


def _forget_other_threads() -> None:
    """In a forked child: only the thread that forked lives on.  The scopes other threads had
    entered will never be left, so their users are forgotten (the patch is then removed by the
    next `disable()`, scope end or copy's release that leaves no user), and the lock, which one
    of them may have held at the fork, is made anew."""
    global _lock, _users, _users_here
    _lock = threading.Lock()
    ident = threading.get_ident()
    mine = _users_here.get(ident, 0)
    _users -= sum(_users_here.values()) - mine
    _users_here = {ident: mine} if mine else {}


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_other_threads)


def _sync() -> None:
    """Bring torch in line with the user count.  Called without the lock held."""
    global _installed, _inert
    with _lock:
        if _users == 0 and _installed is not None:
            removed, _installed = _installed, None
            conflicts = removed.remove()
        elif _users > 0 and _installed is None and _inert is None:
            conflicts = None
        else:
            return
    if conflicts is not None:
        for name in conflicts:
            # Restoring over someone else's patch would silently remove theirs; leaving ours
            # below theirs is harmless, since it behaves natively once no mode is active.
            warn_in_user_code(PatchConflictWarning(
                f"deepcopy_shim: {name} was replaced by someone else after deepcopy_shim "
                "patched it; their patch is left in place and deepcopy_shim's, beneath it, "
                "is now inert."
            ))
        return
    if "torch" not in sys.modules:
        _defer()
        return
    patch = _Patch()  # imports; may wait for another thread's `import torch` to finish
    with _lock:
        # Another thread may have installed (or removed) the patch while this one prepared
        # its own: then what this one read as torch's function (or copy's table) may be the
        # shim's, and its self-check says nothing about torch.
        if _installed is not None or _users == 0:
            return
        if not patch.unchanged():
            retry = True
        elif patch.problem is not None:
            retry = False
            first = _inert is None
            _inert = patch.problem
        else:
            patch.apply()
            _installed = patch
            return
    if retry:  # torch's function changed hands meanwhile: judge the one there now
        _sync()
        return
    if first:
        notify(TorchCompatibilityWarning(patch.problem))


def _defer() -> None:
    global _hook_registered
    with _lock:
        if _hook_registered:
            return
        _hook_registered = True
    # Post-import hooks cannot be unregistered: one per process, and the callback asks _sync
    # whether anyone still wants the patch when torch arrives.  wrapt is imported here, not at
    # module level: ~30 ms that a program importing deepcopy_shim without enabling it should
    # not pay.
    import wrapt

    _registering.active = True
    try:
        wrapt.register_post_import_hook(_on_torch_imported, "torch")
    finally:
        _registering.active = False
    if "torch" in sys.modules:
        _sync()  # torch arrived while registering: the hook left the work to us, here


def _on_torch_imported(module: Any) -> None:
    if getattr(_registering, "active", False):
        # Called from inside register_post_import_hook (wrapt 1.x holds its lock here, and
        # another thread may still be importing torch): _defer installs once it returns.
        return
    try:
        _sync()
    except Exception as exc:
        # This runs inside the user's `import torch`, and wrapt does not catch what a hook
        # raises: a failure must not become an ImportError of torch.
        notify(PatchConflictWarning(
            f"deepcopy_shim: the patch was not installed at `import torch`: {exc}"
        ))
