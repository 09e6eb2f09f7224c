"""GraphDiff: is the shim's copy the copy native ``copy.deepcopy`` makes?

:class:`GraphDiff` walks three object graphs in step, the source, the native copy and the shim's
copy, and fails on the first difference: types, attribute names and order, non-tensor values,
tensor metadata and values, which tensors share storage, which objects are the same object
(ties, shared submodules, cycles, hooks bound to the copy), what is shared with the source, and
any storage shared with the source.  ``tests/test_fidelity.py`` plants each kind of difference
and checks that the differ reports it.

Where native deepcopy refuses the source (it holds tensors with autograd history), the reference
is the *detaching oracle* instead (:func:`detaching_deepcopy`, :func:`assert_same_as_oracle`).
"""

from __future__ import annotations

import copy
import functools
import types
import weakref
from typing import Any, Dict, List, Set, Tuple

import torch
import torch.nn as nn

import deepcopy_shim

_ATOMS = (type(None), bool, int, float, complex, str, bytes, type(Ellipsis), type(NotImplemented))
_TORCH_ATOMS = (torch.dtype, torch.device, torch.layout, torch.memory_format)
# deepcopy never copies these: the copy must hold the very same object.
_SHARED = (
    type, types.FunctionType, types.BuiltinFunctionType, types.ModuleType, types.CodeType,
    types.MethodWrapperType, types.WrapperDescriptorType, property, range,
)
_MISSING: Any = object()
CHANNELS_LAST = torch.channels_last


class Mismatch(AssertionError):
    """The shim's copy differs from the native copy; the message names the path."""


