"""Spelling where an object sits inside the copied object, as Python access a user can paste.

A path is what follows the copied object in an expression: `head.last_out` (read as
`obj.head.last_out`), `[0].weight` (`obj[0].weight`), `cache['mid']`,
`_forward_hooks[3].func.__self__.outputs['block0']`; `''` is the object itself.  Paths are
found by identity, from an object already located to the next object the copy met, so every
path resolves to the very object it names.  They contain no memory address, so the same
object gives the same path on every run.  Where no step of Python access leads from a located
object to the next one the copy met (a state a `__getstate__` rebuilt around the same objects),
a short search from the last located object finds the way Python access does take; only where
none exists (a set member, a dict key, a value a custom `__deepcopy__` or reduction really
rebuilds) the path stops there and says why, once.

Finding a path only reads: no instance dict, attribute or cache appears on any object of the
source (an `OrderedDict` or `functools.partial` gets its instance dict only when first asked
for it, so it is never asked).
"""

from __future__ import annotations

import copyreg
import ctypes
import functools
import gc
import keyword
import math
import types
from collections import deque
from typing import Any, Deque, Dict, Iterator, List, NamedTuple, Optional, Set, Tuple

import torch

from ._names import class_name

__all__ = ["Entry", "Locator", "display", "existing_instance_dict"]

_Module = torch.nn.Module
_Tensor = torch.Tensor
_BY_POSITION = (torch.nn.Sequential,)  # __getitem__(i) is the i-th member, whatever its name
_BY_NAME_INDEX = {torch.nn.ModuleList: "_modules", torch.nn.ParameterList: "_parameters"}
_BY_KEY = {torch.nn.ModuleDict: "_modules", torch.nn.ParameterDict: "_parameters"}
_MODULE_STORES = ("_parameters", "_buffers", "_modules")
# Reductions that are nn.Module's or object's own: nothing custom to name as the reason.
_PLAIN_REDUCTIONS = {
    "__reduce_ex__": (object.__reduce_ex__,),
    "__reduce__": (object.__reduce__,),
    "__getstate__": tuple(
        f for f in (getattr(object, "__getstate__", None), getattr(_Module, "__getstate__", None)) if f
    ),
}


def display(path: str) -> str:
    """The path as shown and returned: without the leading dot of a first attribute step."""
    return path[1:] if path.startswith(".") else path


class Entry(NamedTuple):
    """One tensor a copy met, located: where it sits in the copied object."""

    tensor: torch.Tensor
    path: str
    """Python access from the copied object, raw (`.head.last_out`, `[0]`; see `display`)."""
    why: Optional[str]
    """None when `path` reaches the tensor; else why the rest of the way has no spelling."""

    @property
    def label(self) -> str:
        """The path as reported: `head.last_out`, or `hooks[0] <copied by X.__deepcopy__>`."""
        path = display(self.path)
        if self.why is None:
            return path
        return f"{path} <{self.why}>" if path else f"<{self.why}>"


