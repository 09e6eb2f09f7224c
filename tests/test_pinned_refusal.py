"""Strict's refusal and the survey behind it, pinned where a mutation run found them unguarded
(issue 20: ``_refusal`` and ``_survey``).

Every test is a behaviour a user sees through ``copy.deepcopy`` in a strict scope,
``deepcopy_shim.deepcopy(obj, "strict")`` or ``find_nonleaf_tensors``: what the refusal's
message, ``.paths`` and ``.tensors`` say, which copy's survey serves which refusal, what the
survey does with memos, scopes, slots, grads and parameters, what the stand-ins it hands to a
copy's own code look like, and that it copies no tensor data.  The survey runs as the copy it
refused ends; a refusal is read after that, as a user reads it.

Two strict xfails pin a limit found on the way: a Parameter a copy's own code copies with a
fresh memo has its data cloned by the survey (on torch 2.0 also every parameter of a module
copied so): the survey answers a fresh memo's tensors through the tensor patch, and
``nn.Parameter.__deepcopy__`` is torch's own.
"""

from __future__ import annotations

import copy
import os
import warnings
from typing import Any, Callable, ClassVar, Dict, List, Optional

import pytest
import torch
import torch.nn as nn
from support.loose import EqualsEveryClass, SuppliesTagged
from support.models import with_history

import deepcopy_shim
from deepcopy_shim import DetachedTensorsWarning, NonLeafTensorError, _survey

pytestmark = pytest.mark.filterwarnings("default::deepcopy_shim.DeepcopyShimWarning")


def refused(obj: Any, memo: Optional[Dict[Any, Any]] = None) -> NonLeafTensorError:
    """The refusal of a strict ``copy.deepcopy(obj, memo)``, unread."""
    with deepcopy_shim.enabled("strict"), pytest.raises(NonLeafTensorError) as info:
        copy.deepcopy(obj, memo)
    return info.value


def words(error: BaseException) -> str:
    """The message with its line breaks undone (messages are filled to a width)."""
    return " ".join(str(error).split())


def complete(error: NonLeafTensorError) -> bool:
    """True if the refusal does not say its list may be incomplete."""
    return "The list may be incomplete" not in words(error)


def detached_by_warn(obj: Any) -> List[str]:
    """The paths a copy in mode warn detaches."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        deepcopy_shim.deepcopy(obj, "warn")
    return [p for w in caught if isinstance(w.message, DetachedTensorsWarning) for p in w.message.paths]


def found(obj: Any) -> List[str]:
    return [path for path, _ in deepcopy_shim.find_nonleaf_tensors(obj)]


class Seen:
    """A container whose own ``__deepcopy__`` keeps what deepcopy gave it for its tensor: in a
    survey, the stand-in the survey made."""

    given: ClassVar[List[Any]] = []

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t

    def __deepcopy__(self, memo: Dict[int, Any]) -> Seen:
        new = Seen.__new__(Seen)
        new.t = copy.deepcopy(self.t, memo)
        Seen.given.append(new.t)
        return new


def stand_ins(*tensors: torch.Tensor) -> List[Any]:
    """What a survey hands a copy's own code for each of `tensors` (read through a refusal)."""
    Seen.given = []
    err = refused([with_history(), *[Seen(t) for t in tensors]])
    assert err.paths == ("[0]",) and complete(err)
    assert len(Seen.given) == len(tensors)
    return list(Seen.given)


# --- one survey per top-level copy, and the right one -----------------------------------------


class CountsSurveys:
    """Counts its copies: made once by each survey, never by a copy refused before it."""

    copies = 0

    def __deepcopy__(self, memo: Dict[int, Any]) -> CountsSurveys:
        CountsSurveys.copies += 1
        return CountsSurveys()


class CatchesTheRefusal:
    """Catches the refusal of its tensor inside the copy, keeps it, and goes on without it."""

    def __init__(self) -> None:
        self.t: Optional[torch.Tensor] = with_history()
        self.caught: Optional[NonLeafTensorError] = None

    def __deepcopy__(self, memo: Dict[int, Any]) -> CatchesTheRefusal:
        new = CatchesTheRefusal.__new__(CatchesTheRefusal)
        try:
            new.t = copy.deepcopy(self.t, memo)
        except NonLeafTensorError as refusal:
            self.caught = refusal
            new.t = None
        return new


