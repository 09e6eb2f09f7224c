"""What installing and removing the patch does that mutation testing of `deepcopy_shim._patch`
found unpinned (issue 20).

Each test is a behaviour seen through `enable()`/`disable()`, the scopes, `import torch`, the
warnings and torch's attributes.  Tests of what happens at `import torch` run in a child
interpreter (torch is imported once per process); the child inherits PYTHONPATH, so it imports
the tree under test.

One strict xfail pins a bug found on the way:
`test_a_task_that_inherited_a_scope_cannot_take_its_patch_away` (a scope inherited by a
copied context, as every asyncio task gets, and left there releases the entering task's user
of the patch).
"""

from __future__ import annotations

import asyncio
import contextvars
import copy
import subprocess
import sys
import textwrap
import warnings
from typing import Any

import pytest
import torch
import wrapt
from support.models import ORIGINAL_DISPATCH, ORIGINAL_TENSOR_DEEPCOPY, with_history
from support.processes import run_forking

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
            import copy, types  # a read-only table the shim cannot stand in for
            copy._deepcopy_dispatch = types.MappingProxyType(dict(copy._deepcopy_dispatch))
        wrapt.register_post_import_hook(other_patch, "torch")
        deepcopy_shim.enable()
        for _ in range(3):
            with deepcopy_shim.enabled("strict"):
                pass
        deepcopy_shim.enable("silent")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import torch
        caught = [w for w in caught if issubclass(w.category, deepcopy_shim.DeepcopyShimWarning)]
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


def test_enable_that_cannot_install_as_torch_arrives_raises_and_says_nothing_else() -> None:
    """torch arrives between enable()'s look at sys.modules and its registration of the
    post-import hook (another thread's import would do that; here the registration imports
    it), and the patch cannot be installed: enable() raises, once, and no warning says the
    patch was not installed at some `import torch`."""
    proc = run_child(
        """
        import warnings, wrapt
        import deepcopy_shim
        def other_patch(torch):
            import copy, types  # a read-only table the shim cannot stand in for
            copy._deepcopy_dispatch = types.MappingProxyType(dict(copy._deepcopy_dispatch))
        wrapt.register_post_import_hook(other_patch, "torch")
        register = wrapt.register_post_import_hook
        def torch_arrives_first(hook, name):
            if name == "torch":
                import torch
            return register(hook, name)
        wrapt.register_post_import_hook = torch_arrives_first
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                deepcopy_shim.enable()
            except RuntimeError as exc:
                print("raised", "is not the dict" in str(exc))
        caught = [w for w in caught if issubclass(w.category, deepcopy_shim.DeepcopyShimWarning)]
        from deepcopy_shim import _patch
        print(_patch.state(), [str(w.message) for w in caught])
        """
    )
    assert proc.returncode == 0, explain(proc)
    assert proc.stdout.splitlines() == ["raised True", "off []"], explain(proc)


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


def test_another_table_put_over_the_shims_dispatch_table_is_left_in_place() -> None:
    """Likewise for `copy._deepcopy_dispatch`: a table put there by someone else over the
    shim's stays; only the tensor patch is restored, and the change the other made through the
    shim's table reached the original one."""
    deepcopy_shim.enable()
    ours = copy._deepcopy_dispatch  # type: ignore[attr-defined]
    theirs = dict(ours)
    copy._deepcopy_dispatch = theirs  # type: ignore[attr-defined]
    ours[_Registered] = copy._deepcopy_atomic  # type: ignore[attr-defined]
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            deepcopy_shim.disable()
        assert copy._deepcopy_dispatch is theirs  # type: ignore[attr-defined]
        assert vars(torch.Tensor)["__deepcopy__"] is ORIGINAL_TENSOR_DEEPCOPY
        assert [type(w.message) for w in caught] == [deepcopy_shim.PatchConflictWarning]
        assert "copy._deepcopy_dispatch was replaced by someone else" in str(caught[0].message)
        assert ORIGINAL_DISPATCH[_Registered] is copy._deepcopy_atomic  # type: ignore[attr-defined]
    finally:
        copy._deepcopy_dispatch = ORIGINAL_DISPATCH  # type: ignore[attr-defined]
        del ORIGINAL_DISPATCH[_Registered]


class _Registered:
    pass


# --- what changes while the patch is prepared --------------------------------------------------
# Preparing the patch runs the self-check, which calls the Tensor.__deepcopy__ there now: a
# foreign one runs its own code in the middle of the shim's install.  The children below use
# that to change things at that moment, as another thread could.

_FOREIGN = textwrap.dedent("""
    import copy, warnings, wrapt
    import deepcopy_shim

    def passthrough(wrapped, instance, args, kwargs):
        return wrapped(*args, **kwargs)

    def other_patch(torch):  # runs first: post-import hooks fire in registration order
        torch_own = torch.Tensor.__deepcopy__
        def theirs(self, memo):  # refuses tensors with history itself, in torch's words
            if MOMENT:
                MOMENT.pop()()
            if not self.is_leaf:
                raise RuntimeError("Only Tensors created explicitly by the user (graph leaves) "
                                   "support the deepcopy protocol at the moment.")
            return torch_own(self, memo)
        torch.Tensor.__deepcopy__ = theirs
    wrapt.register_post_import_hook(other_patch, "torch")
""")