class Locator:
    """The paths of the objects met during one copy, relative to its root.

    Every located object is kept alive by this locator, so that its `id()` stays its own for
    as long as the locator can be asked about it.
    """

    __slots__ = ("_located", "_stuck", "_tables", "_searched", "_reach", "_keys")

    def __init__(self, root: Any) -> None:
        # id(object) -> (object, its path, how many steps of access that path takes).
        self._located: Dict[int, Tuple[Any, str, int]] = {id(root): (root, "", 0)}
        # id(node) -> (path, why) for the nodes no Python access reaches (see locate): a node
        # below one of them is as far as that one.
        self._stuck: Dict[int, Tuple[str, str]] = {}
        # A parent searched once is scanned member by member, stopping at the child; a parent
        # searched again gets a table id(member) -> step, so that a parent with thousands of
        # members (a long Sequential, a dict of tensors) costs one scan in all.
        self._searched: Set[int] = set()
        self._tables: Dict[int, Dict[int, _Raw]] = {}
        # id(anchor) -> {id(object): (object, path from the anchor)}: what a bounded search
        # from an anchor reaches, made once per anchor the copy's own way could not leave.
        self._reach: Dict[int, Dict[int, Tuple[Any, str, int]]] = {}
        # id(mapping) -> the ids of its keys, for the mappings a path stops at: made once each.
        self._keys: Dict[int, Set[int]] = {}

    def locate(self, node: Tuple[Any, Any]) -> Tuple[str, Optional[str]]:
        """Locate `node[0]`, met by the copy through the objects of `node`'s parents (a node is
        `(object, parent node)`; the root's parent is None, and the root is located).

        Returns `(path, None)` when it is reachable by Python access, else `(path of the last
        object reached, why the rest of the way has no spelling)`.  The path starts from the
        located object just above on the copy's way, or one a few objects further up (an
        alias of the object, the list holding it), whichever reaches furthest down the way in
        one step, by the shortest path.  From each object reached, the step goes to the
        furthest object of the next few on the copy's way that one step of access reaches, so
        a path is as short as the copy's way allows: past the tuples and state dicts a
        reduction makes, past the `_modules` dict of a module to the submodule itself (`[0]`,
        not `._modules['0']`), and to `.tensor` rather than through a cache holding the same
        tensor.  Among the names one object has for the next, the first in its own order.
        Where no one step leads on (the copy went through containers a `__getstate__` built),
        a bounded search from the object reached finds the furthest of those objects that
        Python access reaches, by the shortest way.

        Each object is located once and tried from a bounded window of objects around it: the
        work grows with the objects the copy went through, not their square.
        """
        located = self._located
        stuck = self._stuck
        # The nodes from `node` up, to a few past the nearest located one.
        way: List[Tuple[Any, Any]] = []
        anchors: List[int] = []  # indices in `way` of the located nodes, nearest first
        link: Any = node
        while link is not None and (not anchors or len(way) - anchors[0] <= _LOOKAHEAD):
            obj = link[0]
            known = located.get(id(obj))
            if known is not None and known[0] is obj:
                if not way:
                    return known[1], None
                anchors.append(len(way))
            elif not anchors:
                failed = stuck.get(id(link))
                if failed is not None:  # below a node no access reaches: as far as that one
                    for passed in way:
                        stuck[id(passed)] = failed
                    return failed
            way.append(link)
            link = link[1]
        way.reverse()  # from the highest node down to `node`
        last = len(way) - 1
        nearest = last - anchors[0]
        # The first step: to the furthest object of the way one step of access reaches from a
        # located node, from the one whose path has the fewest steps.
        starts = sorted((located[id(way[at][0])][2], at) for at in (last - i for i in anchors))
        index = nearest + 1
        anchor, path, steps = located[id(way[nearest][0])]
        for ahead in range(last, nearest, -1):
            obj = way[ahead][0]
            for count, at in starts:
                if not at < ahead <= at + _LOOKAHEAD:
                    continue
                parent, parent_path, _ = located[id(way[at][0])]
                raw = self._raw_step(parent, obj)
                step = None if raw is None else _spell(parent, raw)
                if step is not None:
                    anchor, path, steps = obj, parent_path + step, count + 1
                    located[id(obj)] = (obj, path, steps)
                    index = ahead + 1
                    break
            if index != nearest + 1:
                break
        while index <= last:
            window = min(last, index + _LOOKAHEAD)
            for ahead in range(window, index - 1, -1):
                obj = way[ahead][0]
                known = located.get(id(obj))
                if known is not None and known[0] is obj:
                    _, reached, steps = known
                    break
                step = self._spelled_step(anchor, obj)
                if step is not None:
                    reached, steps = path + step, steps + 1
                    located[id(obj)] = (obj, reached, steps)
                    break
            else:
                reach = self._reachable(anchor)
                for ahead in range(window, index - 1, -1):
                    obj = way[ahead][0]
                    found = reach.get(id(obj))
                    if found is not None and found[0] is obj:
                        reached, steps = path + found[1], steps + found[2]
                        located[id(obj)] = (obj, reached, steps)
                        break
                else:
                    failed = (path, self._why(anchor, way[index][0]))
                    for passed in way[index:]:
                        stuck[id(passed)] = failed
                    return failed
            anchor, path, index = way[ahead][0], reached, ahead + 1
        return path, None

    def _raw_step(self, parent: Any, child: Any) -> Optional[_Raw]:
        """One step of Python access from `parent` to `child`, not yet spelled; None if none."""
        # A parent searched twice has a table (see _step).
        table = self._tables.get(id(parent))
        return table.get(id(child)) if table is not None else self._step(parent, child)

    def _spelled_step(self, parent: Any, child: Any) -> Optional[str]:
        """One step of Python access from `parent` to `child`, spelled; None if there is none."""
        raw = self._raw_step(parent, child)
        return None if raw is None else _spell(parent, raw)

    def _reachable(self, anchor: Any) -> Dict[int, Tuple[Any, str, int]]:
        """Objects a breadth-first walk of Python access from `anchor` reaches, with the
        shortest spelled way there (the first in each object's own order among equals) and
        its number of steps.

        Bounded (`_SEARCH_DEPTH` steps, `_SEARCH_BUDGET` objects): the search only has to
        cross the few containers a reduction rebuilt, not the whole model.
        """
        key = id(anchor)
        reach = self._reach.get(key)
        if reach is not None:
            return reach
        reach = {}
        queue: Deque[Tuple[Any, str, int]] = deque([(anchor, "", 0)])
        seen = {key}
        while queue and len(seen) < _SEARCH_BUDGET:
            parent, way, depth = queue.popleft()
            if depth >= _SEARCH_DEPTH or not _searchable(parent):
                continue
            for member, raw in _members(parent):
                if id(member) in seen or type(member) in _ATOMS:
                    continue
                step = _spell(parent, raw)
                if step is None:
                    continue
                seen.add(id(member))
                reach[id(member)] = (member, way + step, depth + 1)
                queue.append((member, way + step, depth + 1))
        self._reach[key] = reach
        return reach

    def _step(self, parent: Any, child: Any) -> Optional[_Raw]:
        key = id(parent)
        table = self._tables.get(key)
        if table is None:
            if key not in self._searched:
                self._searched.add(key)
                # Attributes first, in a plain loop: where a copy most often finds a cached
                # tensor, without making a step for every member on the way.
                state = existing_instance_dict(parent)
                if state is not None:
                    for name, value in state.items():
                        if value is child:
                            return (_FIELD, name)
                # The other members, gathered as they are scanned: a search that goes through
                # them all without finding the child leaves the parent's table made.
                others: List[Tuple[Any, _Raw]] = []
                for member, raw in _members(parent, with_attributes=False):
                    if member is child:
                        return raw
                    others.append((member, raw))
                # The first way to a member wins, attributes before the rest, as in _members.
                table = {}
                if state is not None:
                    for name, value in state.items():
                        table.setdefault(id(value), (_FIELD, name))
                for member, raw in others:
                    table.setdefault(id(member), raw)
                self._tables[key] = table
                return None
            table = {}
            for member, raw in _members(parent):
                table.setdefault(id(member), raw)
            self._tables[key] = table
        return table.get(id(child))


    def _why(self, anchor: Any, unreached: Any) -> str:
        """Why no Python access leads from `anchor` to `unreached`, the next object the copy
        met.  A mapping's keys and items are looked up in tables made once per mapping, so
        naming every value of a dict keyed by objects without a literal (the forward-hook idiom
        `activations[module] = output`) reads the dict a bounded number of times in all."""
        kind = type(anchor)
        name = class_name(kind)
        if isinstance(anchor, (set, frozenset)):
            return f"a member of this {name} (sets have no index)"
        if isinstance(anchor, dict):
            keys = self._keys.get(id(anchor))
            if keys is None:
                keys = self._keys[id(anchor)] = {id(key) for key in anchor}
            if id(unreached) in keys:
                return f"a key of this {name}"
            raw = self._raw_step(anchor, unreached)
            if raw is not None and raw[0] == _ITEM:
                return f"under a key of this {name} that has no literal spelling ({class_name(type(raw[1]))})"
        custom = getattr(kind, "__deepcopy__", None)
        if custom is not None:
            return f"copied by {name}.__deepcopy__"
        if kind in copyreg.dispatch_table:
            return f"rebuilt by the copyreg reducer for {name}"
        for method, plain in _PLAIN_REDUCTIONS.items():
            found = getattr(kind, method, None)
            if found is not None and found not in plain and not isinstance(anchor, (list, dict, tuple)):
                return f"rebuilt from what {name}.{method} returns"
        return f"not reachable by attribute or item access from this {name}"

