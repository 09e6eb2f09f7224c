"""Promises a mutation run of the suite found unguarded (issue 20), tested as behaviours through
``copy.deepcopy``, ``deepcopy_shim.deepcopy``, ``find_nonleaf_tensors``, scopes and tasks."""

from __future__ import annotations

import asyncio
import copy
import copyreg
import math
import warnings
from typing import Any, Dict, List

import pytest
import torch
import torch.nn as nn
from support.graphdiff import GraphDiff
from support.models import resolve, with_history

import deepcopy_shim
from deepcopy_shim import DetachedTensorsWarning, NonLeafTensorError


def warned(call: Any) -> List[DetachedTensorsWarning]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return [w.message for w in caught if isinstance(w.message, DetachedTensorsWarning)]


# --- a copy with no deepcopy frame to watch: reported tensor by tensor -----------------------


def test_a_direct_deepcopy_call_is_reported_in_warn_and_refused_in_strict() -> None:
    t = with_history()
    with deepcopy_shim.enabled("warn"):
        (w,) = warned(lambda: t.__deepcopy__({}))
    assert w.paths == ("",) and w.tensors == (t,)
    with deepcopy_shim.enabled("strict"), pytest.raises(NonLeafTensorError) as refused:
        t.__deepcopy__({})
    assert refused.value.paths == ("",) and refused.value.tensors == (t,)
    assert "graph leaves" in str(refused.value)


# --- a scope of another mode around a fresh copy made inside a copy ---------------------------


class FreshCopyInScope:
    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.t = with_history()

    def __deepcopy__(self, memo: Dict[int, Any]) -> Any:
        with deepcopy_shim.enabled(self.mode):
            return copy.deepcopy(self.t)  # a new memo: a copy of its own, in the scope's mode


def test_a_strict_scope_around_a_fresh_copy_inside_a_warn_copy_refuses() -> None:
    obj = [with_history(), FreshCopyInScope("strict")]
    with deepcopy_shim.enabled("warn"), warnings.catch_warnings():
        warnings.simplefilter("error")  # the warn copy fails: nothing is announced
        with pytest.raises(NonLeafTensorError) as refused:
            copy.deepcopy(obj)
    assert refused.value.tensors == (obj[1].t,) and refused.value.paths == ("",)


def test_a_warn_scope_around_a_fresh_copy_inside_a_silent_copy_reports_once_and_closes() -> None:
    obj = [with_history(), FreshCopyInScope("warn"), with_history()]
    with deepcopy_shim.enabled("silent"):
        messages = warned(lambda: copy.deepcopy(obj))
    assert [m.tensors for m in messages] == [(obj[1].t,)]
    later = [with_history()]
    with deepcopy_shim.enabled("strict"), pytest.raises(NonLeafTensorError) as refused:
        copy.deepcopy(later)  # and no record of either copy is left to confuse this one
    assert refused.value.tensors == (later[0],)


# --- one memo for two top-level copies ----------------------------------------------------------


def test_one_memo_for_two_top_level_copies_reports_both() -> None:
    memo: Dict[Any, Any] = {}
    first, second = [with_history()], [with_history()]
    with deepcopy_shim.enabled("warn"):
        messages = warned(lambda: (copy.deepcopy(first, memo), copy.deepcopy(second, memo)))
    assert [m.tensors for m in messages] == [(first[0],), (second[0],)]
    memo = {}
    with deepcopy_shim.enabled("strict"):
        with pytest.raises(NonLeafTensorError):
            copy.deepcopy(first, memo)
        with pytest.raises(NonLeafTensorError) as refused:
            copy.deepcopy(second, memo)
    assert refused.value.tensors == (second[0],)


def test_a_memo_shared_with_an_earlier_copy_counts_what_it_already_holds() -> None:
    shared = with_history()
    memo: Dict[Any, Any] = {}
    with deepcopy_shim.enabled("silent"):
        copy.deepcopy([shared], memo)  # the memo now holds the copy of `shared`
    fresh = with_history()
    with deepcopy_shim.enabled("strict"), pytest.raises(NonLeafTensorError) as refused:
        copy.deepcopy([shared, fresh], memo)
    assert refused.value.tensors == (fresh,)  # `shared` is a memo hit: never met


# --- tasks -----------------------------------------------------------------------------------


def test_two_overlapping_calls_of_one_decorated_coroutine_in_two_tasks() -> None:
    @deepcopy_shim.enabled("silent")
    async def copy_later(delay: float) -> bool:
        await asyncio.sleep(delay)
        return bool(copy.deepcopy(with_history()).is_leaf)

    async def both() -> List[bool]:
        return list(await asyncio.gather(copy_later(0.03), copy_later(0.01)))

    assert asyncio.run(both()) == [True, True]


# --- paths -------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", [math.inf, -math.inf, math.nan])
def test_a_key_without_a_literal_spelling_is_said_so(key: float) -> None:
    obj = {key: with_history(), "ok": with_history()}
    found = deepcopy_shim.find_nonleaf_tensors(obj)
    assert [p for p, _ in found] == [
        "<under a key of this dict that has no literal spelling (float)>", "['ok']"]


def test_a_buffer_named_like_a_class_attribute_is_named_through_its_store() -> None:
    class Head(nn.Module):
        @property
        def head(self) -> str:
            return "a property of the class"

    model = Head()
    model._buffers["head"] = with_history()  # register_buffer refuses the name; a store does not
    ((path, tensor),) = deepcopy_shim.find_nonleaf_tensors(model)
    assert path == "_buffers['head']" and resolve(model, path) is tensor


