"""The module copier's behaviours that a mutation run of ``_module`` found unpinned (issue 20).

Each test copies a model with the shim (``copy.deepcopy`` in mode silent, or another mode) and
natively (the shim off), and compares the two object graphs with ``support.graphdiff``: the
shim's shortcuts must make exactly what native deepcopy makes, for every value a module's state
can hold.  The survivors that no input can tell apart from the code as written are in
``tools/mutation-equivalents/_module.toml``.
"""

from __future__ import annotations

import copy
import copyreg
import gc
import types
import warnings
import weakref
from collections import OrderedDict
from typing import Any, ClassVar, Dict, List

import pytest
import torch
import torch.nn as nn
from support.graphdiff import GraphDiff, native_and_shim
from support.loose import EqualsEveryClass, EqualsEverything, SuppliesTagged
from support.models import Name, reshuffled_set, with_history

import deepcopy_shim
from deepcopy_shim import _protocol

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning:torch")


def same_as_native(source: Any, mode: str = "silent") -> Any:
    """The shim's copy of ``source``, after checking it is the graph native deepcopy makes."""
    native, shim = native_and_shim(source, mode)
    GraphDiff(source, native, shim).check()
    return shim


class LooseSet(set, metaclass=EqualsEveryClass):  # type: ignore[type-arg]
    """A set subclass of a class that compares equal to set, dict, OrderedDict, tuple..."""


class _ParameterEqualsEveryClass(type(nn.Parameter)):  # type: ignore[misc]
    def __eq__(cls, other: object) -> bool:
        return isinstance(other, type)

    __hash__ = type.__hash__


class LooseParameter(nn.Parameter, metaclass=_ParameterEqualsEveryClass):
    """A Parameter subclass with its own __deepcopy__, of a class that compares equal to
    nn.Parameter: deepcopy calls the subclass's, never Parameter's."""

    def __deepcopy__(self, memo: Dict[int, Any]) -> Any:
        made = super().__deepcopy__(memo)
        made.own_deepcopy = True
        return made


# --- sets and hook dicts met twice: one copy, found in the memo ---------------------------


def _hook(module: nn.Module, args: Any, output: Any) -> None:
    pass


def test_a_set_of_atoms_shared_by_two_attributes_and_two_modules_stays_one_set() -> None:
    """A non-empty set of atoms met again (another attribute, another module) is the copy
    memoised the first time, as natively."""
    names = {"a", "b"}
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    model[0].names = model[0].again = model[1].names = names
    copied = same_as_native(model)
    assert copied[0].names is copied[0].again is copied[1].names
    assert copied[0].names == names and copied[0].names is not names


@pytest.mark.parametrize("where", ["an attribute", "_non_persistent_buffers_set"])
def test_a_set_of_atoms_iterates_in_the_order_native_deepcopy_makes(where: str) -> None:
    """deepcopy reduces a set to `set(list(items))`: a new table filled in the source's order,
    not a copy of the source's table.  The copy iterates as native's does (the differ compares
    the order of set members too)."""
    model = nn.Linear(2, 2)
    names = reshuffled_set()
    if where == "an attribute":
        model.names = names
    else:
        model._non_persistent_buffers_set = names
    copied = same_as_native(model)
    made = copied.names if where == "an attribute" else copied._non_persistent_buffers_set
    assert list(made) == list(set(list(names))) != list(names)


def test_a_hook_dict_of_functions_shared_by_two_modules_stays_one_dict() -> None:
    """A non-empty hook dict of functions met again (two modules holding the same one) is the
    copy memoised the first time, as natively."""
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    model[0].register_forward_hook(_hook)
    model[1]._forward_hooks = model[0]._forward_hooks
    copied = same_as_native(model)
    assert copied[1]._forward_hooks is copied[0]._forward_hooks
    assert list(copied[0]._forward_hooks.values()) == [_hook]


# --- classes that compare equal to the types the shortcuts are for ------------------------


def test_a_set_subclass_equal_to_set_is_copied_by_its_own_reduction() -> None:
    """Only an exact set takes the set shortcuts (empty, or of atoms): a subclass whose class
    compares equal to set is copied by its reduction, keeping its type and instance state."""
    model = nn.Linear(2, 2)
    model.tags = LooseSet({"a", "b"})
    model.tags.note = "kept"  # type: ignore[attr-defined]
    model.none_yet = LooseSet()
    copied = same_as_native(model)
    assert type(copied.tags) is LooseSet and copied.tags.note == "kept"
    assert type(copied.none_yet) is LooseSet


def test_a_parameter_subclass_equal_to_parameter_keeps_its_own_deepcopy() -> None:
    """Only an exact nn.Parameter is copied by calling Parameter.__deepcopy__ directly: a
    subclass whose class compares equal to Parameter gets its own __deepcopy__."""
    model = nn.Linear(2, 2)
    model.weight = LooseParameter(model.weight.detach().clone())
    copied = same_as_native(model)
    assert type(copied.weight) is LooseParameter and copied.weight.own_deepcopy


# --- what the state's containers are copied with ------------------------------------------


def test_containers_of_a_modules_state_met_before_the_module_are_the_copies_made_then() -> None:
    """A module's _parameters, _buffers, _modules, hook dict and buffer-name set copied before
    the module (earlier in the same copy) are found in the memo: the copied module holds the
    very copies made then, as natively."""
    model = nn.Sequential(nn.BatchNorm1d(2))
    inner = model[0]
    inner.register_forward_hook(_hook)
    inner.register_buffer("scratch", torch.zeros(1), persistent=False)
    first = [inner._parameters, inner._buffers, inner._modules, model._modules,
             inner._forward_hooks, inner._forward_pre_hooks, inner._non_persistent_buffers_set]
    copied = same_as_native([first, model])
    made = copied[1][0]
    assert copied[0] == [made._parameters, made._buffers, made._modules, copied[1]._modules,
                         made._forward_hooks, made._forward_pre_hooks,
                         made._non_persistent_buffers_set]
    assert all(a is b for a, b in zip(copied[0], [made._parameters, made._buffers, made._modules,
                                                  copied[1]._modules, made._forward_hooks,
                                                  made._forward_pre_hooks,
                                                  made._non_persistent_buffers_set]))