# A step before it is spelled: (kind, name or key or index[, store, position]).  Spelling every
# member of every parent searched would cost more than the search; only steps taken are spelled.
_Raw = Tuple[Any, ...]
# _FIELD: an entry of the instance dict, read as an attribute unless the class shadows it.
_ATTR, _ITEM, _INDEX, _MEMBER, _FIELD = range(5)
_ATOMS = (type(None), bool, int, float, complex, str, bytes)
# The bounded search of Locator._reachable: deep enough for the containers a __getstate__
# builds around a class's own objects, small enough to cost nothing beside the copy.
_SEARCH_DEPTH = 6
_SEARCH_BUDGET = 20_000
# How many objects ahead on the copy's way one step of access is tried (Locator.locate): a
# reduction puts a few containers (its state dict, a tuple, a module's `_modules`) between an
# object and the next one access reaches from it.
_LOOKAHEAD = 8


def existing_instance_dict(obj: Any) -> Optional[Dict[str, Any]]:
    """`obj`'s instance dict if it has one already, without making one; else None.

    Asking for `__dict__` makes an empty one on the spot for objects whose dict slot is filled
    on demand (an `OrderedDict`, a `functools.partial`, a tensor), which native deepcopy never
    does to them; reading the slot itself, or finding the dict among the object's references,
    leaves them as they are.  Never runs a proxy's or module's `__getattr__`.
    """
    cls = type(obj)
    offset = cls.__dictoffset__
    if offset == 0:
        return None
    if offset > 0:
        # A C-level `PyObject *` at that offset: NULL until the dict is first asked for.
        if not ctypes.c_void_p.from_address(id(obj) + offset).value:
            return None
    elif isinstance(obj, _Tensor):
        # A tensor's dict lives past its C struct; if made, it is among its GC referents.
        referents = gc.get_referents(obj)
        if not referents:
            return _hidden_tensor_dict(obj)
        if not any(type(ref) is dict for ref in referents):
            return None
    # Otherwise a Python class's own dict, which always exists (native deepcopy's reduction
    # asks for it too).
    try:
        state = object.__getattribute__(obj, "__dict__")
    except (AttributeError, TypeError):
        return None
    return state if isinstance(state, dict) else None



