"""One vocabulary for every door, and a public answer to "which mode applies here, and why"."""

from __future__ import annotations

import asyncio
import copy
import re
import threading
from typing import Any, List, Optional

import pytest
from support.models import CachedActivationsNet
from support.processes import run_forking

import deepcopy_shim
from deepcopy_shim import Mode, ModeSetting, Source
from deepcopy_shim._modes import OFF_WORDS, ON_WORDS

ON = [*ON_WORDS, "ON", " Yes ", True]
OFF = [*OFF_WORDS, "OFF", " No ", False]


@pytest.mark.parametrize("word", [*ON, "warn", "WARN", Mode.WARN, 1])
def test_on_words_mean_warn_at_every_door(word: Any, cached_net: CachedActivationsNet) -> None:
    deepcopy_shim.enable(word)
    written = "deepcopy_shim.Mode.WARN" if word is Mode.WARN else repr(word)
    setting = deepcopy_shim.current_mode()
    assert setting == ModeSetting(Mode.WARN, Source.CODE, f"deepcopy_shim.enable({written})")
    assert setting is not None and setting.spelled("silent") == "deepcopy_shim.enable('silent')"
    deepcopy_shim.disable()
    with deepcopy_shim.enabled(word):
        assert deepcopy_shim.current_mode().mode is Mode.WARN  # type: ignore[union-attr]
    with pytest.warns(deepcopy_shim.DetachedTensorsWarning):
        deepcopy_shim.deepcopy(cached_net, word)


@pytest.mark.parametrize("word", OFF)
def test_off_words_mean_off_at_every_door(word: Any, cached_net: CachedActivationsNet) -> None:
    deepcopy_shim.enable("strict")
    deepcopy_shim.enable(word)  # enable(off) is disable()
    assert deepcopy_shim.current_mode() is None and not deepcopy_shim.is_enabled()
    deepcopy_shim.enable("silent")
    with deepcopy_shim.enabled(word):  # a scope where copies behave natively
        assert deepcopy_shim.current_mode() is None
        with pytest.raises(RuntimeError, match="graph leaves"):
            copy.deepcopy(cached_net)
    assert deepcopy_shim.current_mode().mode is Mode.SILENT  # type: ignore[union-attr]
    deepcopy_shim.disable()
    with pytest.raises(RuntimeError, match="graph leaves"):
        deepcopy_shim.deepcopy(cached_net, word)  # a native copy


_DOORS = (deepcopy_shim.enable, deepcopy_shim.enabled, lambda mode: deepcopy_shim.deepcopy(1, mode=mode))


@pytest.mark.parametrize("bad", ["loud", "2", 3, "warn strict"])
def test_bad_spellings_are_refused_at_every_door(bad: Any) -> None:
    for door in _DOORS:
        with pytest.raises(deepcopy_shim.ModeValueError,
                           match=r"invalid mode .*valid values are warn, strict, silent; "
                                 r"1, true, on, yes \(warn\); 0, false, off, no \(off\) \(in any "
                                 r"case; also True/False, 1/0 and deepcopy_shim\.Mode members\)"):
            door(bad)
    assert not deepcopy_shim.is_enabled()


@pytest.mark.parametrize("blank", ["", "  ", "\t\n"])
def test_a_blank_value_in_code_is_refused_not_read_as_off(blank: str) -> None:
    """`enable(os.environ.get("MY_FLAG", ""))` must not quietly mean native copies: in code a
    blank value is a ModeValueError naming the accepted ones (the environment variable alone
    reads blank as unset, tests/test_activation_bootstrap.py)."""
    deepcopy_shim.enable("strict")
    for door in _DOORS:
        with pytest.raises(deepcopy_shim.ModeValueError,
                           match=rf"^deepcopy_shim: invalid mode {re.escape(repr(blank))}; valid "
                                 r"values are warn, strict, silent; 1, true, on, yes \(warn\); "
                                 r"0, false, off, no \(off\)"):
            door(blank)
    setting = deepcopy_shim.current_mode()  # nothing changed
    assert setting is not None and setting.mode is Mode.STRICT


@pytest.mark.parametrize("bad", [None, 3.5, ["warn"], b"warn", object()])
def test_a_value_of_another_type_is_a_type_error_at_every_door(bad: Any) -> None:
    """As Python refuses a value of the wrong type; None says how to write warn and off."""
    for door in _DOORS:
        with pytest.raises(TypeError, match=rf"mode must be a str, a deepcopy_shim\.Mode, a bool or "
                                            rf"0/1, not {type(bad).__name__} ") as refused:
            door(bad)
        if bad is None:
            assert "leave the argument out for 'warn', or pass 'off'" in str(refused.value)
    assert not deepcopy_shim.is_enabled()


