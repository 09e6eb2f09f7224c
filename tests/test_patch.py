"""Installing, scoping and removing the patch."""

from __future__ import annotations

import asyncio
import copy
import subprocess
import sys
import textwrap
import threading
import types
import warnings
from typing import Callable, Dict, Iterator, List, Optional

import pytest
import torch
import torch.nn as nn
from support.lines import marked_line
from support.models import (
    ORIGINAL_DISPATCH,
    ORIGINAL_MODULE_ATTRS,
    ORIGINAL_TENSOR_DEEPCOPY,
    CachedActivationsNet,
    module_attrs,
    native_refuses,
    needs_parametrizations_weight_norm,
)

import deepcopy_shim
from deepcopy_shim import Mode, _patch


def mode_now() -> Optional[Mode]:
    setting = deepcopy_shim.current_mode()
    return None if setting is None else setting.mode


def test_enable_installs_and_disable_restores_identity(cached_net: CachedActivationsNet) -> None:
    assert native_refuses(cached_net)
    deepcopy_shim.enable()
    assert (_patch.state() == "installed")
    assert vars(torch.Tensor)["__deepcopy__"] is not ORIGINAL_TENSOR_DEEPCOPY
    assert copy._deepcopy_dispatch is not ORIGINAL_DISPATCH  # type: ignore[attr-defined]
    assert copy._deepcopy_dispatch == ORIGINAL_DISPATCH  # type: ignore[attr-defined]
    assert module_attrs() == ORIGINAL_MODULE_ATTRS  # nothing on nn.Module, ever
    deepcopy_shim.disable()
    assert vars(torch.Tensor)["__deepcopy__"] is ORIGINAL_TENSOR_DEEPCOPY
    assert copy._deepcopy_dispatch is ORIGINAL_DISPATCH  # type: ignore[attr-defined]
    assert module_attrs() == ORIGINAL_MODULE_ATTRS
    assert native_refuses(cached_net)  # the native error is back, verbatim


def test_enable_is_idempotent_and_only_changes_mode() -> None:
    deepcopy_shim.enable()
    patched = vars(torch.Tensor)["__deepcopy__"]
    deepcopy_shim.enable("strict")
    assert vars(torch.Tensor)["__deepcopy__"] is patched  # never wrapped twice
    assert patched.__wrapped__ is ORIGINAL_TENSOR_DEEPCOPY
    assert mode_now() is Mode.STRICT
    assert _patch._users == 1
    deepcopy_shim.disable()
    assert not (_patch.state() == "installed")


def test_disable_when_not_enabled_is_safe() -> None:
    deepcopy_shim.disable()
    deepcopy_shim.disable()
    assert not deepcopy_shim.is_enabled()


@pytest.mark.parametrize("bad", ["loud", None, 3, "warn strict"])
def test_invalid_mode_raises_and_changes_nothing(bad: object) -> None:
    refused = (TypeError, ValueError)  # None is of no accepted type: TypeError, as Python says
    deepcopy_shim.enable("silent")
    with pytest.raises(refused, match=r"(invalid mode .*warn, strict, silent|mode must be a str)"):
        deepcopy_shim.enable(bad)  # type: ignore[arg-type]
    assert mode_now() is Mode.SILENT
    with pytest.raises(refused, match=r"invalid mode|mode must be"):
        deepcopy_shim.enabled(bad)  # type: ignore[arg-type]
    with pytest.raises(refused, match=r"invalid mode|mode must be"):
        deepcopy_shim.deepcopy(torch.ones(1), mode=bad)  # type: ignore[arg-type]
    assert _patch._users == 1


def test_modes_accept_enum_and_any_case() -> None:
    assert Mode.parse("STRICT") is Mode.STRICT
    assert Mode.parse(Mode.WARN) is Mode.WARN
    assert Mode.SILENT == "silent" and str(Mode.SILENT) == "silent"