class GraphDiff:
    """Compare ``native`` and ``shim`` (two deep copies of ``source``) object by object.

    ``check()`` raises :class:`Mismatch` at the first difference, naming its path from the root.
    The source is walked alongside wherever its structure matches the native copy's, to check
    that the shim shares with it exactly what native deepcopy shares (functions, classes,
    atoms) and nothing else; every tensor storage reachable from the source is collected
    separately, and no tensor in the shim's copy may use one of them.
    """

    def __init__(self, source: Any, native: Any, shim: Any) -> None:
        self.source, self.native, self.shim = source, native, shim
        self.n2s: Dict[int, Any] = {}  # id(native object) -> the shim's object seen in its place
        self.s2n: Dict[int, Any] = {}
        self.storages: Dict[int, int] = {}  # native storage address -> shim storage address
        self.storages_back: Dict[int, int] = {}
        self.shim_storages: Set[int] = set()
        self.native_storages: Set[int] = set()
        self.compared_tensors = 0

    def check(self) -> None:
        self._visit(self.source, self.native, self.shim, "<root>")
        # Native deepcopy shares no storage with the source, except through a memo that hands
        # out aliases (pyro's detach): the shim's copy shares exactly what native's shares.
        source = _storages_reachable(self.source)
        shared = self.shim_storages & source
        if shared != self.native_storages & source:
            raise Mismatch(f"the shim's copy shares {len(shared)} storage(s) with the source, "
                           f"native's {len(self.native_storages & source)}")

    def _fail(self, path: str, what: str, native: Any, shim: Any) -> None:
        raise Mismatch(f"{path}: {what}: native {_short(native)} vs shim {_short(shim)}")

    def _visit(self, src: Any, nat: Any, shm: Any, path: str) -> None:
        # Identity structure: a native object met again must meet the same shim object again,
        # and two distinct native objects must never map to one shim object.
        seen = self.n2s.get(id(nat), _MISSING)
        if seen is not _MISSING:
            if seen is not shm:
                self._fail(path, "identity structure differs (tie, sharing or cycle)", nat, shm)
            return
        if id(shm) in self.s2n:
            self._fail(path, "shim reuses one object where native has two", nat, shm)
        self.n2s[id(nat)] = shm
        self.s2n[id(shm)] = nat
        if src is not _MISSING and (nat is src) != (shm is src):
            self._fail(path, "shared with the source in one copy only", nat is src, shm is src)
        if src is not _MISSING and nat is src:
            return  # kept by both copies (an atom, a function, a weakref): nothing copied inside
        if type(nat) is not type(shm) and not _same_dynamic_class(type(nat), type(shm)):
            self._fail(path, "type", type(nat), type(shm))
        if isinstance(nat, _ATOMS + _TORCH_ATOMS):
            if not (nat == shm or (nat != nat and shm != shm)):  # NaN equals NaN here
                self._fail(path, "value", nat, shm)
            return
        if isinstance(nat, _SHARED):
            if nat is not shm:
                self._fail(path, "object deepcopy never copies was copied", nat, shm)
            return
        if isinstance(nat, torch.Tensor):
            self._tensor(nat, shm, path)
        elif isinstance(nat, (set, frozenset)):
            if not all(_is_value(x) for x in nat):
                raise NotImplementedError(f"{path}: sets of objects are not compared")
            if nat != shm:
                self._fail(path, "set members", nat, shm)
            # The order a set iterates in depends on how its table was filled (deepcopy fills
            # a new one from the source's items in order): it is part of the copy too.
            if list(nat) != list(shm):
                self._fail(path, "set members' order", list(nat), list(shm))
            return
        nat_children, shm_children = _children(nat), _children(shm)
        nat_labels = [label for label, _ in nat_children]
        shm_labels = [label for label, _ in shm_children]
        if nat_labels != shm_labels:
            self._fail(path, "attributes/items (names and order)", nat_labels, shm_labels)
        src_children: Dict[str, Any] = {}
        if src is not _MISSING and type(src) is type(nat):
            src_children = dict(_children(src))
        for (label, n_child), (_, s_child) in zip(nat_children, shm_children):
            self._visit(src_children.get(label, _MISSING), n_child, s_child, path + label)

    def _tensor(self, nat: torch.Tensor, shm: torch.Tensor, path: str) -> None:
        self.compared_tensors += 1
        for attr in ("dtype", "device", "layout", "requires_grad", "is_leaf"):
            if getattr(nat, attr) != getattr(shm, attr):
                self._fail(path, attr, getattr(nat, attr), getattr(shm, attr))
        if shm.grad_fn is not None:
            self._fail(path, "grad_fn", nat.grad_fn, shm.grad_fn)
        if _uninitialized(nat):
            return  # no data, no shape yet
        for attr in ("shape", "stride", "storage_offset", "is_conj", "is_neg"):
            a, b = getattr(nat, attr), getattr(shm, attr)
            a, b = (a(), b()) if callable(a) else (a, b)
            if a != b:
                self._fail(path, attr, a, b)
        n_store, s_store = nat.untyped_storage(), shm.untyped_storage()
        if n_store.nbytes() and s_store.nbytes():
            n_ptr, s_ptr = n_store.data_ptr(), s_store.data_ptr()
            self.shim_storages.add(s_ptr)
            self.native_storages.add(n_ptr)
            if self.storages.setdefault(n_ptr, s_ptr) != s_ptr:
                self._fail(path, "aliasing: only native shares this storage", n_ptr, s_ptr)
            if self.storages_back.setdefault(s_ptr, n_ptr) != n_ptr:
                self._fail(path, "aliasing: only the shim shares this storage", n_ptr, s_ptr)
        if n_store.nbytes() != s_store.nbytes():
            self._fail(path, "storage size", n_store.nbytes(), s_store.nbytes())
        a, b = nat.detach(), shm.detach()
        if a.is_conj():
            a, b = a.resolve_conj(), b.resolve_conj()
        if a.is_neg():
            a, b = a.resolve_neg(), b.resolve_neg()
        same_nan = (a != a) & (b != b) if a.is_floating_point() or a.is_complex() else False
        if not bool(((a == b) | same_nan).all()):
            self._fail(path, "tensor values", nat, shm)


def _is_value(obj: Any) -> bool:
    """An atom or a tuple of such: compared by ``==``."""
    return isinstance(obj, _ATOMS) or (type(obj) is tuple and all(map(_is_value, obj)))


def _same_dynamic_class(a: type, b: type) -> bool:
    """Classes made per instance (``torch.fx.GraphModule`` makes one per copy) match by origin."""
    def origin(cls: type) -> Tuple[str, str, Tuple[type, ...]]:
        return cls.__qualname__, cls.__module__, cls.__bases__

    return "<locals>" in a.__qualname__ and origin(a) == origin(b)


