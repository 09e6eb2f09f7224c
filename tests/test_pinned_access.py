"""How paths are spelled and found, pinned where mutation testing of `deepcopy_shim._access`
found them unpinned (issue 20): the way a path takes (the copy's own, else the shortest search),
the bounds of that search, every kind of member a path can step through, the spelling of each
step, and that finding a path only reads (no instance dict made on the source).

Every test goes through the public API: `find_nonleaf_tensors`, mode `warn`'s
`DetachedTensorsWarning.paths` and mode `strict`'s `NonLeafTensorError.paths`, which report the
same paths for the same object.
"""

from __future__ import annotations

import collections
import copy
import functools
import gc
import pathlib
import warnings
from typing import Any, Dict, List

import pytest
import torch
import torch.nn as nn
from support.models import resolve, with_history

import deepcopy_shim
from deepcopy_shim import DetachedTensorsWarning, NonLeafTensorError

pytestmark = pytest.mark.filterwarnings("default::deepcopy_shim.DeepcopyShimWarning")


def found(obj: Any) -> List[str]:
    """The paths `find_nonleaf_tensors(obj)` reports, checked against what modes warn and
    strict report for the same object (strict's as a set: a tensor a `__getstate__` makes
    anew is one tensor to the copy strict refused and another to its survey), and every
    spelled path checked to reach its tensor."""
    pairs = deepcopy_shim.find_nonleaf_tensors(obj)
    labels = [label for label, _ in pairs]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        deepcopy_shim.deepcopy(obj, "warn")
    reports = [w.message for w in caught if isinstance(w.message, DetachedTensorsWarning)]
    assert [list(w.paths) for w in reports] == ([labels] if labels else [])
    if labels:
        with pytest.raises(NonLeafTensorError) as refused:
            deepcopy_shim.deepcopy(obj, "strict")
        assert set(refused.value.paths) == set(labels)
    for label, tensor in pairs:
        if "<" not in label:
            assert resolve(obj, label) is tensor, label
    return labels


class Holder:
    """A plain object: the copy goes through its instance dict."""

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t


class NoLiteral:
    """A dict key with no literal spelling."""


def claims_to_be(claimed: type) -> type:
    """A class that says it equals `claimed` (its metaclass's `__eq__`): only an identity test
    tells the two apart."""

    class Claims(type):
        def __eq__(cls, other: Any) -> bool:
            return other is claimed

        __hash__ = type.__hash__

    return Claims(f"Claims{claimed.__name__.title()}", (), {})


class Shared:
    """Shared, not copied, by a copy (its `__deepcopy__` returns itself): the copy never goes
    through what it holds."""

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t

    def __deepcopy__(self, memo: Dict[int, Any]) -> Shared:
        return self


def rebuilt(way: str, **attributes: Any) -> Any:
    """An object holding `attributes` whose `__getstate__` returns only `{"x": <what `way`
    reaches from it>}`: the copy meets that object in a state dict no Python access reaches,
    so its path is found by the bounded search from the object."""

    class Rebuilt:
        def __getstate__(self) -> Dict[str, Any]:
            return {"x": resolve(self, way)}

    obj = Rebuilt()
    obj.__dict__.update(attributes)
    return obj


def nested(t: torch.Tensor, depth: int) -> Any:
    """`t` inside `depth` lists, one in another."""
    obj: Any = t
    for _ in range(depth):
        obj = [obj]
    return obj


# --- the way a path takes ------------------------------------------------------------------


def test_a_path_goes_the_copys_way_not_through_an_alias_the_copy_did_not_enter() -> None:
    """The tensor is reported under the object the copy went through (`a`), not under an
    earlier member that holds it too but that the copy did not enter (`shared`), whether the
    copied object is a dict (at the top or one level down), a plain object or a dict whose
    first value was located before."""
    t = with_history()
    assert found({"shared": Shared(t), "a": Holder(t)}) == ["['a'].t"]
    assert found({"x": {"shared": Shared(t), "a": Holder(t)}}) == ["['x']['a'].t"]
    root = Holder(with_history())
    root.shared = Shared(t)
    root.h = Holder(t)
    del root.t
    assert found(root) == ["h.t"]
    first = with_history()
    assert found({"first": first, "shared": Shared(t), "a": Holder(t)}) == ["['first']", "['a'].t"]


