"""One copy: the shim's module copy makes the calls native deepcopy makes, in its order, with its memo.

In a mode the shim copies modules itself (`deepcopy_shim._module`), faster than
`copy._reconstruct`'s generic walk. That is only allowed where it is indistinguishable from the
walk: every `__deepcopy__`, `__reduce_ex__`, `__getstate__` and `__setstate__` of the objects
inside a module is called in the same order, and sees the same memo (its keys, in their order,
and what the memo keeps alive), as when native deepcopy copies the same module. Here objects that
record each such call, with the memo as it is at that moment, are put into random module trees
(with dicts keyed by other objects, OrderedDicts, sets, tuples, hooks, parametrizations, slots
and classes that define their own state), copied natively and by the shim (all tensors are
leaves, so both copy), and the two records are compared.
"""

from __future__ import annotations

import copy
import functools
import gc
import warnings
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.nn as nn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.graphdiff import GraphDiff

import deepcopy_shim

# What the recorders saw, in order: (what was called, on which recorder, the memo then).
LOG: List[Tuple[Any, ...]] = []
# The memo the copy under test was given (the recorders without a memo argument read it here),
# and a stable label for every object reachable from the copied object, by id.
MEMO: Dict[int, Any] = {}
LABELS: Dict[int, str] = {}


def _label(obj: Any) -> str:
    found = LABELS.get(id(obj))
    return found if found is not None else f"new {type(obj).__name__}"


def _key(key: Any) -> str:
    if key == id(MEMO):
        return "<the memo's keep-alive list>"
    if isinstance(key, int):
        found = LABELS.get(key)
        return found if found is not None else "<an object of the copy's own>"
    return repr(key)


def _memo_now(memo: Optional[Dict[Any, Any]] = None) -> Tuple[Any, ...]:
    memo = MEMO if memo is None else memo
    kept = memo.get(id(memo), [])
    return (tuple(_key(k) for k in memo), tuple(_label(x) for x in kept))


def _record(what: str, obj: Any, memo: Optional[Dict[Any, Any]] = None) -> None:
    LOG.append((what, obj.name, _memo_now(memo)))


class Recorder:
    """Copies itself in `__deepcopy__`, with the memo."""

    def __init__(self, name: str, **attributes: Any) -> None:
        self.name = name
        self.__dict__.update(attributes)

    def __deepcopy__(self, memo: Dict[Any, Any]) -> Recorder:
        _record("__deepcopy__", self, memo)
        new = Recorder.__new__(Recorder)
        memo[id(self)] = new
        new.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return new

    def hook(self, *args: Any) -> None:
        pass


class Reduces:
    """Copied through its own `__reduce_ex__`, rebuilt by `__setstate__`."""

    def __init__(self, name: str, **attributes: Any) -> None:
        self.name = name
        self.__dict__.update(attributes)

    def __reduce_ex__(self, protocol: Any) -> Any:
        _record("__reduce_ex__", self)
        return (Reduces.__new__, (Reduces,), dict(self.__dict__))

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)
        _record("__setstate__", self)


class KeepsState:
    """Copied through the default reduction, with its own `__getstate__` and `__setstate__`."""

    def __init__(self, name: str, **attributes: Any) -> None:
        self.name = name
        self.__dict__.update(attributes)

    def __getstate__(self) -> Dict[str, Any]:
        _record("__getstate__", self)
        return dict(self.__dict__)

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)
        _record("__setstate__", self)


class Slotted:
    """Slots, copied by the default reduction (no dict)."""

    __slots__ = ("name", "held")

    def __init__(self, name: str, held: Any = None) -> None:
        self.name, self.held = name, held