def test_mode_value_error_is_public_and_reports_the_public_module() -> None:
    assert deepcopy_shim.ModeValueError.__module__ == "deepcopy_shim"
    assert issubclass(deepcopy_shim.ModeValueError, ValueError)
    assert "ModeValueError" in deepcopy_shim.__all__


def test_mode_parse_and_str() -> None:
    assert Mode.parse("STRICT") is Mode.STRICT and Mode.parse(Mode.WARN) is Mode.WARN
    assert Mode.parse("on") is Mode.WARN
    with pytest.raises(ValueError, match="means off, which is not a mode"):
        Mode.parse("off")
    assert Mode.SILENT == "silent" and str(Mode.SILENT) == "silent"


def test_current_mode_says_where_it_came_from() -> None:
    assert deepcopy_shim.current_mode() is None
    deepcopy_shim.enable("silent")
    setting = deepcopy_shim.current_mode()
    assert isinstance(setting, ModeSetting)
    assert str(setting) == "silent (from deepcopy_shim.enable('silent'))"
    assert setting.spelled("strict") == "deepcopy_shim.enable('strict')"
    with deepcopy_shim.enabled("strict"):
        inner = deepcopy_shim.current_mode()
        assert inner is not None and inner.source is Source.SCOPE
        assert str(inner) == "strict (from deepcopy_shim.enabled('strict'))"
    assert deepcopy_shim.current_mode() == setting
    for public in (Mode, Source, ModeSetting):
        assert public.__module__ == "deepcopy_shim"


def test_current_mode_is_per_thread_and_task() -> None:
    seen: List[Optional[ModeSetting]] = []
    with deepcopy_shim.enabled("strict"):
        thread = threading.Thread(target=lambda: seen.append(deepcopy_shim.current_mode()))
        thread.start()
        thread.join()

        async def task() -> Optional[ModeSetting]:
            return deepcopy_shim.current_mode()

        in_task = asyncio.run(task())
    assert seen == [None]  # a new thread starts outside every scope
    assert in_task is not None and in_task.mode is Mode.STRICT  # a task inherits its context


def test_enabled_repr_for_every_mode() -> None:
    assert repr(deepcopy_shim.enabled("strict")) == "deepcopy_shim.enabled(mode='strict')"
    assert repr(deepcopy_shim.enabled("off")) == "deepcopy_shim.enabled(mode='off')"


def test_an_off_scope_installs_nothing(cached_net: CachedActivationsNet) -> None:
    from deepcopy_shim import _patch

    with deepcopy_shim.enabled(False):
        assert not (_patch.state() == "installed")
        with pytest.raises(RuntimeError, match="graph leaves"):
            copy.deepcopy(cached_net)
    assert not (_patch.state() == "installed")


@pytest.mark.parametrize(("value", "mode"), [(1, Mode.WARN), (0, None), (True, Mode.WARN), (False, None)])
def test_the_documented_integers_are_accepted_as_integers(value: Any, mode: Optional[Mode]) -> None:
    deepcopy_shim.enable(value)
    setting = deepcopy_shim.current_mode()
    assert (setting.mode if setting else None) is mode
    if setting is not None:
        assert setting.how == f"deepcopy_shim.enable({value!r})"  # as written


def test_a_refused_value_is_told_which_types_are_accepted() -> None:
    with pytest.raises(ValueError, match=r"invalid mode 2; .*also True/False, 1/0 and deepcopy_shim\.Mode"):
        deepcopy_shim.enable(2)


def test_a_setting_reads_as_written_in_str_and_repr() -> None:
    deepcopy_shim.enable(True)
    setting = deepcopy_shim.current_mode()
    assert str(setting) == "warn (from deepcopy_shim.enable(True))"
    assert repr(setting) == "ModeSetting(mode='warn', source='code', how='deepcopy_shim.enable(True)')"
    assert setting is not None and setting.spelled("strict") == "deepcopy_shim.enable('strict')"
    with deepcopy_shim.enabled(Mode.SILENT):
        inner = deepcopy_shim.current_mode()
        assert inner is not None and inner.how == "deepcopy_shim.enabled(deepcopy_shim.Mode.SILENT)"
    assert "{" not in repr(setting) + repr(inner)


def test_enabled_mode_is_read_only() -> None:
    scope = deepcopy_shim.enabled("warn")
    assert scope.mode is Mode.WARN
    with pytest.raises(AttributeError):
        scope.mode = "strict"  # type: ignore[misc]


@pytest.mark.parametrize("what", ["DEEPCOPY_SHIM value", "--mode value", "--deepcopy-shim value",
                                  "ini value deepcopy_shim ="])