def _hidden_tensor_dict(tensor: _Tensor) -> Optional[Dict[str, Any]]:
    """The instance dict of a tensor that shows the GC none of its references.

    torch before 2.10 hides every reference of a tensor that C++ also holds (an autograd graph
    saved it for backward, it retains its grad), its type and dict included.  Python 3.11's
    `object.__getstate__` reads the dict without making one (None when there is none or it is
    empty); before 3.11 the dict is read as torch's own deepcopy reads it, which makes an empty
    one where there was none.
    """
    if _OBJECT_GETSTATE is None:
        state = object.__getattribute__(tensor, "__dict__")
    else:
        state = _OBJECT_GETSTATE(tensor)
        if isinstance(state, tuple):  # (dict, slots) of a subclass with slots
            state = state[0]
    return state if isinstance(state, dict) else None


_OBJECT_GETSTATE: Any = getattr(object, "__getstate__", None)  # Python 3.11 and later


def _searchable(obj: Any) -> bool:
    # Classes, functions and Python modules lead everywhere (globals, subclasses): a path
    # through them would be no path a user means.
    return not isinstance(obj, (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType))


def _members(obj: Any, with_attributes: bool = True) -> Iterator[Tuple[Any, _Raw]]:
    """Every object one step of Python access away from `obj`, with that step (raw)."""
    state = existing_instance_dict(obj)
    if with_attributes and state is not None:
        for name, value in state.items():
            yield value, (_FIELD, name)
    if isinstance(obj, _Module):
        for store in _MODULE_STORES:
            members = state.get(store) if state is not None else None
            if isinstance(members, dict):
                for position, (name, member) in enumerate(members.items()):
                    yield member, (_MEMBER, name, store, position)
    elif isinstance(obj, _Tensor):
        # .grad of a non-leaf is only read when retained, which also keeps torch from warning.
        if obj.is_leaf or obj.retains_grad:
            grad = obj.grad
            if grad is not None:
                yield grad, (_ATTR, "grad")
    elif isinstance(obj, dict):
        for key, value in obj.items():
            yield value, (_ITEM, key)
    elif isinstance(obj, tuple) and isinstance(fields := getattr(type(obj), "_fields", None), tuple):
        for name, value in zip(fields, obj):  # a namedtuple's fields
            yield value, (_ATTR, name)
    elif isinstance(obj, (list, tuple)):
        for index, value in enumerate(obj):
            yield value, (_INDEX, index)
    elif isinstance(obj, types.MethodType):
        yield obj.__self__, (_ATTR, "__self__")
        yield obj.__func__, (_ATTR, "__func__")
    elif isinstance(obj, functools.partial):
        yield obj.func, (_ATTR, "func")
        yield obj.args, (_ATTR, "args")
        yield obj.keywords, (_ATTR, "keywords")
    for klass in type(obj).__mro__:
        slots = klass.__dict__.get("__slots__", ())
        for slot in (slots,) if isinstance(slots, str) else slots:
            if slot in ("__dict__", "__weakref__"):
                continue
            if slot.startswith("__") and not slot.endswith("__"):  # private: name-mangled
                # as Python mangles it: not at all in a class whose name is only underscores
                stripped = klass.__name__.lstrip("_")
                slot = f"_{stripped}{slot}" if stripped else slot
            descriptor = klass.__dict__.get(slot)
            if descriptor is None:
                continue
            try:
                value = descriptor.__get__(obj, klass)
            except AttributeError:  # an empty slot
                continue
            yield value, (_ATTR, slot)