class Block(nn.Module):
    """A module of its own class, recording its `__setstate__`."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def __setstate__(self, state: Dict[str, Any]) -> None:
        LOG.append(("__setstate__", state.get("name"), _memo_now()))
        super().__setstate__(state)


class Stated(Block):
    """A module with its own `__getstate__`."""

    def __getstate__(self) -> Dict[str, Any]:
        _record("__getstate__", self)
        return dict(super().__getstate__())


class Double(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def _forward_hook(module: nn.Module, args: Any, output: Any) -> None:
    pass


# --- random module trees ---------------------------------------------------------------------

_VALUE_KINDS = ["recorder", "reduces", "state", "slotted", "keyed dict", "odict", "set", "atoms",
                "tuple", "list", "leaf", "nested"]


@st.composite
def _value(draw: st.DrawFn, names: List[str], depth: int = 0) -> Any:
    kind = draw(st.sampled_from(_VALUE_KINDS if depth < 2 else _VALUE_KINDS[:4]))
    name = f"v{len(names)}"
    names.append(name)

    def inner() -> Any:
        return draw(_value(names, depth + 1))

    if kind == "recorder":
        return Recorder(name)
    if kind == "reduces":
        return Reduces(name, inner=inner())
    if kind == "state":
        return KeepsState(name, inner=inner())
    if kind == "slotted":
        return Slotted(name, inner())
    if kind == "keyed dict":  # keys deepcopy copies (recorders), and atoms
        return {Recorder(f"{name}.key"): inner(), 3: inner(), (1, "a"): inner()}
    if kind == "odict":
        return OrderedDict([("a", inner()), (Recorder(f"{name}.key"), inner())])
    if kind == "set":
        return draw(st.sampled_from([set(), {1, 2}, frozenset({"a"})]))
    if kind == "atoms":
        return draw(st.sampled_from([1, "text", 2.5, None, True, b"x"]))
    if kind == "tuple":
        return draw(st.sampled_from([(1, 2), ("a", (1,)), (inner(),)]))
    if kind == "list":
        return [inner(), inner()]
    if kind == "leaf":
        return torch.randn(2, requires_grad=draw(st.booleans()))
    return {"nested": inner()}


@st.composite
def _module(draw: st.DrawFn, names: List[str], depth: int = 0) -> nn.Module:
    kind = draw(st.sampled_from(["linear", "block", "stated", "sequential", "moduledict"]
                                if depth < 2 else ["linear", "block"]))
    name = f"m{len(names)}"
    names.append(name)
    module: nn.Module
    if kind == "linear":
        module = nn.Linear(2, 2)
    elif kind in ("block", "stated"):
        module = (Block if kind == "block" else Stated)(name)
        for i in range(draw(st.integers(0, 3))):
            setattr(module, f"attr{i}", draw(_value(names)))
        for i in range(draw(st.integers(0, 2))):
            setattr(module, f"child{i}", draw(_module(names, depth + 1)))
    elif kind == "sequential":
        module = nn.Sequential(*[draw(_module(names, depth + 1))
                                 for _ in range(draw(st.integers(1, 3)))])
    else:
        module = nn.ModuleDict({f"k{i}": draw(_module(names, depth + 1))
                                for i in range(draw(st.integers(1, 2)))})
    extras = draw(st.sets(st.sampled_from(["forward hook", "partial hook", "pre hook", "buffer",
                                           "parametrization", "non-persistent"]), max_size=3))
    if "forward hook" in extras:
        module.register_forward_hook(_forward_hook)
    if "partial hook" in extras:
        module.register_forward_hook(functools.partial(Recorder(f"{name}.hook").hook, "named"))
    if "pre hook" in extras:
        module.register_forward_pre_hook(Recorder(f"{name}.pre").hook)
    if "buffer" in extras:
        module.register_buffer(f"buf_{len(names)}", torch.arange(3.0))
    if "non-persistent" in extras:
        module.register_buffer(f"np_{len(names)}", torch.zeros(1), persistent=False)
    if "parametrization" in extras and isinstance(module, nn.Linear):
        torch.nn.utils.parametrize.register_parametrization(module, "weight", Double())
    return module


def _labels(root: Any) -> Dict[int, str]:
    """A label for every object reachable from `root` (by GC references), in a fixed order."""
    labels: Dict[int, str] = {}
    pending = [root]
    while pending:
        obj = pending.pop()
        if id(obj) in labels or isinstance(obj, (type, type(_labels))):
            continue
        named = isinstance(obj, (Recorder, Reduces, KeepsState, Slotted, Block))
        name = getattr(obj, "name", None) if named else None
        suffix = f" {name}" if isinstance(name, str) else ""
        labels[id(obj)] = f"{type(obj).__name__} #{len(labels)}{suffix}"
        pending.extend(reversed(gc.get_referents(obj)))
    return labels


def _copy(root: Any, mode: Optional[str]) -> Tuple[Any, List[Tuple[Any, ...]]]:
    MEMO.clear()
    LOG.clear()
    if mode is None:
        made = copy.deepcopy(root, MEMO)
    else:
        with deepcopy_shim.enabled(mode), warnings.catch_warnings():
            warnings.simplefilter("error")  # all tensors are leaves: nothing to say
            made = copy.deepcopy(root, MEMO)
    memo_after = _memo_now()
    log = list(LOG)
    log.append(("after the copy", "", memo_after))
    MEMO.clear()
    return made, log


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), mode=st.sampled_from(["silent", "warn", "strict"]))
def test_a_module_copy_makes_the_calls_native_deepcopy_makes_in_its_order(data: st.DataObject,
                                                                           mode: str) -> None:
    names: List[str] = []
    root = data.draw(_module(names))
    LABELS.clear()
    LABELS.update(_labels(root))
    try:
        native, native_log = _copy(root, None)
        shim, shim_log = _copy(root, mode)
    finally:
        LABELS.clear()
    assert shim_log == native_log
    GraphDiff(root, native, shim).check()


def test_a_dict_attribute_has_its_value_copied_before_its_key() -> None:
    block = Block("root")
    block.table = {Recorder("key"): Recorder("value")}
    LABELS.clear()
    LABELS.update(_labels(block))
    try:
        _, native_log = _copy(block, None)
        _, shim_log = _copy(block, "silent")
    finally:
        LABELS.clear()
    assert [entry[:2] for entry in native_log[:2]] == [("__deepcopy__", "value"), ("__deepcopy__", "key")]
    assert shim_log == native_log