# --- only torch's refusal is handled -----------------------------------------------------------


class Refuses(torch.Tensor):
    """A subclass whose __torch_function__ fails its own deepcopy with a RuntimeError, even one
    that says "graph leaves" as torch's refusal does: it is not torch's."""

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.Tensor.__deepcopy__:
            raise RuntimeError("this subclass's (graph leaves) rule: it cannot be copied")
        return super().__torch_function__(func, types, args, kwargs or {})


class Fails(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.Tensor.__deepcopy__:
            raise ValueError("custom failure")
        return super().__torch_function__(func, types, args, kwargs or {})


@pytest.mark.parametrize("mode", ["off", "warn", "strict", "silent"])
@pytest.mark.parametrize("cls", [Refuses, Fails])
def test_a_subclasss_own_error_passes_through_unchanged(cls: type, mode: str) -> None:
    t = with_history().as_subclass(cls)
    with pytest.raises(Exception) as native:
        copy.deepcopy(t)
    with deepcopy_shim.enabled(mode), pytest.raises(Exception) as shim:
        copy.deepcopy(t)
    assert type(shim.value) is type(native.value) and str(shim.value) == str(native.value)


# --- copyreg registrations are the copy's ------------------------------------------------------


class Registered(nn.Linear):
    pass


def _reduce_registered(module: Registered) -> Any:
    _reduce_registered.calls += 1  # type: ignore[attr-defined]
    return object.__reduce_ex__(module, 4)


def test_a_module_class_registered_with_copyreg_is_copied_through_its_reducer() -> None:
    copyreg.pickle(Registered, _reduce_registered)
    try:
        model = Registered(2, 2)
        model.out = model(torch.ones(1, 2))
        _reduce_registered.calls = 0  # type: ignore[attr-defined]
        leaf = Registered(2, 2)
        native = copy.deepcopy(leaf)
        assert _reduce_registered.calls == 1  # type: ignore[attr-defined]
        with deepcopy_shim.enabled("warn"):
            shimmed = copy.deepcopy(leaf)
            assert _reduce_registered.calls == 2  # type: ignore[attr-defined]
            (w,) = warned(lambda: copy.deepcopy(model))
        assert _reduce_registered.calls == 3 and w.paths == ("out",)  # type: ignore[attr-defined]
        GraphDiff(leaf, native, shimmed).check()
    finally:
        del copyreg.dispatch_table[Registered]


def test_a_strict_refusal_in_plain_python_ends_on_a_line_that_says_what_happened() -> None:
    """The last source line of a plain Python traceback of a strict refusal is the shim's raise,
    which reads as what happened (docs/faq.md quotes it)."""
    import subprocess
    import sys

    code = ("import copy, torch, deepcopy_shim\ndeepcopy_shim.enable('strict')\n"
            "copy.deepcopy({'t': torch.ones(2, requires_grad=True) * 2})\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    lines = proc.stderr.splitlines()
    error = next(i for i, line in enumerate(lines) if line.startswith("deepcopy_shim.NonLeafTensorError"))
    source = [line.strip() for line in lines[:error]
              if line.startswith("    ") and not set(line.strip()) <= {"^"}]
    quoted = "raise refused_in_mode_strict  # deepcopy_shim mode strict: the message below says what and how"
    assert source[-1] == quoted
    from pathlib import Path

    assert quoted in Path(__file__).resolve().parents[1].joinpath("docs", "faq.md").read_text()


_TRACEBACK_ROOTS = {
    "module": "root = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.ReLU()))\n"
              "root[1][0].cached = torch.ones(2, requires_grad=True) * 2",
    "dict": "root = {'t': torch.ones(2, requires_grad=True) * 2}",
    "reduced": "import collections\n"
               "root = collections.OrderedDict(m=nn.Linear(2, 2), t=torch.ones(2, requires_grad=True) * 2)",
    "leaf grad": "leaf = torch.ones(2, requires_grad=True)\n"
                 "leaf.grad = torch.ones(2, requires_grad=True) * 2\nroot = [leaf]",
}


@pytest.mark.parametrize("how", ["strict", "warn as error"])
@pytest.mark.parametrize("root", sorted(_TRACEBACK_ROOTS))
def test_no_line_of_the_shim_in_a_traceback_carries_a_comment_for_a_type_checker(
        root: str, how: str) -> None:
    """A plain Python traceback of a refusal (or of warn's warning raised as an error) shows each
    frame's source line: none of the shim's may show a `# type: ignore[...]` or another tool's
    comment, which means nothing to the reader."""
    import subprocess
    import sys

    mode, flags = ("strict", []) if how == "strict" else ("warn", ["-W", "error::UserWarning"])
    code = (f"import copy, torch, torch.nn as nn, deepcopy_shim\n{_TRACEBACK_ROOTS[root]}\n"
            f"deepcopy_shim.enable({mode!r})\ncopy.deepcopy(root)\n")
    proc = subprocess.run([sys.executable, *flags, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1 and "deepcopy_shim" in proc.stderr, proc.stderr
    lines = proc.stderr.splitlines()
    shim_lines = [lines[i + 1].strip() for i, line in enumerate(lines[:-1])
                  if line.strip().startswith('File "') and "deepcopy_shim" in line]
    assert shim_lines, proc.stderr  # frames of the shim's are shown: the check has something to check
    comments = [line for line in shim_lines if "type: ignore" in line or "noqa" in line
                or "pragma" in line]
    assert comments == [], proc.stderr