def test_a_path_goes_straight_to_the_furthest_object_one_step_reaches() -> None:
    """The copy went through a cache holding the tensor that is also an attribute: the path
    is that attribute, not the way through the cache."""
    root = Holder(with_history())
    root.cache = Holder(root.t)
    root.tensor = root.t
    del root.t
    assert found(root) == ["tensor"]


class FreshCopy:
    """Its `__deepcopy__` copies what it holds with a fresh memo: the copy meets those objects
    again, as new, after meeting them through the rest of the copied object."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __deepcopy__(self, memo: Dict[int, Any]) -> FreshCopy:
        return FreshCopy(copy.deepcopy(self.inner))


def test_an_object_the_copy_meets_again_keeps_the_path_it_was_first_found_at() -> None:
    """A tensor met a second time (under a fresh memo) is named once, where it was first met,
    not again from the objects around its second meeting."""
    inner = Holder(with_history())
    obj = {"a": {"first": inner}, "b": {"custom": FreshCopy(inner)}}
    assert found(obj) == ["['a']['first'].t"]


# --- the bounded search, where no one step leads on ------------------------------------------


def test_a_search_that_finds_the_way_on_is_continued_from_where_it_got_to() -> None:
    """No step of access leads from the rebuilt object to what the copy met next: the search
    finds the way, from however deep the rebuilt object sits, and the path goes on from there."""
    t = with_history()
    pair = (t, 1)
    assert found({"a": {"b": rebuilt("pair[0]", pair=pair)}}) == ["['a']['b'].pair[0]"]


class WholeState:
    """Its state is another object it holds (two steps away), given back whole."""

    def __init__(self, state: Any) -> None:
        self.holder = Holder(state)

    def __getstate__(self) -> Any:
        return self.holder.t

    def __setstate__(self, state: Any) -> None:
        self.holder = Holder(state)


@pytest.mark.parametrize(("state", "why"), [
    (lambda t: {t}, "a member of this set (sets have no index)"),
    (lambda t: {NoLiteral(): t}, "under a key of this dict that has no literal spelling (NoLiteral)"),
], ids=["set", "dict"])
def test_a_search_that_reaches_only_the_next_object_met_goes_on_from_it(state: Any, why: str) -> None:
    """The search from the rebuilt object reaches the container the copy met next, and nothing
    past it: the path goes on to that container and stops there, with the container's reason,
    not the rebuilt object's."""
    assert found({"o": WholeState(state(with_history()))}) == [f"['o'].holder.t <{why}>"]


def test_a_search_never_goes_back_to_an_object_already_passed() -> None:
    """What the search from a rebuilt object reaches by a back-reference (the dict that holds
    it, and what that dict's owners hold) is not where the path goes on: the path stops at the
    rebuilt object, with its reason, however deep it sits."""
    leaf = torch.ones(2, requires_grad=True)

    class Doubling:
        def __init__(self, owner: Dict[str, Any]) -> None:
            self.owner = owner
            self.x = leaf

        def __getstate__(self) -> Dict[str, Any]:
            return {"x": self.x * 2}

    why = "<rebuilt from what Doubling.__getstate__ returns>"
    root: Dict[str, Any] = {}
    root["a"] = {"d": Doubling(root)}
    assert found(root) == [f"['a']['d'] {why}"]
    innermost: Dict[str, Any] = {}
    innermost["d"] = Doubling(innermost)
    assert found({"a": {"b": {"c": innermost}}}) == [f"['a']['b']['c']['d'] {why}"]