def test_every_refusal_of_one_copy_is_answered_by_one_survey() -> None:
    obj: List[Any] = [CatchesTheRefusal(), with_history(), CountsSurveys()]
    CountsSurveys.copies = 0
    second = refused(obj)  # the first refusal was caught inside the copy, which went on
    first = obj[0].caught
    assert first is not None and first is not second
    assert CountsSurveys.copies == 1  # the copy stopped at [1]; its one survey went on to [2]
    assert second.paths == ("[0].t", "[1]") and second.tensors == (obj[0].t, obj[1])
    assert first.paths == second.paths and first.tensors == second.tensors
    assert CountsSurveys.copies == 1 and complete(first) and complete(second)


def test_a_second_top_level_copy_refused_while_the_first_refusal_lives_has_its_own_survey() -> None:
    one, two = [with_history()], {"t": with_history()}
    first = refused(one)
    second = refused(two)  # `first` still holds its copy's survey, unread
    assert second.paths == ("['t']",) and second.tensors == (two["t"],) and complete(second)
    assert first.paths == ("[0]",) and first.tensors == (one[0],) and complete(first)


# --- what the message says when the survey cannot say everything ----------------------------


class CopiesItsTensorOnce:
    """Copies its tensor the first time it is copied, and nothing after: a survey made after the
    copy does not meet the tensor the copy refused."""

    def __init__(self) -> None:
        self.t = with_history()
        self.copies = 0

    def __deepcopy__(self, memo: Dict[int, Any]) -> Any:
        self.copies += 1
        return copy.deepcopy(self.t, memo) if self.copies == 1 else None


def test_a_refused_tensor_the_survey_does_not_meet_is_named_and_the_message_says_so() -> None:
    obj = [CopiesItsTensorOnce()]
    err = refused(obj)
    assert err.paths == ("[0].t",) and err.tensors == (obj[0].t,)
    assert ("The list may be incomplete: the rest of the copy could not be followed without copying "
            "it (the survey of the copy did not meet this tensor).") in words(err)


class ReadsItsValues:
    """Its copy reads the values of the tensor it copies: a stand-in has none."""

    total: float

    def __init__(self) -> None:
        self.w = torch.ones(2)

    def __deepcopy__(self, memo: Dict[int, Any]) -> ReadsItsValues:
        new = ReadsItsValues.__new__(ReadsItsValues)
        new.w = copy.deepcopy(self.w, memo)
        new.total = float(new.w.sum())
        return new


def test_a_survey_that_stops_before_the_refused_tensor_says_what_stopped_it() -> None:
    obj = [ReadsItsValues(), with_history()]
    err = refused(obj)
    assert err.paths == ("[1]",) and err.tensors == (obj[1],)
    text = words(err)
    assert "The list may be incomplete: the rest of the copy could not be followed without copying it (" \
        in text
    assert "did not meet this tensor" not in text  # the survey's own error is the reason given


