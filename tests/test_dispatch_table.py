"""copy's dispatch table is one table while the shim is installed.

While installed, `copy._deepcopy_dispatch` is the shim's stand-in for the table (see
`deepcopy_shim._dispatch`). Whoever reads or writes it, through the module attribute or through
a reference taken before the install (`from copy import _deepcopy_dispatch`), in any thread and
whatever mode applies where, sees one table: every read, write, copy, pickle, comparison and repr
answers as the plain dict it stands for, and a copy of it is a plain dict of its own.
"""

from __future__ import annotations

import copy
import functools
import pickle
import threading
from typing import Any, Callable, Dict, List, Tuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import deepcopy_shim


class Point:
    pass


def _copy_point(x: Any, memo: Any) -> str:
    return "copied by the registered copier"


def test_a_copier_registered_through_an_earlier_reference_is_seen_by_every_read() -> None:
    from copy import _deepcopy_dispatch as table  # type: ignore[attr-defined]

    with deepcopy_shim.enabled("silent"):
        table[Point] = _copy_point
        try:
            installed = copy._deepcopy_dispatch  # type: ignore[attr-defined]
            assert installed is not table
            assert Point in installed and installed[Point] is _copy_point
            assert installed.get(Point) is _copy_point
            assert len(installed) == len(table) and list(installed) == list(table)
            assert dict(installed) == table and installed.copy() == table
            assert copy.deepcopy(Point()) == "copied by the registered copier"
        finally:
            del table[Point]
        assert Point not in installed and len(installed) == len(table)
        assert not isinstance(copy.deepcopy(Point()), str)


@pytest.mark.parametrize("how", ["copy.copy", "dict.copy", "dict()", "{**t}", "t | {}"])
def test_a_copy_of_the_installed_table_is_a_plain_dict_of_its_own(how: str) -> None:
    makers: Dict[str, Callable[[Any], Any]] = {
        "copy.copy": copy.copy, "dict.copy": lambda t: t.copy(), "dict()": dict,
        "{**t}": lambda t: {**t}, "t | {}": lambda t: t | {},
    }
    with deepcopy_shim.enabled("silent"):
        private = makers[how](copy._deepcopy_dispatch)  # type: ignore[attr-defined]
        assert type(private) is dict
        private[Point] = _copy_point
        assert Point not in copy._deepcopy_dispatch  # type: ignore[attr-defined]
        assert not isinstance(copy.deepcopy(Point()), str)


def _outcome(call: Callable[[], Any]) -> Any:
    try:
        made = call()
    except Exception as error:
        return "raised", type(error)
    return "made", type(made), made


def test_the_installed_table_pickles_and_deep_copies_as_the_plain_dict() -> None:
    from copy import _deepcopy_dispatch as table  # type: ignore[attr-defined]

    with deepcopy_shim.enabled("silent"):
        installed = copy._deepcopy_dispatch  # type: ignore[attr-defined]
        for protocol in range(pickle.HIGHEST_PROTOCOL + 1):  # it holds classes pickle refuses
            assert _outcome(functools.partial(pickle.dumps, installed, protocol)) == _outcome(
                functools.partial(pickle.dumps, table, protocol))
        made = copy.deepcopy(installed)
        assert type(made) is dict and made == table and made is not table
        assert repr(installed) == repr(table) and str(installed) == str(table)
        assert installed == table and table == installed and not installed != table


# --- the property: the dict API, side by side with a plain dict ---------------------------------

_KEYS = [type(f"K{i}", (), {}) for i in range(6)]
_VALUES = [lambda x, memo, i=i: i for i in range(4)]

# Each operation: a name and a function of (table, key, value) returning something comparable.
_Operation = Tuple[str, Callable[[Any, Any, Any], Any]]


def _result(call: Callable[[], Any]) -> Any:
    try:
        return ("value", call())
    except Exception as error:
        return ("raised", type(error))