def _children(obj: Any) -> List[Tuple[str, Any]]:
    """What deepcopy copies inside ``obj``, as ``(label, child)`` pairs in a stable order."""
    out: List[Tuple[str, Any]] = []
    if isinstance(obj, torch.Tensor):
        if obj.is_leaf and obj.grad is not None:
            out.append((".grad", obj.grad))
    if isinstance(obj, dict):
        for i, (key, value) in enumerate(obj.items()):
            label = repr(key) if isinstance(key, _ATOMS) else f"#{i}"
            out.append((f"<key {label}>", key))
            out.append((f"[{label}]", value))
    elif isinstance(obj, (list, tuple)):
        out.extend((f"[{i}]", item) for i, item in enumerate(obj))
    elif isinstance(obj, types.MethodType):
        out.extend([(".__func__", obj.__func__), (".__self__", obj.__self__)])
    elif isinstance(obj, functools.partial):
        out.extend([(".func", obj.func), (".args", obj.args), (".keywords", obj.keywords)])
    elif isinstance(obj, weakref.ref):
        out.append(("()", obj()))
    state = getattr(obj, "__dict__", None)
    if isinstance(state, dict) and not isinstance(obj, (type, types.FunctionType)):
        for i, (key, value) in enumerate(state.items()):
            if type(key) is not str:  # a key deepcopy copies (a str subclass) or keeps (an int)
                out.append((f"<attribute key #{i}>", key))
            out.append((f".{key}", value))
    for klass in type(obj).__mro__:
        slots = klass.__dict__.get("__slots__", ())
        for slot in (slots,) if isinstance(slots, str) else slots:
            if slot not in ("__dict__", "__weakref__") and hasattr(obj, slot):
                out.append((f".{slot}", getattr(obj, slot)))
    return out


def _storages_reachable(root: Any) -> Set[int]:
    found: Set[int] = set()
    seen: Set[int] = set()
    stack = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, _ATOMS + _TORCH_ATOMS + _SHARED):
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor) and not _uninitialized(obj):
            if obj.untyped_storage().nbytes():
                found.add(obj.untyped_storage().data_ptr())
        stack.extend(child for _, child in _children(obj))
    return found


def _uninitialized(tensor: torch.Tensor) -> bool:
    return isinstance(tensor, nn.parameter.UninitializedTensorMixin)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) < 120 else text[:117] + "..."


def native_and_shim(source: Any, mode: str = "silent") -> Tuple[Any, Any]:
    """A native deep copy of ``source`` and the shim's, made in ``mode``."""
    assert not deepcopy_shim.is_enabled()
    native = copy.deepcopy(source)
    with deepcopy_shim.enabled(mode):
        shim = copy.deepcopy(source)
    return native, shim


def assert_same_as_native(source: Any, mode: str = "silent") -> GraphDiff:
    """Copy ``source`` natively and with the shim; raise :class:`Mismatch` where they differ."""
    native, shim = native_and_shim(source, mode)
    diff = GraphDiff(source, native, shim)
    diff.check()
    return diff



def detaching_deepcopy(source: Any) -> Any:
    """The detaching oracle: native deepcopy of ``source``, where each tensor with history ``t``
    is copied as torch copies its detached alias ``t.detach()``, then given ``t.requires_grad``.

    This is what the shim must make in modes silent and warn.  The alias is copied through the
    copy's own memo, so tensors with history that view one storage still view one storage in the
    copy, as leaves do natively; a tensor sharing its storage with no other tensor is copied as
    ``t.detach().clone().requires_grad_(t.requires_grad)``.  ``Tensor.__deepcopy__`` is replaced
    by that stand-in for the duration of the copy, so the shim must be off.
    """
    assert not deepcopy_shim.is_enabled()
    original = vars(torch.Tensor)["__deepcopy__"]

    def detaching(self: torch.Tensor, memo: Dict[Any, Any]) -> torch.Tensor:
        if self.is_leaf:
            return original(self, memo)  # type: ignore[no-any-return]
        if id(self) in memo:
            return memo[id(self)]  # type: ignore[no-any-return]
        alias = self.detach()
        memo.setdefault(id(memo), []).append(alias)  # alive until the copy ends: its id stays its own
        made = original(alias, memo).requires_grad_(self.requires_grad)
        memo[id(self)] = made
        return made  # type: ignore[no-any-return]

    torch.Tensor.__deepcopy__ = detaching  # type: ignore[method-assign]
    try:
        return copy.deepcopy(source)
    finally:
        torch.Tensor.__deepcopy__ = original  # type: ignore[method-assign]


def assert_same_as_oracle(source: Any, mode: str = "silent") -> GraphDiff:
    """Copy ``source`` with the detaching oracle and with the shim; raise :class:`Mismatch` where
    they differ (its messages call the oracle's copy "native").  For sources native deepcopy
    refuses; where it copies, the oracle's copy is native's."""
    oracle = detaching_deepcopy(source)
    with deepcopy_shim.enabled(mode):
        shim = copy.deepcopy(source)
    diff = GraphDiff(source, oracle, shim)
    diff.check()
    return diff