class NoSubclasses(dict):  # type: ignore[type-arg]
    """A memo class that refuses to be subclassed: the survey's memo is of the copy's memo
    class itself, so it is surveyed as any other."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        raise TypeError("this memo class cannot be subclassed")


def test_a_memo_class_that_cannot_be_subclassed_is_surveyed_as_any_other() -> None:
    obj = [with_history(), with_history()]
    err = refused(obj, NoSubclasses())
    assert err.paths == ("[0]", "[1]") and err.tensors == (obj[0], obj[1]) and complete(err)


def test_a_survey_that_cannot_start_still_names_the_refused_tensor_and_says_why(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def no_memo(*args: Any) -> Any:
        raise TypeError("no memo for a survey here")

    monkeypatch.setattr(_survey, "dry_memo", no_memo)
    obj = [with_history(), with_history()]
    err = refused(obj)
    assert err.paths == ("[0]",) and err.tensors == (obj[0],)
    assert ("could not be followed without copying it (TypeError: no memo for a survey "
            "here)") in words(err)


class Interrupted(BaseException):
    """Not an Exception: as KeyboardInterrupt, it is never taken for a copy that failed."""


class InterruptsItsCopy:
    def __deepcopy__(self, memo: Dict[int, Any]) -> Any:
        raise Interrupted("interrupted while copied")


def test_an_interruption_during_the_survey_reaches_the_caller_showing_no_frame_of_the_shims() -> None:
    obj = [with_history(), InterruptsItsCopy()]
    with deepcopy_shim.enabled("strict"), pytest.raises(Interrupted) as interruption:
        copy.deepcopy(obj)  # the copy itself stops at [0]; its survey meets [1]
    shown = str(interruption.getrepr(style="long"))
    assert "interrupted while copied" in shown and "InterruptsItsCopy" in shown
    err = interruption.value.__context__  # the refusal it interrupted names its own tensor
    assert isinstance(err, NonLeafTensorError) and err.paths == ("[0]",)
    assert "The list may be incomplete: the survey of the copy was interrupted" in words(err)
    # pytest leaves out the frames of the refusal and the survey, as it does the tensor patch's
    for module in ("_refusal.py", "_survey.py"):
        assert os.path.join("deepcopy_shim", module) not in shown, module


# --- the memo the survey starts from -----------------------------------------------------------


def test_a_copy_already_in_a_reused_memo_is_the_surveys_answer_too() -> None:
    x = torch.ones(3, requires_grad=True)
    (x * 2).sum().backward()  # type: ignore[no-untyped-call]  # x.grad: a leaf
    memo: Dict[Any, Any] = {}
    copy.deepcopy(x.grad, memo)  # the memo holds a real copy of the grad
    obj = [x, with_history()]
    err = refused(obj, memo)
    assert err.paths == ("[1]",) and complete(err)  # the grad's copy does not fit a stand-in


def test_tied_parameters_are_surveyed_once_through_the_memo() -> None:
    first, second = nn.Linear(2, 2), nn.Linear(2, 2)
    second.weight = first.weight
    tied = nn.Sequential(first, second)
    obj = {"model": tied, "t": with_history()}
    err = refused(obj)
    assert err.paths == ("['t']",) and complete(err)


def test_a_memo_entry_made_by_hand_answers_in_the_survey_whatever_its_value() -> None:
    layer = nn.Linear(2, 2)
    layer._parameters["scale"] = with_history()  # type: ignore[assignment]  # a store: register_parameter refuses it
    layer.out = with_history()
    memo: Dict[Any, Any] = {id(layer._parameters["scale"]): []}  # "copy it as an empty list"
    err = refused(layer, memo)
    assert err.paths == ("out",) and err.tensors == (layer.out,) and complete(err)


class SuppliesTaggedLoosely(SuppliesTagged, metaclass=EqualsEveryClass):
    pass


@pytest.mark.parametrize("memo_class", [SuppliesTagged, SuppliesTaggedLoosely])
def test_the_survey_asks_a_memo_subclass_as_the_copy_does(memo_class: type) -> None:
    supplied, met = with_history(), with_history()
    supplied.supplied = True  # type: ignore[attr-defined]
    obj = [supplied, met]
    err = refused(obj, memo_class())
    assert err.paths == ("[1]",) and err.tensors == (met,) and complete(err)


class NeedsAName(dict):  # type: ignore[type-arg]
    """A memo class whose instances cannot be made without an argument."""

    def __new__(cls, name: str) -> NeedsAName:
        return super().__new__(cls)

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name


def test_a_memo_class_the_survey_cannot_instantiate_gives_way_to_a_plain_memo() -> None:
    obj = [with_history(), torch.ones(2), with_history()]
    err = refused(obj, NeedsAName("memo"))
    assert err.paths == ("[0]", "[2]") and complete(err)


# --- scopes entered during the survey keep their modes ----------------------------------------


class CopiesInAScope:
    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.t = with_history()

    def __deepcopy__(self, memo: Dict[int, Any]) -> Any:
        with deepcopy_shim.enabled(self.mode):
            return copy.deepcopy(self.t, memo)


@pytest.mark.parametrize("mode", ["warn", "silent"])
def test_a_warn_or_silent_scope_inside_the_survey_copies_its_tensor_and_says_nothing(mode: str) -> None:
    obj = [with_history(), CopiesInAScope(mode), with_history()]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        err = refused(obj)
        assert err.paths == ("[0]", "[2]") and complete(err)


def test_a_strict_scope_inside_the_survey_still_refuses() -> None:
    obj = [with_history(), CopiesInAScope("strict"), with_history()]
    err = refused(obj)
    assert err.paths == ("[0]",)
    assert ("could not be followed without copying it (NonLeafTensorError: deepcopy_shim: refused a "
            "tensor with autograd history (met by the survey of a copy))") in words(err)


# --- what the survey copies of a tensor beside its data ---------------------------------------


def test_a_leafs_grad_with_history_is_found_as_the_copy_meets_it() -> None:
    x = torch.randn(3, requires_grad=True)
    (x ** 3).sum().backward(create_graph=True)  # type: ignore[no-untyped-call]
    assert x.is_leaf and x.grad is not None and not x.grad.is_leaf
    obj = {"x": x}
    assert found(obj) == ["['x'].grad"] == detached_by_warn(obj)


def test_a_retained_grad_with_history_is_found_after_its_tensor() -> None:
    x = torch.randn(3, requires_grad=True)
    y = x * 2
    y.retain_grad()
    (y ** 3).sum().backward(create_graph=True)  # type: ignore[no-untyped-call]
    obj = {"y": y}
    assert found(obj) == ["['y']", "['y'].grad"] == detached_by_warn(obj)


class Labelled(torch.Tensor):
    """A subclass with slots that torch can deep-copy (its new_empty keeps the type)."""

    __slots__ = ("label", "unset")

    def new_empty(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return super().new_empty(*args, **kwargs).as_subclass(Labelled)


class _TensorEqualsEveryClass(type(torch.Tensor)):  # type: ignore[misc]
    def __eq__(cls, other: object) -> bool:
        return isinstance(other, type)

    __hash__ = type.__hash__


class LooselyLabelled(Labelled, metaclass=_TensorEqualsEveryClass):
    """Labelled, of a class that compares equal to torch.Tensor (identity tells them apart)."""

    def new_empty(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return super().new_empty(*args, **kwargs).as_subclass(LooselyLabelled)


@pytest.mark.parametrize("cls", [Labelled, LooselyLabelled])
def test_a_tensors_slots_are_surveyed_and_an_unset_slot_is_skipped(cls: type) -> None:
    t: Any = torch.ones(2).as_subclass(cls)
    t.label = with_history()
    obj = [with_history(), t]
    err = refused(obj)
    assert err.paths == ("[0]", "[1].label") and complete(err)


class _Checked(torch.Tensor):
    __slots__ = ("scale",)

    def new_empty(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return super().new_empty(*args, **kwargs).as_subclass(type(self))


class Checked(_Checked):
    """Its slot's setter checks the value it is given: a stand-in cannot pass the check."""

    @property
    def scale(self) -> Any:
        return _Checked.__dict__["scale"].__get__(self)

    @scale.setter
    def scale(self, value: torch.Tensor) -> None:
        if not bool((value > 0).all()):
            raise ValueError("scale must be positive")
        _Checked.__dict__["scale"].__set__(self, value)