def supplied() -> torch.Tensor:
    tensor = with_history()
    tensor.supplied = True  # type: ignore[attr-defined]
    return tensor


def test_a_memo_subclass_is_asked_for_buffers_and_dicts_in_the_survey_of_a_refusal() -> None:
    """A strict refusal names what the copy met: its survey asks the copy's memo (of the
    copy's memo class) for a module's buffers and the items of its dicts as deepcopy asks it,
    so the tensors the memo supplies are not named."""
    model = nn.Linear(2, 2)
    model.register_buffer("computed", supplied())
    model.cache = {"hidden": supplied()}
    model.out = with_history()
    with deepcopy_shim.enabled("strict"), pytest.raises(deepcopy_shim.NonLeafTensorError) as info:
        copy.deepcopy(model, SuppliesTagged())
    assert info.value.paths == ("out",) and info.value.tensors == (model.out,)


class NotesItsProtocol(nn.Linear):
    """Reduces itself as object does, noting the pickle protocol it was asked for."""

    def __reduce_ex__(self, protocol: Any) -> Any:
        rv = super().__reduce_ex__(protocol)
        state = dict(rv[2])
        state["protocol"] = protocol
        return (rv[0], rv[1], state, None, None)


def test_a_module_is_reduced_with_protocol_4_as_deepcopy_reduces_it() -> None:
    copied = same_as_native(NotesItsProtocol(2, 2))
    assert copied.protocol == 4


class _StateHidingMeta(type):
    """A metaclass whose classes have no `__getstate__` as class attributes (the property
    raises AttributeError); their instances still find nn.Module's, which is all deepcopy asks."""

    @property
    def __getstate__(cls) -> Any:
        raise AttributeError("__getstate__")


class HidesItsGetstate(nn.Linear, metaclass=_StateHidingMeta):
    pass


def test_a_class_whose_getstate_is_hidden_from_class_lookup_copies_as_natively() -> None:
    copied = same_as_native(HidesItsGetstate(2, 2))
    assert type(copied) is HidesItsGetstate


# --- Parameter.__deepcopy__ as torch has it now ---------------------------------------------


@pytest.mark.parametrize("metaclass", [type, EqualsEveryClass])
def test_a_parameter_deepcopy_that_is_no_plain_function_is_called_as_deepcopy_calls_it(
    monkeypatch: pytest.MonkeyPatch, metaclass: type,
) -> None:
    """A Parameter.__deepcopy__ that is not a function (a callable object: deepcopy calls it
    with the memo alone), even one of a class that compares equal to the function class, is
    left to deepcopy."""
    seen: List[int] = []

    class Copier(metaclass=metaclass):
        def __call__(self, memo: Dict[int, Any]) -> Any:
            seen.append(len(memo))
            return None  # what deepcopy then puts in the parameter's place

    monkeypatch.setattr(nn.Parameter, "__deepcopy__", Copier())
    model = nn.Linear(2, 2)
    copied = same_as_native(model)
    assert copied.weight is None and copied.bias is None and len(seen) == 4


def test_a_deepcopy_dispatch_entry_for_parameter_is_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    """A copier registered for nn.Parameter in copy's dispatch table replaces Parameter's own
    __deepcopy__, for the shim as natively."""
    seen: List[int] = []

    def copy_parameter(value: nn.Parameter, memo: Dict[int, Any]) -> Any:
        seen.append(id(value))
        made = nn.Parameter(value.data.clone(), value.requires_grad)
        made.via_dispatch = True
        memo[id(value)] = made
        return made

    monkeypatch.setitem(copy._deepcopy_dispatch, nn.Parameter, copy_parameter)  # type: ignore[attr-defined]
    model = nn.Linear(2, 2)
    copied = same_as_native(model)
    assert copied.weight.via_dispatch and copied.bias.via_dispatch and len(seen) == 4


# --- what the module's own lookup and reduction say ---------------------------------------


class _EqualToEverything(EqualsEverything):
    """A callable that compares equal to every object (as ``unittest.mock.ANY`` does), used as
    a class's ``__getattr__``: it answers ``__deepcopy__`` with a copier of its own."""

    def __call__(self, *args: Any) -> Any:
        if args[-1] == "__deepcopy__":
            return _forwarded_copier
        raise AttributeError(args[-1])


def _forwarded_copier(memo: Dict[int, Any]) -> str:
    return "forwarded"


class _LooseCopier:
    """A forwarded copier whose ``__func__`` (as a bound method has one) compares equal to
    every function, the shim's copier included."""

    __func__ = _EqualToEverything()

    def __call__(self, memo: Dict[int, Any]) -> str:
        return "forwarded"


class AnswersEverything(nn.Module):
    __getattr__ = _EqualToEverything()


class AnswersWithALooseCopier(nn.Module):
    def __getattr__(self, name: str) -> Any:
        if name == "__deepcopy__":
            return _LooseCopier()
        return super().__getattr__(name)


@pytest.mark.parametrize("cls", [AnswersEverything, AnswersWithALooseCopier])
def test_a_deepcopy_forwarded_by_getattr_is_used_unless_it_is_the_shims(cls: type) -> None:
    """Only nn.Module's own __getattr__ is known to have no __deepcopy__: another, even one
    that compares equal to it, is asked; and what it answers is used, as natively, unless it
    is the shim's own copier (whatever the answer's __func__ compares equal to)."""
    native, shim = native_and_shim(cls())
    assert native == shim == "forwarded"