@pytest.mark.parametrize(("depth", "expected"), [
    (5, ["['o'].deep[0][0][0][0][0]"]),
    (6, ["['o'] <rebuilt from what Rebuilt.__getstate__ returns>"]),
], ids=["six-steps", "seven-steps"])
def test_the_search_goes_six_steps_deep(depth: int, expected: List[str]) -> None:
    """The search from a rebuilt object reaches what lies six steps from it (`.deep` and five
    indices), and nothing further."""
    way = "deep" + "[0]" * depth
    assert found({"o": rebuilt(way, deep=nested(with_history(), depth))}) == expected


def _budgeted(lists: int) -> Any:
    # The search meets the object (1), `.big` and `.z` (3), then `.big`'s lists: 3 + `lists` seen
    # before it takes `.z`, whose member is the tensor.
    return {"o": rebuilt("z[0]", big=[[] for _ in range(lists)], z=[with_history()])}


def test_the_search_stops_after_meeting_twenty_thousand_objects() -> None:
    """The search takes another object while fewer than 20 000 are seen, and stops at 20 000
    or more (read from `find_nonleaf_tensors` alone: each search meets 20 000 objects)."""
    def paths(lists: int) -> List[str]:
        return [label for label, _ in deepcopy_shim.find_nonleaf_tensors(_budgeted(lists))]

    assert paths(20_000 - 4) == ["['o'].z[0]"]
    for lists in (20_000 - 3, 20_000 - 2):
        assert paths(lists) == ["['o'] <rebuilt from what Rebuilt.__getstate__ returns>"]


def _function() -> None:  # a member the search does not enter
    pass


def test_the_search_passes_what_it_cannot_enter_or_spell_and_takes_the_first_way() -> None:
    """The search steps past a number and does not enter a function, steps past a member
    under a key with no spelling, and among two names of one object keeps the first."""
    t = with_history()
    assert found({"o": rebuilt("box[0]", n=1, fn=_function, box=[t])}) == ["['o'].box[0]"]
    assert found({"o": rebuilt("d['k']", d={NoLiteral(): [], "k": t})}) == ["['o'].d['k']"]
    box = [t]
    assert found({"o": rebuilt("second[0]", first=box, second=box)}) == ["['o'].first[0]"]


# --- the members a path steps through, and how each step is spelled -------------------------


Point = collections.namedtuple("Point", "x y")


class WithWeakref:
    __slots__ = ("__weakref__", "a")

    def __init__(self, a: torch.Tensor) -> None:
        self.a = a


class WithEmptySlot:
    __slots__ = ("unset", "c")

    def __init__(self, c: torch.Tensor) -> None:
        self.c = c


# A class whose name is all underscores: Python does not mangle its private names, so its slot
# `__x` is `__x` (copyreg._slotnames, which the copy reads the slots by, knows that).
Underscores: Any = type("_", (), {"__slots__": ("__x", "y")})


class WithDictSlot:
    __slots__ = ("__dict__", "b")

    def __init__(self, b: torch.Tensor) -> None:
        self.b = b


def _hook(*args: Any) -> None:
    pass


def test_attributes_of_ordered_dicts_and_partials_named_tuple_fields_and_slots_are_steps() -> None:
    """An attribute of an OrderedDict or a partial (whose instance dict exists once asked for),
    a named tuple's field, a slot declared beside `__weakref__`, an empty slot or `__dict__`,
    and a leaf's `.grad` are each one step."""
    od: Any = collections.OrderedDict(k=1)
    od.extra = with_history()
    partial: Any = functools.partial(_hook)
    partial.note = with_history()
    leaf = torch.ones(2, requires_grad=True)
    (leaf * leaf).sum().backward(create_graph=True)  # its .grad has a history
    obj = {"od": od, "p": partial, "nt": Point(with_history(), 1), "w": WithWeakref(with_history()),
           "e": WithEmptySlot(with_history()), "d": WithDictSlot(with_history()), "leaf": leaf}
    assert found(obj) == [
        "['od'].extra", "['p'].note", "['nt'].x", "['w'].a", "['e'].c", "['d'].b", "['leaf'].grad",
    ]