def test_is_enabled_follows_global_and_scopes() -> None:
    assert not deepcopy_shim.is_enabled()
    with deepcopy_shim.enabled("silent"):
        assert deepcopy_shim.is_enabled()
    assert not deepcopy_shim.is_enabled()
    deepcopy_shim.enable()
    assert deepcopy_shim.is_enabled()


def test_enabled_nests_and_restores_exactly(cached_net: CachedActivationsNet) -> None:
    deepcopy_shim.enable("silent")
    with deepcopy_shim.enabled("strict"):
        assert mode_now() is Mode.STRICT
        with deepcopy_shim.enabled("warn"):
            assert mode_now() is Mode.WARN
        assert mode_now() is Mode.STRICT
        with pytest.raises(deepcopy_shim.NonLeafTensorError):
            copy.deepcopy(cached_net)
    assert mode_now() is Mode.SILENT
    assert _patch._users == 1


def test_scope_keeps_patch_until_it_exits_even_if_disabled_inside(cached_net: CachedActivationsNet) -> None:
    deepcopy_shim.enable()
    with deepcopy_shim.enabled("silent"):
        deepcopy_shim.disable()
        assert (_patch.state() == "installed")
        copy.deepcopy(cached_net)  # the scope still applies
    assert not (_patch.state() == "installed")
    assert native_refuses(cached_net)


def test_enabled_as_decorator_and_start_stop(cached_net: CachedActivationsNet) -> None:
    @deepcopy_shim.enabled("silent")
    def make_copy(net: nn.Module) -> nn.Module:
        assert mode_now() is Mode.SILENT
        return copy.deepcopy(net)

    assert make_copy(cached_net).head.last_out.is_leaf
    assert make_copy.__name__ == "make_copy"
    assert not (_patch.state() == "installed")

    scope = deepcopy_shim.enabled("strict")
    scope.start()
    assert mode_now() is Mode.STRICT
    scope.stop()
    assert mode_now() is None
    with pytest.raises(RuntimeError, match="without a matching start"):
        scope.stop()


def test_enabled_decorates_coroutines(cached_net: CachedActivationsNet) -> None:
    @deepcopy_shim.enabled("silent")
    async def make_copy() -> nn.Module:
        await asyncio.sleep(0)
        return copy.deepcopy(cached_net)

    assert asyncio.run(make_copy()).head.last_out.is_leaf
    assert mode_now() is None


def test_enabled_refuses_generator_functions() -> None:
    def gen() -> Iterator[int]:
        yield 1

    with pytest.raises(TypeError, match="generator function"):
        deepcopy_shim.enabled()(gen)


def test_enabled_reports_public_module_path() -> None:
    assert deepcopy_shim.enabled.__module__ == "deepcopy_shim"
    assert Mode.__module__ == "deepcopy_shim"
    assert deepcopy_shim.NonLeafTensorError.__module__ == "deepcopy_shim"
    assert repr(deepcopy_shim.enabled("strict")) == "deepcopy_shim.enabled(mode='strict')"


def test_deepcopy_function_enables_nothing_globally(cached_net: CachedActivationsNet) -> None:
    copied = deepcopy_shim.deepcopy(cached_net, mode="silent")
    assert copied.head.last_out.is_leaf
    assert not (_patch.state() == "installed")
    assert not deepcopy_shim.is_enabled()