_OPERATIONS: List[_Operation] = [
    ("set", lambda t, k, v: t.__setitem__(k, v)),
    ("get", lambda t, k, v: t.get(k)),
    ("get default", lambda t, k, v: t.get(k, v)),
    ("getitem", lambda t, k, v: t[k]),
    ("del", lambda t, k, v: t.__delitem__(k)),
    ("in", lambda t, k, v: k in t),
    ("len", lambda t, k, v: len(t)),
    ("bool", lambda t, k, v: bool(t)),
    ("keys", lambda t, k, v: [x for x in t.keys() if x in _KEYS]),
    ("values", lambda t, k, v: [x for x in t.values() if x in _VALUES]),
    ("items", lambda t, k, v: [x for x in t.items() if x[0] in _KEYS]),
    ("iter", lambda t, k, v: [x for x in t if x in _KEYS]),
    ("reversed", lambda t, k, v: [x for x in reversed(t) if x in _KEYS]),
    ("pop", lambda t, k, v: t.pop(k)),
    ("pop default", lambda t, k, v: t.pop(k, v)),
    ("setdefault", lambda t, k, v: t.setdefault(k, v)),
    ("update", lambda t, k, v: t.update({k: v})),
    ("update pairs", lambda t, k, v: t.update([(k, v)])),
    ("update kwargs-free", lambda t, k, v: t.update()),
    ("ior", lambda t, k, v: t.__ior__({k: v}) is t),
    ("or", lambda t, k, v: [x for x in (t | {k: v}).items() if x[0] in _KEYS]),
    ("ror", lambda t, k, v: [x for x in ({k: v} | t).items() if x[0] in _KEYS]),
    ("eq itself as dict", lambda t, k, v: t == dict(t)),
    ("copy", lambda t, k, v: type(t.copy()).__name__),
    ("fromkeys", lambda t, k, v: (type(t.fromkeys([k])).__name__, t.fromkeys([k], v) == {k: v})),
    ("contains via get sentinel", lambda t, k, v: t.get(k, "absent") == "absent"),
]


def _apply(table: Any, model: Dict[Any, Any], index: int, key: Any, value: Any) -> None:
    name, operation = _OPERATIONS[index]
    got = _result(lambda: operation(table, key, value))
    expected = _result(lambda: operation(model, key, value))
    assert got == expected, name


def _ours(table: Any) -> Dict[Any, Any]:
    return {k: v for k, v in dict(table).items() if k in _KEYS}


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(st.tuples(st.integers(0, len(_OPERATIONS) - 1), st.integers(0, len(_KEYS) - 1),
                                st.integers(0, len(_VALUES) - 1), st.sampled_from(["module", "earlier"])),
                      max_size=40),
       where=st.sampled_from(["no mode", "a scope", "enable", "another thread"]))
def test_the_installed_table_answers_the_dict_api_as_a_plain_dict(
        steps: List[Tuple[int, int, int, str]], where: str) -> None:
    """Every operation, through the module's table or a reference taken before the install, gives
    what the same operation on a plain dict gives, and both views always hold the same entries."""
    from copy import _deepcopy_dispatch as earlier  # type: ignore[attr-defined]

    model: Dict[Any, Any] = dict(earlier)
    failures: List[BaseException] = []

    def run() -> None:
        try:
            for index, key, value, through in steps:
                table = copy._deepcopy_dispatch if through == "module" else earlier  # type: ignore[attr-defined]
                _apply(table, model, index, _KEYS[key], _VALUES[value])
                assert _ours(copy._deepcopy_dispatch) == _ours(earlier) == _ours(model)  # type: ignore[attr-defined]
        except BaseException as error:  # reported in the test's own thread
            failures.append(error)

    holder = deepcopy_shim.enabled("silent")  # installs the patch, in this thread only
    holder.start()
    try:
        if where == "a scope":
            with deepcopy_shim.enabled("strict"):
                run()
        elif where == "enable":
            deepcopy_shim.enable("warn")
            run()
        elif where == "another thread":
            thread = threading.Thread(target=run)
            thread.start()
            thread.join(60)
            assert not thread.is_alive()
        else:
            with deepcopy_shim.enabled("off"):
                run()
    finally:
        deepcopy_shim.disable()
        holder.stop()
        for key in _KEYS:
            earlier.pop(key, None)
    if failures:
        raise failures[0]
    assert copy._deepcopy_dispatch is earlier  # type: ignore[attr-defined]