def test_a_patch_whose_users_left_while_it_was_prepared_is_not_installed() -> None:
    """The last user leaves while the deferred install prepares the patch: nothing is
    installed, torch keeps the function it has."""
    proc = run_child(_FOREIGN + textwrap.dedent("""
        MOMENT = [deepcopy_shim.disable]
        deepcopy_shim.enable()
        import torch
        from deepcopy_shim import _patch
        print(_patch.state(), torch.Tensor.__deepcopy__.__name__, MOMENT)
    """))
    assert proc.returncode == 0, explain(proc)
    assert proc.stdout.splitlines() == ["off theirs []"], explain(proc)


def test_a_function_patched_in_while_the_shims_patch_is_prepared_is_the_one_it_wraps() -> None:
    """Someone wraps `Tensor.__deepcopy__` (with wrapt: their wrapper compares equal to the
    function it wraps) while the shim prepares its patch: the shim judges and wraps the one
    there when it installs, keeping theirs beneath its own, and says nothing."""
    proc = run_child(_FOREIGN + textwrap.dedent("""
        def wrap_it():
            wrapt.wrap_function_wrapper("torch", "Tensor.__deepcopy__", passthrough)
        MOMENT = [wrap_it]
        deepcopy_shim.enable("silent")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import torch
        caught = [w for w in caught if issubclass(w.category, deepcopy_shim.DeepcopyShimWarning)]
        from deepcopy_shim import _patch
        beneath = vars(torch.Tensor)["__deepcopy__"].__wrapped__
        print(_patch.state(), type(beneath).__name__, beneath.__wrapped__.__name__, MOMENT)
        print([str(w.message) for w in caught])
        print(copy.deepcopy(torch.ones(2, requires_grad=True) * 2).is_leaf)
    """))
    assert proc.returncode == 0, explain(proc)
    assert proc.stdout.splitlines() == ["installed FunctionWrapper theirs []", "[]", "True"], explain(proc)


# --- the count of users never goes below zero --------------------------------------------------


def test_a_scope_left_more_often_than_entered_never_keeps_a_later_enable_from_installing() -> None:
    """A scope inherited by a copied context (`contextvars.copy_context()`, as every asyncio
    task gets) can be left there and again where it was entered: however that ends, the count
    of users stays whole, and a later `enable()` installs the patch."""
    scope = deepcopy_shim.enabled("silent")
    scope.start()
    contextvars.copy_context().run(scope.stop)
    try:
        scope.stop()
    except RuntimeError:
        pass  # today's answer to the second release (see the xfail below)
    assert deepcopy_shim.current_mode() is None
    deepcopy_shim.enable("silent")
    assert vars(torch.Tensor)["__deepcopy__"] is not ORIGINAL_TENSOR_DEEPCOPY
    assert copy.deepcopy(with_history()).is_leaf


def test_a_task_that_inherited_a_scope_cannot_take_its_patch_away() -> None:
    """`stop()` in a task that entered no scope of this object raises (the class docstring),
    also in a task created inside the scope: the entering task's copies stay shimmed."""
    async def main() -> bool:
        scope = deepcopy_shim.enabled("silent")
        scope.start()

        async def child() -> None:
            scope.stop()

        try:
            with pytest.raises(RuntimeError, match="without a matching start"):
                await asyncio.create_task(child())
            return copy.deepcopy(with_history()).is_leaf
        finally:
            scope.stop()

    assert asyncio.run(main())


# --- fork: each thread's users counted apart, so a child forgets exactly the others' ------------

@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="no fork on this platform")
def test_a_child_forgets_the_scopes_another_thread_still_holds_however_nested() -> None:
    """Another thread entered scopes and left some (three held); this thread holds one and forks.  In
    the child its own scope still copies, and leaving it removes the patch."""
    said = run_forking("""
        entered, leave = threading.Event(), threading.Event()
        def other():
            a, b, c, d, e = (deepcopy_shim.enabled("silent") for _ in range(5))
            with a:
                with b:  # two held, one left
                    pass
                with c, d:
                    with e:  # four held, one left
                        pass
                    entered.set(); leave.wait(20)  # three held at the fork
        thread = threading.Thread(target=other); thread.start(); entered.wait(20)
        mine = deepcopy_shim.enabled("silent")
        def child():
            made = copy.deepcopy(torch.ones(2, requires_grad=True) * 2)  # in its own scope
            mine.stop()
            return 0 if made.is_leaf and removed() else 4
        mine.start()
        status = fork_and(child)
        mine.stop()
        leave.set(); thread.join()
        print("child", status, _patch.state())
    """)
    assert said.strip().endswith("child 0 off"), said


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="no fork on this platform")
def test_a_child_forgets_a_strict_refusal_another_thread_is_reading() -> None:
    """Another thread reads a strict refusal after its copy (its survey counts a user of the
    patch while it copies again); this thread forks meanwhile: the child can remove the patch."""
    said = run_forking("""
        inside, leave = threading.Event(), threading.Event()
        class WaitsInTheSurvey:
            calls = 0
            def __init__(self):
                self.t = torch.ones(2, requires_grad=True) * 2
            def __deepcopy__(self, memo):
                WaitsInTheSurvey.calls += 1
                if WaitsInTheSurvey.calls == 2:  # the survey's copy
                    inside.set(); leave.wait(20)
                new = WaitsInTheSurvey.__new__(WaitsInTheSurvey)
                new.t = copy.deepcopy(self.t, memo)
                return new
        def other():
            try:
                with deepcopy_shim.enabled("strict"):
                    copy.deepcopy(WaitsInTheSurvey())
            except deepcopy_shim.NonLeafTensorError as err:
                str(err)  # read after the copy: the survey runs here
        thread = threading.Thread(target=other); thread.start(); inside.wait(20)
        status = fork_and(disable_removes)
        leave.set(); thread.join()
        print("child", status)
    """)
    assert said.strip().endswith("child 0"), said