def _reduces_to(module: nn.Module, rv: Any) -> nn.Module:
    """``module``, reduced (by deepcopy, natively as with the shim) to ``rv``."""
    module.__reduce_ex__ = lambda protocol: rv  # type: ignore[attr-defined]
    return module


_NEWOBJ = copyreg.__newobj__  # type: ignore[attr-defined]


class LooseLinear(nn.Linear, metaclass=EqualsEveryClass):
    """A Linear of a class that compares equal to every class."""


def test_a_reduction_naming_another_class_is_rebuilt_as_that_class() -> None:
    """A module whose reduction (here its own instance's __reduce_ex__) names another class
    than its own is rebuilt by copy's reconstruction, as that class, even when that class
    compares equal to the module's."""
    module = nn.Linear(2, 2)
    state = dict(vars(module))
    copied = same_as_native(_reduces_to(module, (_NEWOBJ, (LooseLinear,), state, None, None)))
    assert type(copied) is LooseLinear


class _LooseReducer(EqualsEverything):
    """A class's ``__reduce__`` that compares equal to object's (and to everything) but is
    not it: it reduces its class's one instance as object does, to the state dict it holds."""

    def __init__(self) -> None:
        self.state: Dict[str, Any] = {}

    def __call__(self) -> Any:
        return (copyreg.__newobj__, (ReducesLoosely,), self.state, None, None)  # type: ignore[attr-defined]


class ReducesLoosely(nn.Linear):
    __reduce__ = _LooseReducer()


def test_a_class_with_its_own_reduce_is_rebuilt_by_copys_reconstruction() -> None:
    """A class whose __reduce__ is its own (even one comparing equal to object's) is rebuilt
    by copy's reconstruction, which asks the memo for the reduction's state dict: a state the
    memo already answers is the state the copy gets, as natively."""
    module = ReducesLoosely(2, 2)
    state = ReducesLoosely.__reduce__.state = dict(vars(module))  # type: ignore[attr-defined]
    answered = dict(state, note="answered by the memo")
    native = copy.deepcopy(module, {id(state): answered})
    with deepcopy_shim.enabled("silent"):
        shim = copy.deepcopy(module, {id(state): answered})
    GraphDiff(module, native, shim).check()
    assert shim.note == "answered by the memo"


# --- a memo that answers for the state's containers --------------------------------------


class Answers(dict):  # type: ignore[type-arg]
    """A memo subclass whose ``get`` answers prepared copies for some objects' ids (deepcopy
    asks a memo with ``get``; the answer is the copy, whatever it is)."""

    def __init__(self, answers: Dict[int, Any]) -> None:
        super().__init__()
        self.answers = answers

    def get(self, key: Any, default: Any = None) -> Any:
        if key in self.answers:
            return self.answers[key]
        return super().get(key, default)


class LooseAnswers(Answers, metaclass=EqualsEveryClass):
    """Answers, of a class that compares equal to dict (identity tells them apart)."""


def _answered(model: nn.Sequential) -> Dict[str, Any]:
    """What of ``model`` (two Linears) the tests below have a memo answer for, by a name: each
    shortcut of a state's copy (empty hook dict, empty set, empty dict, set of atoms, hook dict
    of functions, dict of items, the parameters' dict) in the first layer's state, and a
    parameter in the second's."""
    first, second = model[0], model[1]
    first.register_forward_hook(_hook)
    first.names = {"a", "b"}
    first.table = {"row": 1}
    found = {name: getattr(first, name) for name in
             ("_forward_pre_hooks", "_non_persistent_buffers_set", "_buffers", "names",
              "_forward_hooks", "table", "_parameters")}
    found["weight"] = second.weight
    return found


def _answer_of(model: nn.Sequential, name: str) -> Any:
    return model[1].weight if name == "weight" else getattr(model[0], name)


@pytest.mark.parametrize("answer", ["an ordered dict", "an empty list"])
@pytest.mark.parametrize("memo_kind", [dict, Answers, LooseAnswers])
def test_a_memo_that_already_answers_for_a_container_gives_the_copy_that_answer(
    memo_kind: type, answer: str,
) -> None:
    """What the memo answers for a container of the state or a parameter (by ``get``, or an
    entry of a plain dict) is its copy, whatever it is (an empty list too, which equals no
    sentinel), as natively; a memo subclass is asked by its get, even one of a class that
    compares equal to dict."""
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    answered = _answered(model)

    def memo() -> Any:
        answers = {id(value): ([] if answer == "an empty list" else OrderedDict(name=name))
                   for name, value in answered.items()}
        return dict(answers) if memo_kind is dict else memo_kind(answers)

    native = copy.deepcopy(model, memo())
    with deepcopy_shim.enabled("silent"):
        shim = copy.deepcopy(model, memo())
    GraphDiff(model, native, shim).check()
    for name in answered:
        assert _answer_of(shim, name) == ([] if answer == "an empty list" else {"name": name})


class RegistersOnAsking(dict):  # type: ignore[type-arg]
    """A memo subclass whose ``get``, asked about one object's id, registers a forward hook on
    a module: code the copy runs (deepcopy asks the memo for every object) that changes a hook
    dict the copy has not reached yet."""

    def __init__(self, trigger: Any, module: nn.Module) -> None:
        super().__init__()
        self.trigger, self.module = id(trigger), module

    def get(self, key: Any, default: Any = None) -> Any:
        if key == self.trigger and not self.module._forward_hooks:
            self.module.register_forward_hook(_hook)
        return super().get(key, default)