def test_a_slot_that_cannot_be_named_does_not_hide_the_slots_after_it() -> None:
    """The slots after a private one of a class named `_` are steps."""
    obj = Underscores()
    obj.y = with_history()
    assert found({"o": obj}) == ["['o'].y"]


def test_a_private_slot_of_a_class_named_with_underscores_only_is_a_step() -> None:
    """Python does not mangle private names in a class whose name is only underscores: the
    slot `__x` of a class `_` is named `__x`."""
    obj = Underscores()
    setattr(obj, "__x", with_history())
    assert found({"o": obj}) == ["['o'].__x"]


class Name(str):
    """A str subclass: equal to, and hashed as, the plain str of its text."""

    def __repr__(self) -> str:
        return f"Name({str(self)!r})"


def test_attribute_keys_that_are_not_plain_str_are_spelled_by_what_they_are() -> None:
    """Keys of an instance dict that are not plain str take the uncached way to their step
    (a cache of steps holds plain str names only): a str subclass that is an identifier is
    `.u`, also after a plain str attribute `u` was spelled in the same copy, and an int put in
    `__dict__` is `__dict__[7]`; each path reaches its tensor (`found` resolves them).  That
    such keys are kept out of the cache is not observable here: it only keeps them alive."""
    first, second = Holder(with_history()), Holder(with_history())
    first.u = with_history()
    second.__dict__[Name("u")] = with_history()
    second.__dict__[7] = with_history()
    assert found([first, second]) == ["[0].t", "[0].u", "[1].t", "[1].u", "[1].__dict__[7]"]


def test_attribute_names_that_are_not_identifiers_are_spelled_as_dict_keys() -> None:
    """An instance attribute, or a submodule, whose name is not an identifier (`x y`) or is a
    keyword (`class`) is spelled through `__dict__` or `_modules`."""
    obj = Holder(with_history())
    setattr(obj, "x y", with_history())
    setattr(obj, "class", with_history())
    assert found(obj) == ["t", "__dict__['x y']", "__dict__['class']"]
    model = nn.Module()
    for name in ("x y", "class"):
        model.add_module(name, nn.Linear(1, 1))
        model._modules[name].out = with_history()
    assert found(model) == ["_modules['x y'].out", "_modules['class'].out"]


def test_container_modules_spell_only_their_own_members_by_index_or_key() -> None:
    """A Sequential's buffer and parameter, a ModuleList's buffer and parameter named like an
    index, a ModuleList's submodule not named like one, and a ModuleDict's parameter and buffer
    are attributes (or `_buffers[...]`, `_parameters[...]`), not the container's items."""
    seq = nn.Sequential(nn.Linear(1, 1))
    seq.register_buffer("running", with_history())
    seq._parameters["w"] = with_history()  # as reparametrizations put one there
    assert found(seq) == ["w", "running"]
    listed = nn.ModuleList([nn.Linear(1, 1)])
    listed.register_buffer("5", with_history())
    listed._parameters["7"] = with_history()
    listed.add_module("head", nn.Linear(1, 1))
    listed.head.out = with_history()
    assert found(listed) == ["_parameters['7']", "_buffers['5']", "head.out"]
    keyed = nn.ModuleDict({"lin": nn.Linear(1, 1)})
    keyed._parameters["w"] = with_history()  # as reparametrizations put one there
    keyed.register_buffer("b", with_history())
    assert found(keyed) == ["w", "b"]


# --- finding a path only reads --------------------------------------------------------------


def _dicts_held(obj: Any) -> int:
    # Read without asking for `__dict__` (which would make it): an instance dict made since is
    # one dict more among what `obj` holds.
    return sum(type(ref) is dict for ref in gc.get_referents(obj))