def test_a_text_doors_message_lists_only_what_can_be_written_there(what: str) -> None:
    from deepcopy_shim._modes import parse_mode

    with pytest.raises(deepcopy_shim.ModeValueError) as refused:
        parse_mode("loud", what)
    message = str(refused.value)
    assert message.startswith(f"deepcopy_shim: invalid {what} 'loud'; valid values are warn, ")
    assert message.endswith("(in any case)")
    assert "True/False" not in message and "Mode members" not in message


# --- ModeSetting's contract, and what the help texts promise (the _modes triage) ---------------

def test_a_setting_without_a_template_fills_how_as_its_template() -> None:
    setting = ModeSetting(Mode.STRICT, Source.ENVIRONMENT, "DEEPCOPY_SHIM={}")
    assert setting.how == "DEEPCOPY_SHIM=strict" and str(setting) == "strict (from DEEPCOPY_SHIM=strict)"
    assert setting.spelled("silent") == "DEEPCOPY_SHIM=silent" and setting.spelled() == setting.how
    # with a template, `how` is kept as written, braces and all
    written = ModeSetting("warn", Source.PYTEST, "`deepcopy_shim = {on}` in the ini file",
                          "`deepcopy_shim = {}` in the ini file")
    assert written.how == "`deepcopy_shim = {on}` in the ini file"
    assert written.spelled("strict") == "`deepcopy_shim = strict` in the ini file"


def test_settings_are_equal_exactly_when_mode_source_and_how_are() -> None:
    a = ModeSetting(Mode.WARN, Source.CODE, "b", "{}")
    assert a == ModeSetting(Mode.WARN, Source.CODE, "b", "other {}") and hash(a) == hash(
        ModeSetting(Mode.WARN, Source.CODE, "b", "other {}"))
    others = [ModeSetting(mode, source, how, "{}") for mode, source, how in (
        (Mode.WARN, Source.CODE, "a"), (Mode.WARN, Source.CODE, "c"),
        (Mode.STRICT, Source.CODE, "b"), (Mode.WARN, Source.SCOPE, "b"))]
    for other in others:
        assert a != other and other != a and not (a == other) and not (other == a)
    assert a != "warn" and (a == object()) is False


def test_the_help_texts_list_exactly_the_words_a_text_door_accepts() -> None:
    """The runner's --help and the pytest option's help name the on and off words: each one
    they name is accepted, and each accepted word is named."""
    from deepcopy_shim import _runner, pytest_plugin
    from deepcopy_shim._modes import parse_mode

    for text, pattern in ((_runner.help_text("deepcopy-shim"),
                           r"also (\S+) \(warn\) and (\S+) \(run with the shim off\)"),
                          (pytest_plugin._option_help(), r"also (\S+) for warn; (\S+) for off")):
        found = re.search(pattern, " ".join(text.split()))
        assert found is not None, text
        on, off = found.group(1).split("/"), found.group(2).split("/")
        assert on == list(ON_WORDS) and off == list(OFF_WORDS)
        assert all(parse_mode(w, "--mode value") is Mode.WARN for w in on)
        assert all(parse_mode(w, "--mode value") is None for w in off)


def test_a_task_cannot_leave_the_scope_its_parent_task_entered() -> None:
    """A task inherits its parent's scopes (its context), not the right to leave them."""
    scope = deepcopy_shim.enabled("silent")

    async def parent() -> str:
        scope.start()

        async def child() -> str:
            try:
                scope.stop()
            except RuntimeError as exc:
                return str(exc)
            return "left"

        said = await asyncio.create_task(child())
        assert deepcopy_shim.current_mode() is not None  # still the parent's scope
        scope.stop()
        assert deepcopy_shim.current_mode() is None
        return said

    assert asyncio.run(parent()).startswith("deepcopy_shim.enabled.stop() without a matching start()")


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_a_child_forked_while_another_thread_changes_the_global_setting_can_change_it() -> None:
    """The lock that guards the global setting is made anew in a forked child: the thread
    that held it at the fork does not exist there."""
    said = run_forking("""
        import signal
        from deepcopy_shim import _modes
        held, release = threading.Event(), threading.Event()
        def holds_the_lock():
            with _modes._global_lock:
                held.set(); release.wait(20)
        thread = threading.Thread(target=holds_the_lock); thread.start(); held.wait(20)
        def child():  # one thread, which must not wait for the other's lock
            signal.alarm(10)
            deepcopy_shim.enable("silent")
            return disable_removes()
        status = fork_and(child)
        release.set(); thread.join()
        print("child", status)
    """)
    assert said.strip().endswith("child 0"), said