def test_threads_that_left_their_scopes_leave_no_count_behind() -> None:
    """A service running scopes in many short-lived threads: the per-thread counts of the
    patch's users (what a forked child forgets) hold no entry for a thread that left them."""
    import threading

    from deepcopy_shim import _patch

    def work() -> None:
        with deepcopy_shim.enabled("silent"), deepcopy_shim.enabled("warn"):
            pass
        deepcopy_shim.deepcopy({"t": with_history()}, "silent")
        try:
            with deepcopy_shim.enabled("strict"):
                copy.deepcopy({"t": with_history()})
        except deepcopy_shim.NonLeafTensorError as refused:
            str(refused)  # read after the copy: its survey holds the patch while it runs

    threads = [threading.Thread(target=work) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert _patch._users_here == {}


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="no fork on this platform")
def test_a_child_keeps_the_global_setting_another_thread_made() -> None:
    """enable() in another thread is the process's setting, not that thread's: a child forked
    from this thread keeps it, copies with it, and disable() there releases it exactly."""
    said = run_forking("""
        thread = threading.Thread(target=lambda: deepcopy_shim.enable("silent"))
        thread.start(); thread.join()
        def child():
            made = copy.deepcopy(torch.ones(2, requires_grad=True) * 2)
            deepcopy_shim.disable()
            return 0 if made.is_leaf and removed() else 4
        print("child", fork_and(child))
        deepcopy_shim.disable()
    """)
    assert said.strip().endswith("child 0"), said


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="no fork on this platform")
def test_a_grandchild_forked_from_another_thread_of_the_child_forgets_the_childs_scope() -> None:
    """The forking thread's own count goes on in the child: when another thread of the child
    forks again, the grandchild forgets that scope as well."""
    said = run_forking("""
        scope = deepcopy_shim.enabled("silent")
        scope.start()
        def child():
            result = []
            def forks_again():
                def grandchild():
                    return 5 if disable_removes() else 0
                result.append(fork_and(grandchild))
            thread = threading.Thread(target=forks_again); thread.start(); thread.join()
            scope.stop()
            return result[0]
        print("child", fork_and(child))
        scope.stop()
    """)
    assert said.strip().endswith("child 0"), said


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="no fork on this platform")
def test_disable_called_inside_another_threads_scope_releases_the_global_user_only() -> None:
    """disable() releases enable()'s user, which is no thread's: called from a thread that is
    in a scope, it leaves that thread's count alone, so a child forked elsewhere forgets the
    scope and can remove the patch."""
    said = run_forking("""
        deepcopy_shim.enable("warn")
        entered, leave = threading.Event(), threading.Event()
        def other():
            with deepcopy_shim.enabled("silent"):
                deepcopy_shim.disable()
                entered.set(); leave.wait(20)
        thread = threading.Thread(target=other); thread.start(); entered.wait(20)
        mine = deepcopy_shim.enabled("silent")
        def child():
            mine.stop()
            return 0 if removed() else 4
        mine.start()
        status = fork_and(child)
        mine.stop()
        leave.set(); thread.join()
        print("child", status)
    """)
    assert said.strip().endswith("child 0"), said


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="no fork on this platform")
def test_a_child_forgets_a_deepcopy_call_another_thread_is_in() -> None:
    """deepcopy_shim.deepcopy(x, mode) counts a user of its own thread while it copies: a child
    forked meanwhile from another thread forgets it and can remove the patch."""
    said = run_forking("""
        inside, leave = threading.Event(), threading.Event()
        class Waits:
            def __deepcopy__(self, memo):
                inside.set(); leave.wait(20)
                return Waits()
        thread = threading.Thread(target=lambda: deepcopy_shim.deepcopy(Waits(), "silent"))
        thread.start(); inside.wait(20)
        status = fork_and(disable_removes)
        leave.set(); thread.join()
        print("child", status)
    """)
    assert said.strip().endswith("child 0"), said