def test_a_hook_dict_a_memos_get_fills_during_the_copy_is_copied_as_it_is_then() -> None:
    """Native deepcopy asks the memo for each container in turn; a memo whose get registers a
    hook when asked about _backward_hooks (before _forward_hooks in the state) makes the
    native copy's _forward_hooks hold that hook."""
    source = nn.Linear(2, 2)
    native = copy.deepcopy(source, RegistersOnAsking(source._backward_hooks, source))
    assert list(native._forward_hooks.values()) == [_hook]
    source = nn.Linear(2, 2)
    with deepcopy_shim.enabled("silent"):
        shim = copy.deepcopy(source, RegistersOnAsking(source._backward_hooks, source))
    assert list(shim._forward_hooks.values()) == [_hook]


class Truthless:
    """An object whose truth value cannot be asked (as a tensor of two elements)."""

    def __bool__(self) -> bool:
        raise AssertionError("native deepcopy never asks a state value's truth")


@pytest.mark.parametrize("value", [torch.ones(2), Truthless()],
                         ids=["a tensor of two elements", "an object without a truth value"])
@pytest.mark.parametrize("name", ["_backward_pre_hooks", "_forward_hooks"])
def test_what_a_hook_dicts_name_holds_instead_is_never_asked_its_truth(name: str, value: Any) -> None:
    """A module whose hook dict attribute holds something else is copied as natively: the
    check that its hook dicts are empty asks no value its truth (a tensor of two elements has
    none), so the copy neither fails nor runs a `__bool__` native deepcopy does not run."""
    model = nn.Linear(2, 2)
    setattr(model, name, value)
    copied = same_as_native(model)
    assert type(getattr(copied, name)) is type(value)
    assert type(copied._forward_pre_hooks) is OrderedDict and not copied._forward_pre_hooks


# --- more of the reduction's fields, and keys ------------------------------------------------


class MadeWithArguments(nn.Linear):
    """A module class whose instances are made from __getnewargs__'s arguments: its reduction
    is `copyreg.__newobj__` with (cls, *arguments), and each instance notes what __new__ got."""

    made: ClassVar[List[Any]] = []

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        MadeWithArguments.made.append(args)
        return super().__new__(cls)

    def __getnewargs__(self) -> Any:
        return ("for the copy",)


def test_a_module_made_from_getnewargs_is_made_with_them() -> None:
    """A reduction whose __newobj__ arguments are more than the class is rebuilt by copy's
    reconstruction, which passes them to __new__, as natively."""
    MadeWithArguments.made = []
    module = MadeWithArguments(2, 2)
    same_as_native(module)
    assert MadeWithArguments.made == [(2, 2), ("for the copy",), ("for the copy",)]


def test_keys_of_a_modules_dicts_that_are_no_atoms_are_copied() -> None:
    """The keys of _parameters, _buffers and other dicts of a module's state are deep-copied
    unless deepcopy keeps them (atoms): a str subclass key is copied, as natively."""
    model = nn.Linear(2, 2)
    model._parameters[Name("extra")] = nn.Parameter(torch.ones(1))
    model._buffers[Name("kept")] = torch.zeros(1)
    model.table = {Name("row"): 1, "plain": 2}
    copied = same_as_native(model)
    for made, source in [(copied._parameters, model._parameters), (copied._buffers, model._buffers),
                         (copied.table, model.table)]:
        key = next(k for k in made if type(k) is Name)
        assert key not in [k for k in source if k is key]


@pytest.mark.parametrize("value", ["an atom", "a list", "an empty hook dict"])
def test_keys_of_a_modules_own_dict_that_are_no_atoms_are_copied(value: str) -> None:
    """A module's instance dict is deep-copied key by key too: an attribute whose name is a
    str subclass (setattr keeps it as the key) gets a copy of that name, made before its
    value, in its place among the attributes; an int key is kept, as natively."""
    model = nn.Linear(2, 2)
    name = Name("odd")
    name.note = ["the key's own state"]  # type: ignore[attr-defined]
    setattr(model, name, {"an atom": 1, "a list": [2], "an empty hook dict": OrderedDict()}[value])
    vars(model)[3] = "three"
    model.after = [4]
    copied = same_as_native(model)  # the differ compares the keys that are not plain str
    made = next(k for k in vars(copied) if type(k) is Name)
    assert made is not name and made == name and made.note == name.note  # type: ignore[attr-defined]
    assert made.note is not name.note  # type: ignore[attr-defined]
    assert list(vars(copied)) == list(vars(model))


def test_a_copyreg_registration_for_ordered_dict_is_honoured_for_a_hook_dict_of_functions() -> None:
    """A hook dict holding hooks (plain functions) is copied through OrderedDict's copyreg
    registration when there is one, as natively."""
    def reduce_ordered_dict(od: Any) -> Any:
        return (OrderedDict, (), {"via_copyreg": True}, None, iter(od.items()))

    model = nn.Linear(2, 2)
    model.register_forward_hook(_hook)
    copyreg.pickle(OrderedDict, reduce_ordered_dict)
    try:
        copied = same_as_native(model)
    finally:
        del copyreg.dispatch_table[OrderedDict]
    assert copied._forward_hooks.via_copyreg and list(copied._forward_hooks.values()) == [_hook]


