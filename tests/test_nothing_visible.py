"""Nothing on nn.Module that anyone but copy.deepcopy can see.

While the patch is installed (a scope in another thread, `enable()` plus a local
`enabled("off")`, a pytest marker saying off), every way of looking at a module, its class and
its metaclass answers as natively where no mode applies: `dir()` and `getattr` of every name it
lists, `hasattr`, `inspect.getattr_static`, `super()`, attributes a metaclass defines; and
torch.compile compiles.  In a mode, a deepcopy with its own dispatch table (torch's
StateDictStager) gets native's result, and copies made after torch.compile carry dynamo's
generation tag as native's do.

The torch.compile checks run in child interpreters: a compile changes the process for good
(dynamo wraps `nn.Module.__init__` and `__setstate__`).
"""

from __future__ import annotations

import ast
import copy
import inspect
import os
import sys
import textwrap
import threading
import types
import unittest.mock
from typing import Any, Callable, Dict, Iterator, List

import pytest
import torch
import torch.nn as nn
from support.models import (
    ORIGINAL_MODULE_ATTRS,
    ORIGINAL_TENSOR_DEEPCOPY,
    TORCH_VERSION,
    module_attrs,
    with_history,
)
from support.processes import DEV_PYTHON, clean_env, describe, run, run_code, same_code_env

import deepcopy_shim
from deepcopy_shim import NonLeafTensorError


@pytest.fixture
def another_thread_in_a_scope() -> Iterator[None]:
    """The patch installed by another thread's scope: no mode applies in this thread."""
    entered, leave = threading.Event(), threading.Event()

    def hold() -> None:
        with deepcopy_shim.enabled("warn"):
            entered.set()
            leave.wait(60)

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert entered.wait(20)
    assert not deepcopy_shim.is_enabled() and _installed()
    try:
        yield
    finally:
        leave.set()
        thread.join(20)


def _installed() -> bool:
    from deepcopy_shim import _patch

    return _patch.state() == "installed"


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2)


class Meta(type):
    def __deepcopy__(cls, memo: Dict[int, Any]) -> Any:
        return cls


class WithMeta(nn.Module, metaclass=Meta):
    pass


def _view(obj: Any) -> Dict[str, Any]:
    """What introspection says of `obj`: dir(), and getattr of every name it lists (the value,
    or the type of the error), hasattr and getattr_static of __deepcopy__."""
    seen: Dict[str, Any] = {}
    for name in dir(obj):
        try:
            value = getattr(obj, name)
        except Exception as exc:
            seen[name] = type(exc)
        else:
            seen[name] = getattr(value, "__func__", value)
    seen["hasattr"] = hasattr(obj, "__deepcopy__")
    seen["static"] = inspect.getattr_static(obj, "__deepcopy__", None)
    return seen


# The instances looked at, the same ones natively and patched (their __dict__ is compared).
NET, WITH_META = Net(), WithMeta()


def _natively() -> List[Dict[str, Any]]:
    _every_view()  # attributes Python makes on first access are made
    return _plain_values(_every_view())


def _every_view() -> List[Dict[str, Any]]:
    """The views of a module, its class, nn.Module, a class with a metaclass and its instance,
    and super()'s answer.  (Python makes some attributes on first access, a class's empty
    `__annotations__` among them: the first call makes them, before anything is compared.)"""
    return [_view(NET), _view(Net), _view(nn.Module), _view(WithMeta), _view(WITH_META),
            {"super": getattr(super(Net, NET), "__deepcopy__", None)}]