def test_threads_see_only_their_own_scope(cached_net: CachedActivationsNet) -> None:
    """Threads copying at once in warn, strict, silent and no mode each get their own behaviour."""
    barrier = threading.Barrier(4)
    outcomes: Dict[str, str] = {}
    warned_in: List[str] = []

    def record(message: object, category: type, *args: object, **kwargs: object) -> None:
        # warnings state is process-global: attribute each warning to the thread emitting it.
        warned_in.append(threading.current_thread().name)

    def copy_once() -> str:
        try:
            copy.deepcopy(cached_net)
            return "copied"
        except deepcopy_shim.NonLeafTensorError:
            return "refused"
        except RuntimeError as exc:
            return "native error" if "graph leaves" in str(exc) else repr(exc)

    def run(mode: Optional[str]) -> None:
        seen = set()
        for i in range(20):
            if mode is None:
                if i == 0:
                    barrier.wait()
                seen.add(copy_once())
            else:
                with deepcopy_shim.enabled(mode):
                    if i == 0:
                        barrier.wait()
                    seen.add(copy_once())
        outcomes[threading.current_thread().name] = "/".join(sorted(seen))

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        threads = [
            threading.Thread(target=run, args=(mode,), name=str(mode))
            for mode in ["warn", "strict", "silent", None]
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert outcomes == {
        "warn": "copied", "strict": "refused", "silent": "copied", "None": "native error"
    }
    assert warned_in == ["warn"] * 20  # one warning per top-level copy, only in warn mode
    assert not (_patch.state() == "installed")


def test_concurrent_enable_disable_counts_exactly() -> None:
    def churn() -> None:
        for _ in range(200):
            with deepcopy_shim.enabled("silent"):
                assert (_patch.state() == "installed")

    threads = [threading.Thread(target=churn) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert _patch._users == 0 and not (_patch.state() == "installed")


class _Doubled(nn.Module):
    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return weight * 2


def _weight_norm(layer: nn.Module) -> nn.Module:
    from torch.nn.utils import parametrizations

    return parametrizations.weight_norm(layer)  # type: ignore[no-any-return]


def _doubled(layer: nn.Module) -> nn.Module:
    from torch.nn.utils import parametrize

    return parametrize.register_parametrization(layer, "weight", _Doubled())


@pytest.mark.parametrize(
    "parametrized", [pytest.param(_weight_norm, marks=needs_parametrizations_weight_norm), _doubled]
)
def test_parametrized_while_enabled_still_copies_after_disable(
    parametrized: Callable[[nn.Module], nn.Module],
) -> None:
    from torch.nn.utils import parametrize

    deepcopy_shim.enable()
    assert not hasattr(nn.Linear, "__deepcopy__")  # what parametrize checks
    layer = parametrized(nn.Linear(3, 3))
    assert parametrize.is_parametrized(layer)
    deepcopy_shim.disable()
    copied = copy.deepcopy(layer)
    assert torch.equal(copied.weight, layer.weight)


def test_mixin_deepcopy_after_module_in_mro_is_honoured() -> None:
    class CopyCounter:
        def __deepcopy__(self, memo: dict) -> str:
            return "mixin copy"

    class Net(nn.Linear, CopyCounter):
        pass

    deepcopy_shim.enable()
    assert copy.deepcopy(Net(2, 2)) == "mixin copy"


def test_someone_patching_over_us_is_left_in_place() -> None:
    deepcopy_shim.enable()
    ours = vars(torch.Tensor)["__deepcopy__"]

    def theirs(self: torch.Tensor, memo: dict) -> torch.Tensor:
        return ours(self, memo)

    torch.Tensor.__deepcopy__ = theirs  # type: ignore[method-assign]
    try:
        with pytest.warns(deepcopy_shim.PatchConflictWarning, match="replaced by someone else") as caught:
            deepcopy_shim.disable()  # line: disable-over-theirs
        # reported at the user's line, not inside deepcopy_shim
        where = (caught[0].filename, caught[0].lineno)
        assert where == (__file__, marked_line(__file__, "disable-over-theirs"))
        assert vars(torch.Tensor)["__deepcopy__"] is theirs
        assert "__deepcopy__" not in vars(nn.Module)
        with pytest.raises(RuntimeError, match="graph leaves"):
            copy.deepcopy(torch.ones(1, requires_grad=True) * 2)  # ours beneath is inert
    finally:
        torch.Tensor.__deepcopy__ = ORIGINAL_TENSOR_DEEPCOPY  # type: ignore[method-assign]


def _run(code: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout
    )


def test_enable_before_torch_import_patches_on_import_without_importing_torch() -> None:
    result = _run(
        """
        import sys, copy
        import deepcopy_shim
        deepcopy_shim.enable("silent")
        assert "torch" not in sys.modules, "enable() imported torch"
        assert deepcopy_shim.is_enabled()
        import torch
        from deepcopy_shim import _patch
        assert (_patch.state() == "installed")
        t = torch.ones(2, requires_grad=True) * 3
        c = copy.deepcopy(t)
        assert c.is_leaf and c.requires_grad and torch.equal(c, t)
        deepcopy_shim.disable()
        try:
            copy.deepcopy(t)
        except RuntimeError as e:
            assert "graph leaves" in str(e)
        else:
            raise AssertionError("native error not restored")
        print("ok")
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_enable_then_disable_before_torch_import_leaves_torch_untouched() -> None:
    result = _run(
        """
        import deepcopy_shim
        deepcopy_shim.enable()
        deepcopy_shim.disable()
        import torch
        assert "__deepcopy__" not in vars(torch.nn.Module)
        assert type(vars(torch.Tensor)["__deepcopy__"]).__name__ == "function"
        print("ok")
        """
    )
    assert result.returncode == 0, result.stderr


def test_importing_the_package_does_not_import_torch() -> None:
    result = _run(
        """
        import sys, deepcopy_shim
        assert deepcopy_shim.find_nonleaf_tensors({"a": 1}) == []
        print("torch" in sys.modules)
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_failed_deferred_install_never_breaks_import_torch() -> None:
    """Even with warnings escalated to errors, `import torch` succeeds; one line says why."""
    result = _run(
        """
        import warnings, wrapt
        import deepcopy_shim  # does not import torch
        # as pytest's filterwarnings = error::deepcopy_shim.DeepcopyShimWarning would
        warnings.filterwarnings("error", category=deepcopy_shim.DeepcopyShimWarning)
        def other_patch(torch):  # runs first: post-import hooks fire in registration order
            import copy, types  # a read-only table: copy.deepcopy still works natively
            copy._deepcopy_dispatch = types.MappingProxyType(dict(copy._deepcopy_dispatch))
        wrapt.register_post_import_hook(other_patch, "torch")
        deepcopy_shim.enable()
        import torch
        from deepcopy_shim import _patch
        print("imported", (_patch.state() == "installed"))
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "imported False"
    (line,) = [s for s in result.stderr.splitlines() if s.startswith("deepcopy_shim")]
    assert "not installed at `import torch`" in line and "is not the dict" in line


# --- the lifecycle cannot lose its install or deadlock --------------------------------------


def test_the_patch_state_has_one_owner_that_does_not_export_its_lock() -> None:
    assert not any(name.lower().endswith("lock") for name in _patch.__all__)


def test_a_failed_install_counts_no_user() -> None:
    copy._deepcopy_dispatch = types.MappingProxyType(dict(ORIGINAL_DISPATCH))  # type: ignore[attr-defined]
    try:
        with pytest.raises(RuntimeError, match="is not the dict"):
            deepcopy_shim.enable()
        assert _patch._users == 0 and not deepcopy_shim.is_enabled()
        with pytest.raises(RuntimeError, match="is not the dict"):
            with deepcopy_shim.enabled("silent"):
                pass
        assert _patch._users == 0
    finally:
        copy._deepcopy_dispatch = ORIGINAL_DISPATCH  # type: ignore[attr-defined]
    deepcopy_shim.enable()  # and nothing is left half-done for the next attempt
    assert (_patch.state() == "installed")


def test_torch_imported_while_the_hook_is_registered_is_still_patched() -> None:
    """`import torch` completing between the check for torch and the hook's registration (wrapt
    then calls the hook at once) must still leave torch patched."""
    result = _run(
        """
        import sys, copy, wrapt
        register = wrapt.register_post_import_hook

        def torch_arrives_first(hook, name):
            import torch  # another thread's import, completing in between
            return register(hook, name)

        wrapt.register_post_import_hook = torch_arrives_first
        import deepcopy_shim
        from deepcopy_shim import _patch
        deepcopy_shim.enable("silent")
        import torch
        t = torch.ones(2, requires_grad=True) * 3
        print((_patch.state() == "installed"), copy.deepcopy(t).is_leaf)
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "True"]


def test_enable_while_another_thread_imports_torch_cannot_deadlock() -> None:
    """Thread B is inside `import torch` (holding torch's module lock, its post-import hooks
    running) while thread A calls enable(): neither may wait on the other."""
    code = """
        import sys, threading, time, copy, wrapt
        import deepcopy_shim
        inside_import = threading.Event()

        def slow_hook(torch):  # registered first, so it runs before the shim's own hook
            inside_import.set()
            time.sleep(0.5)

        wrapt.register_post_import_hook(slow_hook, "torch")
        deepcopy_shim.enable(); deepcopy_shim.disable()  # registers the shim's hook
        importer = threading.Thread(target=lambda: __import__("torch"))
        importer.start()
        inside_import.wait()
        deepcopy_shim.enable("silent")  # thread A, while B holds torch's import lock
        importer.join()
        import torch
        from deepcopy_shim import _patch
        print((_patch.state() == "installed"), copy.deepcopy(torch.ones(1, requires_grad=True) * 2).is_leaf)
        """
    for _ in range(3):
        try:
            result = _run(code, timeout=60)
        except subprocess.TimeoutExpired:  # pragma: no cover - the defect this guards against
            pytest.fail("enable() and `import torch` in another thread deadlocked")
        assert result.returncode == 0, result.stderr
        assert result.stdout.split() == ["True", "True"]


def test_the_hook_called_inside_its_registration_while_torch_is_being_imported_waits() -> None:
    """wrapt 1.x calls a post-import hook from inside `register_post_import_hook`, holding its
    own lock, when the module is already in sys.modules: here thread B is inside torch's
    `__init__` (torch in sys.modules, its module lock held) when thread A, which found torch
    not imported, registers the shim's hook, and another library has a hook on `torch.nn`.
    The hook must leave the install to A after registration returns: installing from inside it
    would wait for B's import while holding the lock B needs to finish it (wrapt's notify for
    `torch.nn`).  (wrapt 2.x calls such a hook outside its lock; CI runs
    this under wrapt 1.14 too.)"""
    code = """
        import sys, threading, copy, wrapt
        inside_init = threading.Event()
        may_finish = threading.Event()

        def pause_in_torch_init(frame, event, arg):  # B: stop at torch/__init__'s first line
            if event == "call" and frame.f_code.co_name == "<module>" and \\
                    frame.f_code.co_filename.replace("\\\\", "/").endswith("torch/__init__.py"):
                def first_line(frame, event, arg):
                    sys.settrace(None)
                    inside_init.set()
                    may_finish.wait(10)
                    return None
                return first_line
            return None

        def import_torch():
            sys.settrace(pause_in_torch_init)
            import torch

        # Another library's hook on a module torch imports while it initialises: B's import of
        # it ends in wrapt's notify, which takes wrapt's lock.
        wrapt.register_post_import_hook(lambda module: None, "torch.nn")
        register = wrapt.register_post_import_hook

        def registered_mid_import(hook, name):  # A: torch was not imported when A looked
            if name == "torch" and not inside_init.is_set():
                threading.Thread(target=import_torch).start()
                assert inside_init.wait(30) and "torch" in sys.modules
                threading.Timer(0.5, may_finish.set).start()
            return register(hook, name)

        wrapt.register_post_import_hook = registered_mid_import
        import deepcopy_shim
        deepcopy_shim.enable("silent")
        import torch
        from deepcopy_shim import _patch
        print(_patch.state(), copy.deepcopy(torch.ones(1, requires_grad=True) * 2).is_leaf)
        """
    for _ in range(2):
        try:
            result = _run(code, timeout=60)
        except subprocess.TimeoutExpired:  # pragma: no cover - the defect this guards against
            pytest.fail("the hook called inside its registration deadlocked with `import torch`")
        assert result.returncode == 0, result.stderr
        assert result.stdout.split() == ["installed", "True"], result.stdout