def test_a_deepcopy_dispatch_entry_for_ordered_dict_is_honoured_for_a_hook_dict_of_functions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A hook dict holding hooks (plain functions) is copied by OrderedDict's entry in copy's
    dispatch table when there is one, as natively."""
    def copy_odict(value: Any, memo: Dict[int, Any]) -> Any:
        made: Any = OrderedDict((k, copy.deepcopy(v, memo)) for k, v in value.items())
        made.via_dispatch = True
        memo[id(value)] = made
        return made

    model = nn.Linear(2, 2)
    model.register_forward_hook(_hook)
    monkeypatch.setitem(copy._deepcopy_dispatch, OrderedDict, copy_odict)  # type: ignore[attr-defined]
    copied = same_as_native(model)
    assert copied._forward_hooks.via_dispatch and list(copied._forward_hooks.values()) == [_hook]


@pytest.mark.parametrize("memo_kind", [dict, Answers])
def test_a_memo_that_answers_for_a_tuple_of_atoms_gives_the_copy_that_answer(memo_kind: type) -> None:
    """deepcopy asks the memo first for every object, a tuple of atoms too: what the memo
    answers for a module's tuple is the copy's, as natively."""
    model = nn.LayerNorm(3)
    answers = {id(model.normalized_shape): (4,)}
    native = copy.deepcopy(model, memo_kind(answers))
    with deepcopy_shim.enabled("silent"):
        shim = copy.deepcopy(model, memo_kind(answers))
    assert native.normalized_shape == (4,)
    assert shim.normalized_shape == (4,)


class RefusesToForward(nn.Module):
    """A module whose __getattr__ refuses __deepcopy__ (raises AttributeError) and forwards
    nothing else."""

    def __init__(self) -> None:
        super().__init__()
        self.out = with_history()

    def __getattr__(self, name: str) -> Any:
        if name == "__deepcopy__":
            raise AttributeError(name)
        return super().__getattr__(name)


def test_a_module_whose_getattr_refuses_deepcopy_is_copied_detached_with_nothing_to_look_up() -> None:
    """Where a class's __getattr__ answers nothing for __deepcopy__ (raises AttributeError), an
    instance has no __deepcopy__ under the shim either (nothing is added to nn.Module), and
    copy.deepcopy copies it, detached."""
    module = RefusesToForward()
    with deepcopy_shim.enabled("silent"):
        assert not hasattr(module, "__deepcopy__")
        copied = copy.deepcopy(module)
    assert type(copied) is RefusesToForward and copied.out.is_leaf
    assert torch.equal(copied.out, module.out.detach())


# --- more reductions a module's own instance gives (an instance attribute __reduce_ex__) ---


class LooseReduction(tuple, metaclass=EqualsEveryClass):  # type: ignore[type-arg]
    """A reduction tuple of a class that compares equal to tuple, whose item 2 read by index
    is another state than the one its iteration (what copy._reconstruct unpacks) gives."""

    def __getitem__(self, index: Any) -> Any:
        if index == 2:
            return {"training": True, "read_by_index": True}
        return super().__getitem__(index)


class LooseState(dict, metaclass=EqualsEveryClass):  # type: ignore[type-arg]
    """A state dict of a class that compares equal to dict, with a __deepcopy__ of its own that
    leaves out the key "cache"."""

    def __deepcopy__(self, memo: Dict[int, Any]) -> Any:
        return {key: copy.deepcopy(value, memo) for key, value in self.items() if key != "cache"}


def test_a_reduction_of_a_tuple_subclass_is_rebuilt_from_what_it_unpacks_to() -> None:
    """Only an exact tuple is a plain reduction: another (even of a class equal to tuple) is
    rebuilt by copy's reconstruction, from what it unpacks to, as natively."""
    module = nn.Linear(2, 2)
    state = dict(vars(module))
    copied = same_as_native(_reduces_to(module, LooseReduction((_NEWOBJ, (nn.Linear,), state, None, None))))
    assert not hasattr(copied, "read_by_index") and copied.in_features == 2


def test_a_reductions_state_of_a_dict_subclass_is_copied_by_its_own_deepcopy() -> None:
    """Only an exact dict is a plain reduction's state: another (even of a class equal to
    dict) is copied by deepcopy, with its own __deepcopy__, as natively."""
    module = nn.Linear(2, 2)
    module.cache = [1]
    state = LooseState(vars(module))
    copied = same_as_native(_reduces_to(module, (_NEWOBJ, (nn.Linear,), state, None, None)))
    assert not hasattr(copied, "cache")


@pytest.mark.parametrize("container", [nn.ModuleList, nn.ModuleDict])
def test_a_reductions_list_or_dict_items_are_set_on_the_copy(container: type) -> None:
    """A reduction with list items (its fourth field) or dict items (its fifth) is rebuilt by
    copy's reconstruction, which appends or sets each item on the copy (here a ModuleList or
    ModuleDict), as natively."""
    layer = nn.Linear(2, 2)

    def source() -> nn.Module:  # a fresh one for each copy: the items' iterator is used up
        module = container()
        state = dict(vars(module))
        if container is nn.ModuleList:
            return _reduces_to(module, (_NEWOBJ, (container,), state, iter([layer]), None))
        return _reduces_to(module, (_NEWOBJ, (container,), state, None, iter([("extra", layer)])))

    native = copy.deepcopy(source())
    with deepcopy_shim.enabled("silent"):
        shim = copy.deepcopy(source())
    assert len(native) == len(shim) == 1
    made = next(iter(shim.values() if container is nn.ModuleDict else shim))
    assert type(made) is nn.Linear and made is not layer


class _LooseGetstate(EqualsEverything):
    """A class's ``__getstate__`` that compares equal to nn.Module's (and to everything) but is
    not it: it gives the state dict it holds."""

    def __init__(self) -> None:
        self.state: Dict[str, Any] = {}

    def __call__(self) -> Any:
        return self.state


class GetsItsStateLoosely(nn.Linear):
    __getstate__ = _LooseGetstate()


def _gets_the_state_the_memo_answers(module: nn.Module, holder: Any) -> None:
    """`holder` (the class's own protocol function) gives `module`'s state as a dict it holds;
    a memo that already answers for that dict gives the copy its answer, natively and with the
    shim alike (copy's reconstruction asks the memo for the state)."""
    state = holder.state = dict(vars(module))
    answered = dict(state, note="answered by the memo")
    native = copy.deepcopy(module, {id(state): answered})
    with deepcopy_shim.enabled("silent"):
        shim = copy.deepcopy(module, {id(state): answered})
    GraphDiff(module, native, shim).check()
    assert shim.note == "answered by the memo"