def test_a_slot_a_stand_in_cannot_take_does_not_stop_the_survey() -> None:
    t = torch.ones(2).as_subclass(Checked)
    t.scale = torch.ones(2)
    native = copy.deepcopy(t)  # the copy itself passes the check
    assert torch.equal(native.scale, t.scale)
    obj = [with_history(), t, with_history()]
    err = refused(obj)
    assert err.paths == ("[0]", "[2]") and complete(err)


class DropsItsCache(torch.Tensor):
    """Keeps a cache in its instance dict that it clears before it is copied, as torch asks of
    a subclass with non-serializable cached data."""

    def new_empty(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return super().new_empty(*args, **kwargs).as_subclass(DropsItsCache)

    def _clear_non_serializable_cached_data(self) -> None:
        clear: Optional[Callable[[], None]] = getattr(super(), "_clear_non_serializable_cached_data", None)
        if clear is not None:
            clear()
        self.__dict__.pop("cache", None)


def test_what_a_tensor_clears_before_its_copy_is_not_surveyed() -> None:
    """torch 2.6 and later leave out of a tensor's copied dict what its
    `_clear_non_serializable_cached_data` clears; earlier ones copy the whole dict and never
    call it: the survey meets what the copy of the running torch meets."""
    leaf = torch.ones(2).as_subclass(DropsItsCache)
    leaf.cache, leaf.note = 1, 2  # type: ignore[attr-defined]
    kept = sorted(vars(copy.deepcopy(leaf)))  # what torch's own copy of a leaf keeps
    assert kept in (["note"], ["cache", "note"])
    t = torch.ones(2).as_subclass(DropsItsCache)
    t.cache = with_history()  # type: ignore[attr-defined]
    t.note = with_history()  # type: ignore[attr-defined]
    obj = [t]
    surveyed = found(obj)  # first: a copy made by torch clears the source's own dict
    assert surveyed == [f"[0].{name}" for name in kept]
    assert surveyed == detached_by_warn(obj)


# --- parameters: stand-ins, never their data; a subclass's own __deepcopy__: called, as the copy does


def record_clones(monkeypatch: pytest.MonkeyPatch) -> List[torch.Tensor]:
    """The tensors whose data is cloned from now on (a parameter's deepcopy clones its data)."""
    clones: List[torch.Tensor] = []
    clone = torch.Tensor.clone

    def recorded(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        clones.append(self)
        return clone(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "clone", recorded)
    return clones


class CopiesItsModelAfresh:
    """A copy of its own model, with a fresh memo, inside the copy."""

    def __init__(self) -> None:
        self.model = nn.Linear(2, 2)

    def __deepcopy__(self, memo: Dict[int, Any]) -> CopiesItsModelAfresh:
        new = CopiesItsModelAfresh.__new__(CopiesItsModelAfresh)
        new.model = copy.deepcopy(self.model)
        return new


class CountsItsCopies(torch.Tensor):
    """A subclass with a __deepcopy__ of its own (which a survey calls, as the copy does: what
    it copies beside the data may hold tensors with history)."""

    copies = 0

    def __deepcopy__(self, memo: Dict[int, Any]) -> CountsItsCopies:
        CountsItsCopies.copies += 1
        return torch.ones(2).as_subclass(CountsItsCopies)


def test_reading_a_refusal_copies_no_parameter_and_calls_a_tensors_own_deepcopy_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    obj = [with_history(), nn.Parameter(torch.ones(3)), torch.ones(2).as_subclass(CountsItsCopies),
           {"bias": nn.Linear(2, 1).bias}]
    CountsItsCopies.copies = 0
    clones = record_clones(monkeypatch)
    err = refused(obj)  # the copy stops at [0]; its survey follows the rest
    assert err.paths == ("[0]",) and complete(err)
    assert clones == [] and CountsItsCopies.copies == 1


def test_find_nonleaf_tensors_copies_no_parameter(monkeypatch: pytest.MonkeyPatch) -> None:
    model = nn.Linear(2, 2)
    model.out = model(torch.ones(1, 2))
    obj = [nn.Parameter(torch.ones(3)), model]
    clones = record_clones(monkeypatch)
    assert found(obj) == ["[1].out"]
    assert clones == []


# Parameters copied with a fresh memo inside the survey (by a module's or any object's own
# __deepcopy__) get stand-ins too: copy's dispatch table answers them in every memo.


class CopiesItsParametersAfresh:
    """A copy of its own parameters, with a fresh memo, inside the copy."""

    def __init__(self) -> None:
        self.params = [nn.Parameter(torch.ones(5))]

    def __deepcopy__(self, memo: Dict[int, Any]) -> CopiesItsParametersAfresh:
        new = CopiesItsParametersAfresh.__new__(CopiesItsParametersAfresh)
        new.params = copy.deepcopy(self.params)
        return new


def test_a_model_copied_with_a_fresh_memo_inside_the_survey_has_no_parameter_data_copied(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clones = record_clones(monkeypatch)
    err = refused([with_history(), CopiesItsModelAfresh()])
    assert err.paths == ("[0]",) and complete(err)
    assert clones == []


def test_parameters_copied_with_a_fresh_memo_inside_the_survey_have_no_data_copied(
        monkeypatch: pytest.MonkeyPatch) -> None:
    err = refused([with_history(), CopiesItsParametersAfresh()])
    clones = record_clones(monkeypatch)
    assert err.paths == ("[0]",) and complete(err)
    assert clones == []


class Tagged(nn.Parameter):
    """A parameter class made with a tag, whose __deepcopy__ passes it on."""

    tag: str

    def __new__(cls, data: torch.Tensor, requires_grad: bool = True, *, tag: str) -> Tagged:
        made = super().__new__(cls, data, requires_grad)
        made.tag = tag
        return made

    def __deepcopy__(self, memo: Dict[int, Any]) -> Tagged:
        return Tagged(self.data.clone(), self.requires_grad, tag=self.tag)


def test_a_parameter_class_a_stand_in_cannot_be_made_of_does_not_stop_the_survey() -> None:
    tagged = Tagged(torch.ones(2), tag="t")
    assert copy.deepcopy(tagged).tag == "t"
    obj = [with_history(), tagged, with_history()]
    err = refused(obj)
    assert err.paths == ("[0]", "[2]") and complete(err)


def test_tensors_in_a_modules_parameter_store_are_found_with_their_paths() -> None:
    inner = nn.Linear(2, 2)
    inner._parameters["a"] = with_history()  # type: ignore[assignment]
    inner._parameters["b"] = with_history()  # type: ignore[assignment]
    model = nn.Sequential(nn.Linear(2, 2), inner)
    assert found(model) == ["[1].a", "[1].b"] == detached_by_warn(model)
    err = refused({"m": model})
    assert err.paths == ("['m'][1].a", "['m'][1].b")


# --- the stand-ins a copy's own code is given --------------------------------------------------


def test_a_stand_in_is_a_meta_tensor_of_the_tensors_class_dtype_shape_strides_and_requires_grad() -> None:
    frozen = nn.Parameter(torch.ones(2, 3), requires_grad=False)
    sources = [
        torch.ones(2, 3),  # no grad
        torch.ones(2, 3, requires_grad=True),
        torch.arange(6).reshape(2, 3).t(),  # integer, transposed strides
        frozen,
        nn.Parameter(torch.ones(4)),
        torch.ones(2).as_subclass(Labelled),
        torch.ones(2).as_subclass(LooselyLabelled),  # equal to torch.Tensor, but not it
        torch.ones(2, 2, dtype=torch.complex64, requires_grad=True),
    ]
    for source, made in zip(sources, stand_ins(*sources)):
        assert made.device.type == "meta", source
        assert type(made) is type(source), source
        assert (made.dtype, made.shape, made.stride()) == (source.dtype, source.shape, source.stride())
        assert made.requires_grad == source.requires_grad, source


def test_a_tensor_without_a_meta_layout_is_stood_in_for_by_an_empty_meta_tensor_of_its_dtype() -> None:
    quantized = torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.qint8)
    (made,) = stand_ins(quantized)
    assert made.device.type == "meta" and made.dtype == torch.qint8 and made.numel() == 0
    obj = [with_history(), quantized, with_history()]
    err = refused(obj)
    assert err.paths == ("[0]", "[2]") and complete(err)


# --- the survey's memo: asked as deepcopy asks it, and harmless once the survey is over -------


class NeverCompared:
    """An object whose `==` and `!=` raise (as a numpy array's or a pandas frame's truth does):
    deepcopy never compares what its memo holds, so neither may the survey."""

    def __eq__(self, other: object) -> bool:
        raise TypeError("NeverCompared is never compared")

    __ne__ = __eq__  # type: ignore[assignment]
    __hash__ = object.__hash__


def test_the_survey_never_compares_what_its_memo_holds() -> None:
    shared = NeverCompared()
    error = refused([with_history(), shared, shared])  # the second `shared` is a memo hit
    assert error.paths == ("[0]",) and complete(error)


class KeepsItsMemo:
    """Keeps the memo it is copied with (here, during the survey: the survey's memo)."""

    kept: ClassVar[List[Any]] = []

    def __deepcopy__(self, memo: Dict[Any, Any]) -> Any:
        KeepsItsMemo.kept.append(memo)
        return KeepsItsMemo()


def test_a_survey_memo_kept_past_the_survey_is_a_plain_memo() -> None:
    """A memo a `__deepcopy__` keeps from a survey and uses later, outside every scope or in a
    scope of its own, answers what it holds and copies anything else as natively."""
    KeepsItsMemo.kept.clear()
    error = refused([with_history(), KeepsItsMemo()])
    assert error.paths == ("[0]",)  # read: the survey ran
    (memo,) = KeepsItsMemo.kept[-1:]
    leaf = torch.ones(2, requires_grad=True)
    made = copy.deepcopy(leaf, memo)  # no scope
    assert made is not leaf and made.is_leaf and torch.equal(made, leaf)
    with deepcopy_shim.enabled("silent"):
        again = copy.deepcopy(torch.ones(3), memo)
    assert again.shape == (3,)