def _plain_values(views: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    # Bound methods of fresh instances differ by identity; their functions are compared.
    return [{k: (v if not callable(v) or isinstance(v, type) else getattr(v, "__qualname__", v))
             for k, v in view.items()} for view in views]


@pytest.mark.parametrize("how", ["another thread's scope", "enable() and enabled('off')"])
def test_introspection_answers_as_natively_where_no_mode_applies(
        how: str, request: pytest.FixtureRequest) -> None:
    native = _natively()
    if how == "another thread's scope":
        request.getfixturevalue("another_thread_in_a_scope")
        patched = _plain_values(_every_view())
    else:
        deepcopy_shim.enable("warn")
        with deepcopy_shim.enabled("off"):
            patched = _plain_values(_every_view())
    assert patched == native


def test_nothing_is_added_to_nn_module_while_the_patch_is_installed() -> None:
    native = _natively()
    with deepcopy_shim.enabled("warn"):
        assert module_attrs() == ORIGINAL_MODULE_ATTRS
        assert "__deepcopy__" not in dir(nn.Module) and not hasattr(Net(), "__deepcopy__")
        # In a mode too: introspection is native; only copy.deepcopy copies differently.
        assert _plain_values(_every_view()) == native


def test_a_metaclass_attribute_stays_visible_on_its_classes(another_thread_in_a_scope: None) -> None:
    assert hasattr(WithMeta, "__deepcopy__")
    assert WithMeta.__deepcopy__({}) is WithMeta
    assert copy.deepcopy(WithMeta) is WithMeta


@pytest.mark.parametrize("mode", ["warn", "strict", "silent"])
@pytest.mark.parametrize("cached", [False, True], ids=["leaves", "cached output with history"])
def test_state_dict_stager_gets_natives_result_in_every_mode(mode: str, cached: bool) -> None:
    stager_module = pytest.importorskip("torch.distributed.checkpoint._state_dict_stager")

    def stage() -> Any:
        torch.manual_seed(0)
        model = nn.Linear(2, 2)
        if cached:
            model.out = model(torch.ones(1, 2))  # a tensor with history: native staging copies it
        staged = stager_module.StateDictStager().stage({"m": model})
        return staged["m"]

    def summary(staged: Any) -> List[Any]:
        out = getattr(staged, "out", None)
        return [(name, type(t), t.requires_grad, t.is_leaf, t.tolist())
                for name, t in sorted(vars(staged).get("_parameters", {}).items())] + [
            (type(out), getattr(out, "requires_grad", None))]

    def outcome() -> Any:
        try:
            return summary(stage())
        except RuntimeError as refused:
            return refused

    native = outcome()
    with deepcopy_shim.enabled(mode):
        shim = outcome()  # no warning (pytest makes ours errors)
    if not isinstance(native, RuntimeError):
        assert shim == native
        return
    # torch 2.8 and 2.9: the stager stages its own leaf copy of the tensor, then calls the
    # tensor's __deepcopy__ too, and torch's refuses it.  strict refuses where torch refuses;
    # in warn and silent the memo's copy, the stager's own, is the copy (nothing is detached,
    # nothing is reported), as torch 2.10 and later stage it.
    assert "graph leaves" in str(native)
    if mode == "strict":
        assert isinstance(shim, deepcopy_shim.NonLeafTensorError)
        assert "graph leaves" in str(shim.__cause__)  # torch's own refusal, as its cause
    else:
        assert shim[-1] == (torch.Tensor, False)


# torch.compile runs on Python 3.11 from torch 2.1, on 3.12 from 2.4, on 3.13 from 2.6 (torch 2.0
# raises "Python 3.11+ not yet supported for torch.compile").
needs_compile = pytest.mark.skipif(
    TORCH_VERSION < {(3, 9): (2, 0), (3, 10): (2, 0), (3, 11): (2, 1), (3, 12): (2, 4)}.get(
        sys.version_info[:2], (2, 6)),
    reason="torch.compile does not run on this Python with this torch")

_COMPILE_PRELUDE = """
import threading, torch, torch.nn as nn, deepcopy_shim
def compile_once():
    return torch.compile(lambda x: x + 1, backend="eager")(torch.ones(2)).tolist()
def another_thread_holds_a_scope():
    entered, leave = threading.Event(), threading.Event()
    def hold():
        with deepcopy_shim.enabled("warn"):
            entered.set(); leave.wait(120)
    threading.Thread(target=hold, daemon=True).start()
    entered.wait(60)
    return leave
"""


def _child(code: str) -> str:
    done = run_code(DEV_PYTHON, _COMPILE_PRELUDE + textwrap.dedent(code), same_code_env(), timeout=300)
    assert done.returncode == 0, describe(done)
    return done.stdout.strip().splitlines()[-1]


@needs_compile
def test_torch_compile_compiles_while_another_thread_holds_a_scope() -> None:
    out = _child("""
        leave = another_thread_holds_a_scope()
        first = compile_once()
        again = torch.compile(lambda x: x * 2, backend="eager")(torch.ones(3))  # another compile
        again = torch.compile(lambda x: x * 2, backend="eager")(torch.ones(4, 4))  # a recompile
        leave.set()
        print(first, again.shape)
    """)
    assert out == "[2.0, 2.0] torch.Size([4, 4])"


@needs_compile
def test_torch_compile_compiles_under_enable_and_a_local_off_scope() -> None:
    out = _child("""
        deepcopy_shim.enable("warn")
        with deepcopy_shim.enabled("off"):
            print(compile_once())
    """)
    assert out == "[2.0, 2.0]"


_COMPILED_COPY = """
import copy, sys, threading, warnings
warnings.simplefilter("error")  # any warning dynamo gives becomes its InternalTorchDynamoError
DOOR = sys.argv[1]
if DOOR == "thread":
    another_thread_holds_a_scope()
elif DOOR == "enable and off":
    deepcopy_shim.enable("warn"); deepcopy_shim.enabled("off").__enter__()
elif DOOR != "native":
    deepcopy_shim.enabled(DOOR).__enter__()
def copies(x, d):
    return x + 1, copy.deepcopy(d)
def seen(arg):
    explained = torch._dynamo.explain(copies)(torch.ones(2), arg)
    torch._dynamo.reset()
    out, copied = torch.compile(copies, backend="eager")(torch.ones(2), arg)
    return (explained.graph_count, explained.graph_break_count,
            [str(r.reason).splitlines()[0] for r in explained.break_reasons],
            out.tolist(), repr(copied))
torch.manual_seed(0)
layer = nn.Linear(2, 2)
kinds = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.int16,
         torch.int32, torch.int64, torch.uint8, torch.bool, torch.complex64, torch.complex128]
results = [seen({"n": 1, "t": torch.ones(2), "m": layer}), seen(layer), seen({"a": 1, "b": [2, 3]}),
           seen({str(kind): torch.ones(2, dtype=kind) for kind in kinds})]
try:  # torch before 2.12 cannot trace copy.deepcopy with fullgraph=True: the same refusal
    whole = repr(torch.compile(copies, backend="eager", fullgraph=True)(torch.ones(2), {"a": 1, "b": [2, 3]}))
except Exception as refused:
    whole = f"{type(refused).__name__}: {str(refused).splitlines()[0]}"
print(repr((results, whole)))
"""


@needs_compile
@pytest.mark.parametrize("door", ["thread", "enable and off", "warn", "silent", "strict"])
def test_compiled_code_that_deep_copies_is_traced_as_natively(door: str) -> None:
    """Code compiled with torch.compile that calls copy.deepcopy: dynamo sees copy's table as
    natively (no frame of the shim's is traced or compiled), where no mode applies and in
    every mode: the same graphs and breaks, no warning of dynamo's, the same result.

    One difference is dynamo's wording: the break at a tensor's copy is named after the
    function `Tensor.__deepcopy__` binds, which is the shim's while it is installed."""

    def traced(how: str) -> Any:
        done = run([DEV_PYTHON, "-c", _COMPILE_PRELUDE + _COMPILED_COPY, how], same_code_env(),
                   timeout=300)
        assert done.returncode == 0, describe(done)
        return ast.literal_eval(done.stdout.strip().splitlines()[-1])

    (results, whole), (native_results, native_whole) = traced(door), traced("native")
    assert whole == native_whole  # fullgraph=True compiles a copy of plain data as natively, or refuses it
    renamed = {"Attempted to copy.deepcopy a tensor": "Unsupported method call"}
    # a dict holding a module and a tensor; a module as the root; plain data; tensors of 12
    # dtypes (a frame of the shim's compiled by dynamo would be recompiled for each)
    for (graphs, breaks, reasons, out, copied), native in zip(results, native_results):
        assert (graphs, breaks, out, copied) == (native[0], native[1], native[3], native[4])
        assert len(reasons) == len(native[2])
        assert all(r in (n, renamed.get(n)) for r, n in zip(reasons, native[2]))


@needs_compile
def test_a_refusal_after_torch_compile_names_everything_and_shows_no_frame_of_dynamos() -> None:
    """In a process where torch.compile has run, a strict copy made by plain code shows no
    frame of dynamo's in its traceback (none runs), and one made by compiled code (past its
    graph break, the copy running eagerly) is refused with the whole list, as anywhere."""
    out = _child("""
        import copy, traceback
        compile_once()
        h = torch.ones(2, requires_grad=True) * 2
        with deepcopy_shim.enabled("strict"):
            try:
                copy.deepcopy({"h": h, "n": 1})
            except deepcopy_shim.NonLeafTensorError as exc:
                shown = "".join(traceback.format_exception(exc))
                plain = ("torch/_dynamo" in shown.replace("\\\\", "/"), exc.paths)
            try:
                torch.compile(lambda d: copy.deepcopy(d), backend="eager")({"n": 1, "h": h})
            except deepcopy_shim.NonLeafTensorError as exc:
                compiled = (exc.paths, "may be incomplete" in " ".join(str(exc).split()))
        print(plain, compiled)
    """)
    assert out == "(False, (\"['h']\",)) ((\"['h']\",), False)"


@needs_compile
def test_torch_compile_compiles_in_a_test_marked_off_under_the_pytest_option(tmp_path: Any) -> None:
    test_file = tmp_path / "test_compile_off.py"
    test_file.write_text(textwrap.dedent("""
        import pytest, torch

        @pytest.mark.deepcopy_shim("off")
        def test_compiles():
            assert torch.compile(lambda x: x + 1, backend="eager")(torch.ones(2)).tolist() == [2.0, 2.0]

        @pytest.mark.deepcopy_shim("warn")
        def test_compiles_in_a_mode():
            assert torch.compile(lambda x: x + 1, backend="eager")(torch.ones(2)).tolist() == [2.0, 2.0]
    """))
    done = run([DEV_PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--deepcopy-shim=warn",
                str(test_file)], clean_env(), cwd=tmp_path, timeout=300)
    assert done.returncode == 0 and "2 passed" in done.stdout, describe(done)


@needs_compile
def test_copies_made_after_torch_compile_carry_dynamos_generation_tag_in_every_mode() -> None:
    out = _child("""
        import copy
        from torch._dynamo.mutation_guard import GenerationTracker
        compile_once()
        model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
        model.cached = model(torch.ones(1, 2))
        tags = [GenerationTracker.check(m) for m in copy.deepcopy(nn.Sequential(nn.Linear(2, 2))).modules()]
        for mode in ("silent", "warn", "strict"):
            source = model if mode != "strict" else nn.Sequential(nn.Linear(2, 2), nn.ReLU())
            import warnings
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with deepcopy_shim.enabled(mode):
                    made = copy.deepcopy(source)
            tags += [GenerationTracker.check(m) for m in made.modules()]
        print(all(tags), len(tags))
    """)
    assert out == "True 11"


def test_parametrize_sees_no_deepcopy_on_the_class_in_a_mode() -> None:
    """torch.nn.utils.parametrize gives its dynamic class a __deepcopy__ of its own only where the
    class has none: in a mode as natively, and the parametrized module copies after the patch
    is gone."""
    with deepcopy_shim.enabled("warn"):
        layer = torch.nn.utils.parametrize.register_parametrization(
            nn.Linear(2, 2), "weight", _Double())
        assert "__deepcopy__" in vars(type(layer))
    copied = copy.deepcopy(layer)
    assert torch.equal(copied.weight, layer.weight)


class _Double(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def test_strict_never_refuses_what_a_copier_with_its_own_dispatch_completes() -> None:
    """A deepcopy written like copy.deepcopy with its own tables (StateDictStager's shape),
    which copies tensors itself: strict has nothing to refuse, since it never calls
    Tensor.__deepcopy__ on the tensor with history."""
    model = nn.Linear(2, 2)
    model.out = model(torch.ones(1, 2))

    def own_deepcopy(x: Any, memo: Dict[int, Any]) -> Any:
        if id(x) in memo:
            return memo[id(x)]
        if isinstance(x, (bool, int, float, str, type(None), frozenset)):
            return x
        if isinstance(x, set):
            return set(x)
        if isinstance(x, torch.Tensor):
            y = x.detach().clone()
        elif isinstance(x, dict):
            y = {k: own_deepcopy(v, memo) for k, v in x.items()}
        else:
            copier: Callable[..., Any] = getattr(x, "__deepcopy__", None)  # type: ignore[assignment]
            if copier is not None:
                y = copier(memo)
            else:
                rv = x.__reduce_ex__(4)
                y = rv[0](*rv[1])
                memo[id(x)] = y
                y.__setstate__(own_deepcopy(rv[2], memo))
        memo[id(x)] = y
        return y

    with deepcopy_shim.enabled("strict"):
        made = own_deepcopy(model, {})
    assert made.out.is_leaf and torch.equal(made.out, model.out.detach())
    with deepcopy_shim.enabled("strict"), pytest.raises(NonLeafTensorError):
        copy.deepcopy(model)  # copy.deepcopy itself still refuses in strict


def test_a_module_root_in_a_mode_copies_as_natively(another_thread_in_a_scope: None) -> None:
    model = Net()
    model.cached = with_history()
    with deepcopy_shim.enabled("silent"):
        made = copy.deepcopy(model)
    assert made.cached.is_leaf and made.fc.weight is not model.fc.weight



def test_a_tensor_in_a_scope_without_the_shim_inside_a_copy_binds_torchs_own_function() -> None:
    """Inside a copy the shim runs, a `__deepcopy__` that enters `enabled("off")` sees tensors
    as natively: `t.__deepcopy__` is torch's own function, bound."""
    seen: List[Any] = []

    class LooksInside:
        def __deepcopy__(self, memo: Dict[int, Any]) -> str:
            with deepcopy_shim.enabled("off"):
                seen.append(torch.ones(1).__deepcopy__.__func__)
            return "looked"

    with deepcopy_shim.enabled("silent"):
        copy.deepcopy([LooksInside(), with_history()])
    assert seen == [ORIGINAL_TENSOR_DEEPCOPY]


def test_every_function_of_the_package_is_kept_from_dynamo_once_the_patch_is_made() -> None:
    """Every code object of every module of the shim loaded by then is marked with torch's
    frame skip (dynamo never compiles a frame of the shim's), also those kept in a table, and
    marking again costs a look-up per module not yet marked."""
    import deepcopy_shim._tested  # imported late by the report: marked at an install
    from deepcopy_shim import _compiler

    with deepcopy_shim.enabled("warn"):
        pass
    assert "deepcopy_shim._tested" not in (_compiler._unmarked or [])
    marked: List[Any] = []
    original = _compiler._skip
    if original is None:
        pytest.skip("this torch has no frame skip")
    _compiler._unmarked = None
    _compiler._skip = None
    try:
        import unittest.mock

        with unittest.mock.patch.object(_compiler, "_skipper", lambda: marked.append):
            _compiler.keep_out()
    finally:
        _compiler._unmarked = None
        _compiler.keep_out()
    names = {(code.co_filename, code.co_name) for code in marked}
    from deepcopy_shim import _tensor

    assert all(os.path.dirname(f) == os.path.dirname(_compiler.__file__) for f, _ in names)
    lambdas = {code for code in marked if code.co_name == "<lambda>"}
    assert any(fn.__code__ in lambdas for fn in _tensor._NEUTRAL if fn.__name__ == "<lambda>")
    assert ("get" in {n for _, n in names}) and ("copy_root" in {n for _, n in names})


def test_marking_the_package_for_dynamo_from_two_threads_at_once_marks_what_one_thread_marks() -> None:
    """Two threads that install the patch at once both prepare it outside the patch's lock, and
    both mark the package's code: one may mark a module the other is still going through (a
    soak on torch 2.0 raised `ValueError: list.remove(x): x not in list` there). Here the
    second marking runs inside the first, at its first mark, as another thread's would."""
    from deepcopy_shim import _compiler, _dispatch, _patch  # loaded, so both threads mark them

    names = [_compiler.__name__, _patch.__name__, _dispatch.__name__]
    marked: List[types.CodeType] = []
    other_thread: List[bool] = []

    def mark_and_let_another_thread_in(code: types.CodeType) -> None:
        if not other_thread:
            other_thread.append(True)
            _compiler.keep_out()  # the other thread, between this one's look and its mark
        marked.append(code)

    alone: List[types.CodeType] = []  # what one thread marks with nobody beside it
    saved = (_compiler._unmarked, _compiler._skip)
    try:
        _compiler._unmarked, _compiler._skip = list(names), alone.append
        _compiler.keep_out()
        _compiler._unmarked, _compiler._skip = list(names), mark_and_let_another_thread_in
        _compiler.keep_out()
        left = _compiler._unmarked
    finally:
        _compiler._unmarked, _compiler._skip = saved
    assert left == []
    # The same code objects marked (some of them more than once: marking again is harmless).
    assert set(marked) == set(alone)
    assert {_compiler.keep_out.__code__, _patch.acquire.__code__,
            _dispatch.DispatchTable.get.__code__} <= set(alone)


def test_a_module_loaded_after_an_install_and_every_nested_function_are_kept_from_dynamo() -> None:
    """A module of the package that is not loaded when the patch is first made is marked by a
    later install, once loaded; functions defined inside functions (the tensor patch's own, a
    class made in a function) are marked with the function that defines them."""
    from deepcopy_shim import _compiler, _tensor, _tested

    if _compiler._skip is None and _compiler._skipper() is None:
        pytest.skip("this torch has no frame skip")
    marked: List[types.CodeType] = []
    saved = (_compiler._unmarked, _compiler._skip)
    late = sys.modules.pop(_tested.__name__)  # as if not loaded yet at the first install
    try:
        _compiler._unmarked, _compiler._skip = None, None
        with unittest.mock.patch.object(_compiler, "_skipper", lambda: marked.append):
            _compiler.keep_out()
            assert "deepcopy_shim._tested" in (_compiler._unmarked or [])
            sys.modules["deepcopy_shim._tested"] = late  # loaded now
            _compiler.keep_out()  # the next install
        assert "deepcopy_shim._tested" not in (_compiler._unmarked or [])
    finally:
        sys.modules["deepcopy_shim._tested"] = late
        _compiler._unmarked, _compiler._skip = saved
    tested = {late.torch_newer_than_tested.__code__, late.tested_range_text.__code__}
    assert tested <= set(marked)  # (another module may have marked them already, importing them)
    nested = {const.co_name for const in _tensor.make_tensor_deepcopy_wrapper.__code__.co_consts
              if isinstance(const, types.CodeType)}
    assert {"tensor_deepcopy", "bound_deepcopy"} <= nested
    assert {c.co_name for c in marked if c.co_filename == _tensor.__file__} >= nested | {"__get__"}