def test_a_class_with_its_own_getstate_is_rebuilt_by_copys_reconstruction() -> None:
    """A class whose __getstate__ is its own (even one comparing equal to nn.Module's) is
    rebuilt by copy's reconstruction, which asks the memo for the state dict: a state the memo
    already answers is the state the copy gets, as natively."""
    _gets_the_state_the_memo_answers(GetsItsStateLoosely(2, 2), GetsItsStateLoosely.__getstate__)


class _LooseFunctionCopier(EqualsEverything):
    """A copier for functions in copy's dispatch table that compares equal to every object
    (deepcopy's own atomic copier too), noting each function it copies."""

    def __init__(self) -> None:
        self.seen: List[Any] = []

    def __call__(self, value: Any, memo: Dict[int, Any]) -> Any:
        self.seen.append(value)
        return value


def test_a_dispatch_entry_equal_to_deepcopys_atomic_copier_is_still_called(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A hook dict's hooks are copied by the entry copy's dispatch table has for their type,
    unless it is deepcopy's own atomic copier: one that only compares equal to it is called."""
    copier = _LooseFunctionCopier()
    monkeypatch.setitem(copy._deepcopy_dispatch, types.FunctionType, copier)  # type: ignore[attr-defined]
    model = nn.Linear(2, 2)
    model.register_forward_hook(_hook)
    same_as_native(model)
    assert copier.seen == [_hook, _hook]


class _LooseReduceEx(EqualsEverything):
    """A class's ``__reduce_ex__`` that compares equal to object's (and to everything) but is
    not it: it reduces its class's one instance as object does, to the state dict it holds."""

    def __init__(self) -> None:
        self.state: Dict[str, Any] = {}

    def __call__(self, protocol: int) -> Any:
        return (_NEWOBJ, (ReducesExLoosely,), self.state, None, None)


class ReducesExLoosely(nn.Linear):
    __reduce_ex__ = _LooseReduceEx()


def test_a_class_with_its_own_reduce_ex_is_rebuilt_by_copys_reconstruction() -> None:
    """A class whose __reduce_ex__ is its own (even one comparing equal to object's) is
    rebuilt by copy's reconstruction, which asks the memo for the state dict: a state the memo
    already answers is the state the copy gets, as natively."""
    _gets_the_state_the_memo_answers(ReducesExLoosely(2, 2), ReducesExLoosely.__reduce_ex__)


class _LooseConstructor(EqualsEverything):
    """A reduction's callable that compares equal to every object (copyreg.__newobj__ too) but
    is not it: it makes the instance as __newobj__ does, and marks it."""

    def __call__(self, cls: type) -> Any:
        made = cls.__new__(cls)  # type: ignore[call-overload]
        object.__setattr__(made, "made_by", "the reduction's callable")
        return made


def test_a_reduction_is_rebuilt_with_its_own_callable() -> None:
    """Only copyreg.__newobj__ is known to make the instance as cls.__new__(cls) does: another
    reduction's callable (even one equal to it) is called, as natively."""
    module = nn.Linear(2, 2)
    state = dict(vars(module))
    copied = same_as_native(_reduces_to(module, (_LooseConstructor(), (nn.Linear,), state, None, None)))
    assert copied.made_by == "the reduction's callable"


def test_a_reduction_of_six_items_fails_as_natively() -> None:
    """A reduction with a sixth item (pickle's state setter) is one copy._reconstruct does not
    take: the shim's copy fails with native deepcopy's error."""
    def source() -> nn.Module:
        module = nn.Linear(2, 2)
        return _reduces_to(module, (_NEWOBJ, (nn.Linear,), dict(vars(module)), None, None, None))

    with pytest.raises(TypeError) as native:
        copy.deepcopy(source())
    with deepcopy_shim.enabled("silent"), pytest.raises(TypeError) as shim:
        copy.deepcopy(source())
    assert str(shim.value) == str(native.value)


class _LooseMixin(metaclass=EqualsEveryClass):
    """A mixin of a class that compares equal to every class (nn.Module too), with a
    __deepcopy__ of its own."""

    def __deepcopy__(self, memo: Dict[int, Any]) -> Any:
        return "the mixin's copy"


class MixesInLoosely(nn.Linear, _LooseMixin):
    """Its class (of the mixin's metaclass) compares equal to nn.Module too."""


def test_a_mixin_after_nn_module_of_a_class_equal_to_every_class_keeps_its_deepcopy() -> None:
    """A __deepcopy__ of a mixin after nn.Module in the MRO is the one deepcopy uses, whatever
    the classes compare equal to, as natively."""
    native, shim = native_and_shim(MixesInLoosely(2, 2))
    assert native == shim == "the mixin's copy"


class _EqualToModuleWhenSaidSo(type):
    """A metaclass under which a class that says so (``equal_to_module``) compares equal to
    nn.Module (a class registry keyed loosely)."""

    def __eq__(cls, other: object) -> bool:
        return cls is other or (other is nn.Module and cls.__dict__.get("equal_to_module", False))

    __hash__ = type.__hash__


class _ModuleLikeMixin(metaclass=_EqualToModuleWhenSaidSo):
    equal_to_module = True

    def __deepcopy__(self, memo: Dict[int, Any]) -> Any:
        return "the mixin's copy"


class MixesInAModuleLikeMixin(nn.Linear, _ModuleLikeMixin):
    pass


def test_a_mixin_after_nn_module_equal_to_it_keeps_its_deepcopy() -> None:
    """A __deepcopy__ of a mixin after nn.Module in the MRO (the last class before object) is
    the one deepcopy uses, even when the mixin's class compares equal to nn.Module, as
    natively."""
    native, shim = native_and_shim(MixesInAModuleLikeMixin(2, 2))
    assert native == shim == "the mixin's copy"


def test_a_reduction_of_three_items_is_rebuilt_as_natively() -> None:
    """A reduction of three items (no list or dict items) is rebuilt by copy's
    reconstruction, as natively."""
    module = nn.Linear(2, 2)
    copied = same_as_native(_reduces_to(module, (_NEWOBJ, (nn.Linear,), dict(vars(module)))))
    assert type(copied) is nn.Linear


def test_a_reduction_without_arguments_fails_as_natively() -> None:
    """A __newobj__ reduction without its class among the arguments fails, with native
    deepcopy's error."""
    def source() -> nn.Module:
        module = nn.Linear(2, 2)
        return _reduces_to(module, (_NEWOBJ, (), dict(vars(module)), None, None))

    with pytest.raises(TypeError) as native:
        copy.deepcopy(source())
    with deepcopy_shim.enabled("silent"), pytest.raises(TypeError) as shim:
        copy.deepcopy(source())
    assert str(shim.value) == str(native.value)


class OddArguments(tuple):  # type: ignore[type-arg]
    """Reduction arguments whose last item read by index (-1) is nn.Linear, whatever they
    hold: iteration (what the reduction's callable is called with) gives what they hold."""

    def __getitem__(self, index: Any) -> Any:
        return nn.Linear if index == -1 else super().__getitem__(index)


def test_a_reduction_is_rebuilt_from_the_class_its_arguments_hold() -> None:
    """A reduction whose first argument is not the module's class is rebuilt by copy's
    reconstruction, as the class its arguments hold, as natively."""
    module = nn.Linear(2, 2)
    copied = same_as_native(_reduces_to(
        module, (_NEWOBJ, OddArguments((nn.Identity,)), dict(vars(module)), None, None)))
    assert type(copied) is nn.Identity


class FailsToCopy:
    def __deepcopy__(self, memo: Dict[int, Any]) -> Any:
        raise ValueError("cannot be copied")


def _fail_to_copy(module: nn.Module) -> None:
    try:
        copy.deepcopy(module)
    except ValueError as exc:
        assert str(exc) == "cannot be copied"
    else:  # pragma: no cover - the copy always fails
        raise AssertionError("the copy did not fail")


@pytest.mark.parametrize("mode", ["warn", "silent"])
def test_a_module_copy_that_fails_keeps_nothing_alive(mode: str) -> None:
    """A copy whose root module fails after meeting a tensor with history (in a global mode,
    whose scope does not end with the copy) keeps nothing of it alive once the error is gone,
    as natively; the copy after it reports its own tensors only."""
    deepcopy_shim.enable(mode)
    failing = nn.Linear(2, 2)
    failing.out = with_history()
    failing.blocker = FailsToCopy()
    _fail_to_copy(failing)
    gone = weakref.ref(failing)
    del failing
    gc.collect()
    assert gone() is None
    later = nn.Linear(2, 2)
    later.cached = with_history()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        copy.deepcopy(later)
    paths = [w.message.paths for w in caught
             if isinstance(w.message, deepcopy_shim.DetachedTensorsWarning)]
    assert paths == ([("cached",)] if mode == "warn" else [])


# --- submodules: every way deepcopy finds (or does not find) a copier, as natively --------


class _CountsDeepcopyLookups:
    """Counts, per class, the lookups of `__deepcopy__` on its instances (its own attribute
    lookup, so nn.Module's and object's is not what deepcopy meets)."""

    lookups: ClassVar[int] = 0

    def __getattribute__(self, name: str) -> Any:
        if name == "__deepcopy__":
            type(self).lookups += 1
        return super().__getattribute__(name)


class CountsLookups(_CountsDeepcopyLookups, nn.Linear):
    """A Linear that counts the lookups of `__deepcopy__` on it."""


def test_a_submodule_with_its_own_attribute_lookup_is_looked_up_once_as_natively() -> None:
    """deepcopy looks `__deepcopy__` up once per object: a class with its own
    `__getattribute__` sees that one lookup under the shim too (not none, not two)."""
    model = nn.Sequential(CountsLookups(2, 2))
    CountsLookups.lookups = 0
    native, shim = native_and_shim(model)
    assert CountsLookups.lookups == 2  # once natively, once under the shim
    GraphDiff(model, native, shim).check()


def test_a_submodule_with_an_instance_deepcopy_is_copied_by_it() -> None:
    """An instance attribute named `__deepcopy__` wins over the class's (the shim's copier is
    not a data descriptor): deepcopy calls it, for a submodule as for the root."""
    inner = nn.Linear(2, 2)
    inner.__deepcopy__ = lambda memo: "own"  # type: ignore[attr-defined]
    native, shim = native_and_shim(nn.Sequential(inner, nn.ReLU()))
    assert native[0] == shim[0] == "own"
    assert type(shim[1]) is nn.ReLU


def test_a_deepcopy_dispatch_entry_for_a_submodules_class_is_honoured(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """deepcopy's dispatch table comes before any `__deepcopy__`: an entry for a submodule's
    class copies it, under the shim as natively."""
    monkeypatch.setitem(copy._deepcopy_dispatch, nn.ReLU,  # type: ignore[attr-defined]
                        lambda x, memo: "dispatched")
    native, shim = native_and_shim(nn.Sequential(nn.Linear(2, 2), nn.ReLU()))
    assert native[1] == shim[1] == "dispatched"


@pytest.mark.parametrize("cls", [AnswersEverything, AnswersWithALooseCopier])
def test_a_submodule_whose_getattr_forwards_deepcopy_is_copied_by_the_answer(cls: type) -> None:
    """A submodule whose class's `__getattr__` answers for `__deepcopy__` is copied by that
    answer, as natively (only nn.Module's own `__getattr__` is known to have none)."""
    native, shim = native_and_shim(nn.Sequential(cls()))
    assert native[0] == shim[0] == "forwarded"


def test_a_submodule_class_before_nn_module_with_a_deepcopy_of_none_is_reduced() -> None:
    """`__deepcopy__ = None` on a class makes deepcopy reduce its instances, submodules too."""

    class Reduced(nn.Linear):
        __deepcopy__ = None

    same_as_native(nn.Sequential(Reduced(2, 2)))


def test_the_copy_keeps_every_submodule_and_parameter_alive_in_the_memo_as_natively() -> None:
    """deepcopy memoises each copy and keeps its source alive in the memo; a shared submodule
    is copied once.  The shim's copier, and its direct calls of each parameter's, do both,
    for the same objects."""
    shared = nn.Linear(2, 2)
    model = nn.Sequential(shared, nn.Sequential(nn.LayerNorm(2), shared), nn.ReLU())
    lasting = {id(obj): obj for obj in [*model.modules(), *model.parameters()]}

    def kept_and_memoised(memo: Dict[int, Any]) -> Any:
        kept = {id(obj) for obj in memo[id(memo)] if id(obj) in lasting}
        return kept, {key for key in memo if key in lasting}

    native_memo: Dict[int, Any] = {}
    native = copy.deepcopy(model, native_memo)
    shim_memo: Dict[int, Any] = {}
    with deepcopy_shim.enabled("silent"):
        shim = copy.deepcopy(model, shim_memo)
    assert kept_and_memoised(shim_memo) == kept_and_memoised(native_memo)
    assert kept_and_memoised(native_memo)[0] == set(lasting)
    assert shim[0] is shim[1][1]
    GraphDiff(model, native, shim).check()


class ReplacesModulesDeepcopy(nn.Module):
    """Copying it puts another `nn.Module.__deepcopy__` in place (as another patcher would)."""

    def __deepcopy__(self, memo: Dict[int, Any]) -> nn.Module:
        nn.Module.__deepcopy__ = lambda self, memo: "theirs"  # type: ignore[attr-defined]
        return nn.ReLU()


def test_a_modules_deepcopy_put_in_place_during_the_copy_copies_the_submodules_after_it() -> None:
    """An `nn.Module.__deepcopy__` put in place during the copy (by another patcher) copies the
    submodules met after that, as natively."""
    model = nn.Sequential(ReplacesModulesDeepcopy(), nn.Linear(2, 2))
    copies = []
    for mode in ("off", "silent"):
        try:
            with deepcopy_shim.enabled(mode):
                copies.append(copy.deepcopy(model))
        finally:
            del nn.Module.__deepcopy__
    native, shim = copies
    assert native[1] == shim[1] == "theirs"
    assert type(native[0]) is type(shim[0]) is nn.ReLU
    assert "__deepcopy__" not in vars(nn.Module)


class CountsItsLookups(_CountsDeepcopyLookups):
    """Counts the lookups of `__deepcopy__` on it; has none (deepcopy reduces it)."""


def test_a_value_of_parameters_that_is_no_parameter_is_looked_up_once_as_natively() -> None:
    """A module's `_parameters` may hold anything put there directly: what is not exactly an
    nn.Parameter is copied by deepcopy, which looks `__deepcopy__` up once (not twice)."""
    module = nn.Linear(2, 2)
    module._parameters["odd"] = CountsItsLookups()  # type: ignore[assignment]
    CountsItsLookups.lookups = 0
    native, shim = native_and_shim(nn.Sequential(module))
    assert CountsItsLookups.lookups == 2  # once natively, once under the shim
    assert type(native[0]._parameters["odd"]) is type(shim[0]._parameters["odd"]) is CountsItsLookups


# --- deepcopy's own copiers for atoms and tuples: the shortcuts keep atoms only while they are --


def _counting_copier(calls: List[Any], copier: Any) -> Any:
    def counted(x: Any, memo: Dict[int, Any], *args: Any) -> Any:
        calls.append(x)
        return copier(x, memo, *args)
    return counted


@pytest.mark.parametrize("kind", [int, bool, float, str, type(None), tuple, dict])
def test_a_copier_registered_for_atoms_tuples_or_dicts_is_called_as_natively(
        kind: type, monkeypatch: pytest.MonkeyPatch) -> None:
    """A copier put in deepcopy's dispatch table for an atom's type or for tuples is what
    deepcopy calls for each such value of a module's state (`in_features`, `training`, `eps`,
    `normalized_shape`, ...): under the shim it is called for the same values, in the same
    order."""
    dispatch = copy._deepcopy_dispatch  # type: ignore[attr-defined]
    model = nn.Sequential(nn.Linear(2, 2), nn.LayerNorm(3), nn.ReLU())
    calls: Dict[str, List[Any]] = {"native": [], "shim": []}
    original = dispatch[kind]
    monkeypatch.setitem(dispatch, kind, _counting_copier(calls["native"], original))
    native = copy.deepcopy(model)
    monkeypatch.setitem(dispatch, kind, _counting_copier(calls["shim"], original))
    with deepcopy_shim.enabled("silent"):
        shim = copy.deepcopy(model)
    assert calls["native"] and calls["shim"] == calls["native"]
    GraphDiff(model, native, shim).check()


def test_dispatch_is_copys_own_only_while_every_entry_is_deepcopys_own(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The check the shortcuts rely on: False for any entry replaced (even by a copier equal to
    deepcopy's own) or removed (deepcopy then reduces such values; natively that recurses)."""
    dispatch = copy._deepcopy_dispatch  # type: ignore[attr-defined]
    assert _protocol.dispatch_is_copys_own()
    for kind in (*_protocol.ATOMIC_TYPES, tuple, dict):
        with monkeypatch.context() as patch:
            patch.setitem(dispatch, kind, _EqualToEverything())
            assert not _protocol.dispatch_is_copys_own()
        with monkeypatch.context() as patch:
            patch.delitem(dispatch, kind)
            assert not _protocol.dispatch_is_copys_own()
    assert _protocol.dispatch_is_copys_own()
