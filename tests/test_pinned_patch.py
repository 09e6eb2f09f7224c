"""What installing and removing the patch does that mutation testing of `deepcopy_shim._patch`
found unpinned (issue 20).

Each test is a behaviour seen through `enable()`/`disable()`, the scopes, `import torch`, the
warnings and torch's attributes.  Tests of what happens at `import torch` run in a child
interpreter (torch is imported once per process); the child inherits PYTHONPATH, so it imports
the tree under test.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings
from typing import Any

import pytest
import torch
import torch.nn as nn
import wrapt
from support.models import ORIGINAL_TENSOR_DEEPCOPY

import deepcopy_shim

pytestmark = pytest.mark.filterwarnings("default::deepcopy_shim.DeepcopyShimWarning")


def run_child(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120)


def explain(proc: subprocess.CompletedProcess[str]) -> str:
    return f"rc={proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"


# --- the deferred install: one post-import hook per process ------------------------------------


def test_a_deferred_install_that_fails_says_so_once_however_many_users_waited() -> None:
    """Users that wait for `import torch` (enable(), scopes entered and left, enable() again)
    share one post-import hook: an install that fails there is reported once, not once per
    user."""
    proc = run_child(
        """
        import warnings, wrapt
        import deepcopy_shim
        def other_patch(torch):  # runs first: post-import hooks fire in registration order
            torch.nn.Module.__deepcopy__ = lambda self, memo: self
        wrapt.register_post_import_hook(other_patch, "torch")
        deepcopy_shim.enable()
        for _ in range(3):
            with deepcopy_shim.enabled("strict"):
                pass
        deepcopy_shim.enable("silent")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import torch
        print(len(caught), [type(w.message).__name__ for w in caught])
        print(all("not installed at `import torch`" in str(w.message) for w in caught))
        """
    )
    assert proc.returncode == 0, explain(proc)
    assert proc.stdout.splitlines() == ["1 ['PatchConflictWarning']", "True"], explain(proc)


def test_import_torch_after_enable_and_disable_does_no_work_for_the_shim() -> None:
    """When nobody wants the patch any more as torch arrives, the post-import hook prepares
    nothing: none of the shim's torch-side modules is imported, torch is left as it is."""
    proc = run_child(
        """
        import sys
        import deepcopy_shim
        deepcopy_shim.enable()
        with deepcopy_shim.enabled("strict"):
            pass
        deepcopy_shim.disable()
        import torch
        from deepcopy_shim import _patch
        print(_patch.state())
        print(sorted(m for m in sys.modules if m in (
            "deepcopy_shim._tensor", "deepcopy_shim._module", "deepcopy_shim._record")))
        """
    )
    assert proc.returncode == 0, explain(proc)
    assert proc.stdout.splitlines() == ["off", "[]"], explain(proc)


def test_waiting_for_import_torch_is_the_state_with_one_user_or_more() -> None:
    """Before `import torch`, one user (enable() alone) or more make the patch wait for it;
    once the last one leaves, it is off again."""
    proc = run_child(
        """
        import deepcopy_shim
        from deepcopy_shim import _patch
        print(_patch.state())
        deepcopy_shim.enable()
        print(_patch.state())
        with deepcopy_shim.enabled("strict"):
            print(_patch.state())
        deepcopy_shim.disable()
        print(_patch.state())
        """
    )
    assert proc.returncode == 0, explain(proc)
    assert proc.stdout.splitlines() == [
        "off", "waiting for import torch", "waiting for import torch", "off"], explain(proc)


def test_torch_imported_first_in_another_thread_is_patched() -> None:
    """`enable()` before torch is imported, then `import torch` in a worker thread (a data
    loader, a background import): the patch is installed there, at that import."""
    proc = run_child(
        """
        import copy, threading
        import deepcopy_shim
        deepcopy_shim.enable("silent")
        thread = threading.Thread(target=__import__, args=("torch",))
        thread.start()
        thread.join()
        import torch
        from deepcopy_shim import _patch
        print(_patch.state())
        print(copy.deepcopy(torch.ones(2, requires_grad=True) * 2).is_leaf)
        """
    )
    assert proc.returncode == 0, explain(proc)
    assert proc.stdout.splitlines() == ["installed", "True"], explain(proc)


# --- users that come while the patch is installed ----------------------------------------------


def test_more_users_of_an_installed_patch_say_nothing() -> None:
    """A second enable(), or a scope entered while enabled, reuses the installed patch: no
    warning (in particular none about the self-check's own probe tensor), no second patch."""
    deepcopy_shim.enable("warn")
    installed = vars(torch.Tensor)["__deepcopy__"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        deepcopy_shim.enable("strict")
        with deepcopy_shim.enabled("warn"):
            assert vars(torch.Tensor)["__deepcopy__"] is installed
        deepcopy_shim.enable("warn")
    assert [str(w.message) for w in caught] == []
    assert vars(torch.Tensor)["__deepcopy__"] is installed
    deepcopy_shim.disable()
    assert vars(torch.Tensor)["__deepcopy__"] is ORIGINAL_TENSOR_DEEPCOPY


# --- removal leaves a foreign patch on top of the shim's in place ------------------------------


def _passthrough(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    return wrapped(*args, **kwargs)


def test_a_wrapt_patch_over_the_shims_tensor_patch_is_left_in_place() -> None:
    """Another library wraps `Tensor.__deepcopy__` with wrapt while the shim is installed (its
    wrapper compares equal to what it wraps): disabling warns and leaves theirs, it does not
    restore torch's function over it."""
    deepcopy_shim.enable()
    theirs = wrapt.FunctionWrapper(vars(torch.Tensor)["__deepcopy__"], _passthrough)
    torch.Tensor.__deepcopy__ = theirs
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            deepcopy_shim.disable()
        assert vars(torch.Tensor)["__deepcopy__"] is theirs
        assert [type(w.message) for w in caught] == [deepcopy_shim.PatchConflictWarning]
        assert "torch.Tensor.__deepcopy__ was replaced by someone else" in str(caught[0].message)
    finally:
        torch.Tensor.__deepcopy__ = ORIGINAL_TENSOR_DEEPCOPY


def test_a_wrapt_patch_over_the_shims_module_patch_is_left_in_place() -> None:
    """Likewise for `nn.Module.__deepcopy__`: a wrapt proxy of the shim's descriptor, put there
    by someone else, stays; only the tensor patch is restored."""
    deepcopy_shim.enable()
    theirs = wrapt.ObjectProxy(vars(nn.Module)["__deepcopy__"])
    nn.Module.__deepcopy__ = theirs  # type: ignore[attr-defined]
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            deepcopy_shim.disable()
        assert vars(nn.Module)["__deepcopy__"] is theirs
        assert vars(torch.Tensor)["__deepcopy__"] is ORIGINAL_TENSOR_DEEPCOPY
        assert [type(w.message) for w in caught] == [deepcopy_shim.PatchConflictWarning]
        assert "torch.nn.Module.__deepcopy__ was replaced by someone else" in str(caught[0].message)
    finally:
        del nn.Module.__deepcopy__