def _spell(parent: Any, raw: _Raw) -> Optional[str]:
    """The step as Python source, or None when it has none (a key without a literal)."""
    kind = raw[0]
    if kind == _FIELD:
        name = raw[1]
        if type(name) is str and _data_descriptor(type(parent), name):
            # A data descriptor of the class (a property) wins over the instance dict: `.name`
            # would read the property, not the object.
            return f".__dict__[{name!r}]"
        return _attribute_step(name)
    if kind == _ATTR:
        return _attribute_step(raw[1])
    if kind == _ITEM:
        return f"[{raw[1]!r}]" if _has_literal(raw[1]) else None
    if kind == _INDEX:
        return f"[{raw[1]}]"
    _, name, store, position = raw
    if store == "_modules" and isinstance(parent, _BY_POSITION):
        return f"[{position}]"
    if any(isinstance(parent, c) and s == store for c, s in _BY_NAME_INDEX.items()) and (
            isinstance(name, str) and name.isdigit()):
        return f"[{int(name)}]"
    if any(isinstance(parent, c) and s == store for c, s in _BY_KEY.items()):
        return f"[{name!r}]"
    if _is_identifier(name) and not _shadowed(type(parent), name):
        return f".{name}"
    return f".{store}[{name!r}]"


def _is_identifier(name: Any) -> bool:
    return isinstance(name, str) and name.isidentifier() and not keyword.iskeyword(name)


def _shadowed(cls: type, name: str) -> bool:
    # A class attribute (a property, a method) of that name wins over nn.Module.__getattr__.
    return any(name in klass.__dict__ for klass in cls.__mro__)


def _data_descriptor(cls: type, name: str) -> bool:
    """True if attribute lookup on an instance of `cls` finds `name` in the class first: a class
    attribute with `__set__` or `__delete__` (a property, a slot) wins over the instance dict."""
    for klass in cls.__mro__:
        attribute = klass.__dict__.get(name, _ABSENT)
        if attribute is not _ABSENT:
            kind = type(attribute)
            return hasattr(kind, "__set__") or hasattr(kind, "__delete__")
    return False


_ABSENT = object()


def _attribute_step(name: Any) -> str:
    # Attribute names repeat across a model (every block's `.weight`, `.last_out`): a plain
    # str's step is spelled once.  Any other key (a str subclass, an int put in `__dict__`)
    # is spelled each time: a cache would compare it with its own __eq__ and keep it alive.
    if type(name) is str:
        return _attribute_step_of_str(name)
    return _spell_attribute(name)


def _spell_attribute(name: Any) -> str:
    if _is_identifier(name):
        return f".{name}"
    return f".__dict__[{name!r}]"


_attribute_step_of_str = functools.lru_cache(maxsize=4096)(_spell_attribute)


def _has_literal(key: Any) -> bool:
    """True if `repr(key)` is a literal that evaluates to an equal key."""
    kind = type(key)
    if kind in (str, int, bool, bytes, type(None)):
        return True
    if kind is float:
        return math.isfinite(key)
    if kind is tuple:
        return all(_has_literal(item) for item in key)
    return False