class Tagged(torch.Tensor):
    """A subclass with a slot, that torch can deep-copy."""

    __slots__ = ("tag",)

    def new_empty(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return super().new_empty(*args, **kwargs).as_subclass(Tagged)


def test_finding_paths_makes_no_instance_dict_on_the_source() -> None:
    """No tensor, OrderedDict or partial of the copied object gets an instance dict from
    having its paths found (native deepcopy makes none either), not even a tensor whose slot
    holds an object of a class that claims to equal `dict`."""
    tagged = with_history().as_subclass(Tagged)
    tagged.tag = claims_to_be(dict)()
    obj = {"t": with_history(), "tagged": tagged, "od": collections.OrderedDict(k=with_history()),
           "p": functools.partial(_hook, with_history()), "list": [with_history()]}
    watched = [obj["t"], tagged, obj["od"], obj["p"], obj["list"][0]]
    before = [_dicts_held(o) for o in watched]
    assert found(obj) == ["['t']", "['tagged']", "['od']['k']", "['p'].args[0]", "['list'][0]"]
    assert [_dicts_held(o) for o in watched] == before


def dict_unreadable(error: type) -> Any:
    """An object whose `__dict__` raises `error` when read (as a proxy's can)."""

    class DictUnreadable:
        @property  # type: ignore[misc]
        def __dict__(self) -> Dict[str, Any]:  # type: ignore[override]
            raise error("no __dict__ here")

    return DictUnreadable()


@pytest.mark.parametrize("error", [AttributeError, TypeError])
def test_an_object_whose_dict_cannot_be_read_is_searched_as_one_without_attributes(error: type) -> None:
    """The search passes an object whose `__dict__` raises AttributeError or TypeError and
    finds the way on."""
    obj = {"o": rebuilt("box[0]", opaque=dict_unreadable(error), box=[with_history()])}
    assert found(obj) == ["['o'].box[0]"]


class NoDictSlot:
    """No instance dict (only slots), but a class attribute named `__dict__` that must not run."""

    __slots__ = ("a",)

    @property  # type: ignore[misc]
    def __dict__(self) -> Dict[str, Any]:  # type: ignore[override]
        raise RuntimeError("__dict__ of an object without one was read")


def test_an_object_without_an_instance_dict_is_never_asked_for_one() -> None:
    """The search reads the slots of an object that has no instance dict, and never its
    `__dict__` (here a property that raises)."""
    slotted = NoDictSlot()
    slotted.a = [with_history()]
    assert found({"o": rebuilt("s.a[0]", s=slotted)}) == ["['o'].s.a[0]"]


def test_a_dict_key_is_spelled_only_where_its_literal_gives_back_an_equal_key() -> None:
    """Strings, numbers, bools, bytes, None and tuples of them are spelled as literals; a float
    that is not finite, a tuple holding one, a frozenset and a key whose class claims to equal
    `tuple` or `float` are not, and the path stops at the dict, saying under what key."""
    def no_literal(kind: str) -> str:
        return f"<under a key of this dict that has no literal spelling ({kind})>"

    keys: List[Any] = ["s", 7, True, b"b", None, 2.5, ("a", 1), ((1, None), b"c"), float("inf"),
                       float("nan"), ("a", float("-inf")), frozenset({1}), claims_to_be(tuple)(),
                       claims_to_be(float)()]
    obj = {key: with_history() for key in keys}
    assert found(obj) == [
        "['s']", "[7]", "[True]", "[b'b']", "[None]", "[2.5]", "[('a', 1)]", "[((1, None), b'c')]",
        no_literal("float"), no_literal("float"), no_literal("tuple"), no_literal("frozenset"),
        no_literal("ClaimsTuple"), no_literal("ClaimsFloat"),
    ]


def test_the_package_source_compiles_without_a_warning() -> None:
    """`python -W error` imports the package from source: no module's code draws a compile-time
    warning (a SyntaxWarning, such as `is` with a literal, is an error there)."""
    for source in sorted(pathlib.Path(deepcopy_shim.__file__).parent.glob("*.py")):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            compile(source.read_text(encoding="utf-8"), str(source), "exec")
