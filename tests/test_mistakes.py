"""Mistakes a new user makes at the API, each answered by one short line that says what was
meant, and leaving the process as it was: `enable` for `enabled`, arguments swapped, the
memo `copy.deepcopy` takes, a mode misspelt."""

from __future__ import annotations

import copy
import gc
import io
import sys
from contextlib import redirect_stderr
from typing import Any, Callable, List, Optional, Tuple

import pytest
import torch
import torch.nn as nn
from support.processes import DEV_PYTHON, clean_env, describe, run

import deepcopy_shim
from deepcopy_shim import Mode, ModeSetting, Source, _activation, _bootstrap, _modes, _patch, _runner

# An error about a bad value is one line, this short whatever the value (a 200-layer model's
# repr is 12 KB, a 5,000-entry memo's 58 KB).
SHORT = 300


def one_short_line(exc: BaseException) -> str:
    said = str(exc)
    assert "\n" not in said and len(said) < SHORT, (len(said), said[:400])
    return said


def big_model() -> nn.Sequential:
    return nn.Sequential(*[nn.Linear(2, 2) for _ in range(200)])


def with_history() -> torch.Tensor:
    with torch.enable_grad():
        return torch.ones(3, requires_grad=True) * 2


# --- enable() where enabled() was meant -------------------------------------------------------


def state() -> Tuple[Optional[ModeSetting], int, str]:
    """The global setting (the very object), the users of the patch, and the patch's state."""
    return _modes.global_setting(), _patch._users, _patch.state()


def set_before(before: str) -> None:
    if before == "strict by code":
        deepcopy_shim.enable("strict")
    elif before == "silent by DEEPCOPY_SHIM":  # what start-up activation does
        _activation.set_global(ModeSetting(Mode.SILENT, Source.ENVIRONMENT, "DEEPCOPY_SHIM=silent"))


def enter(mode: Any) -> None:
    with deepcopy_shim.enable(mode):
        raise AssertionError("the block ran")  # pragma: no cover - entering raises


def decorate(mode: Any) -> None:
    @deepcopy_shim.enable(mode)
    def make_target(net: Any) -> Any:  # pragma: no cover - decorating raises
        return copy.deepcopy(net)


@pytest.mark.parametrize("before", ["off", "strict by code", "silent by DEEPCOPY_SHIM"])
@pytest.mark.parametrize("mode", ["silent", "off", True])
@pytest.mark.parametrize("use", [enter, decorate], ids=["with", "decorator"])
def test_enable_used_as_a_scope_is_one_line_naming_enabled_and_leaves_the_process_as_it_was(
        before: str, mode: Any, use: Callable[[Any], None]) -> None:
    set_before(before)
    was, mode_was = state(), deepcopy_shim.current_mode()
    with pytest.raises(TypeError) as refused:
        use(mode)
    said = one_short_line(refused.value)
    written = repr(mode)
    assert said.startswith(f"deepcopy_shim.enable({written}) switches the shim for the whole process")
    form = (f"`with deepcopy_shim.enabled({written}):` for a block" if use is enter
            else f"`@deepcopy_shim.enabled({written})` for a function")
    assert said.endswith(f"so it was undone; use {form}"), said
    assert state() == was and deepcopy_shim.current_mode() == mode_was  # users of the patch too
    deepcopy_shim.disable()
    assert _patch.state() == "off" and _patch._users == 0


def test_enable_used_as_a_scope_before_torch_is_imported_leaves_nothing_waiting() -> None:
    """In a fresh interpreter, before `import torch`: the patch that `enable()` left waiting for
    torch is given back with its user, so importing torch afterwards installs nothing."""
    code = ("import deepcopy_shim\nfrom deepcopy_shim import _patch\n"
            "try:\n    with deepcopy_shim.enable('silent'):\n        pass\n"
            "except TypeError as exc:\n    print('said', exc)\n"
            "import torch\nprint(deepcopy_shim.current_mode(), _patch._users, _patch.state())\n")
    proc = run([DEV_PYTHON, "-c", code], clean_env())
    assert proc.returncode == 0 and proc.stderr == "", describe(proc)
    said, after = proc.stdout.splitlines()
    assert said.startswith("said deepcopy_shim.enable('silent') switches the shim") and after == "None 0 off"


def test_a_later_change_of_the_global_mode_is_kept() -> None:
    """The object undoes its own call only: if the global mode changed since, that stays."""
    made = deepcopy_shim.enable("silent")
    deepcopy_shim.enable("strict")
    was = state()
    with pytest.raises(TypeError, match=r"is not a scope, so the mode set since is kept; use `with "
                                        r"deepcopy_shim\.enabled\('silent'\):` for a block"):
        with made:
            pass  # pragma: no cover
    assert state() == was


def test_enable_as_a_statement_is_as_before_and_what_it_returns_holds_nothing_heavy() -> None:
    made = deepcopy_shim.enable("silent")
    assert str(deepcopy_shim.current_mode()) == "silent (from deepcopy_shim.enable('silent'))"
    assert repr(made) == "<deepcopy_shim.enable('silent'): mode silent for the whole process>"
    assert repr(deepcopy_shim.enable(False)) == "<deepcopy_shim.enable(False): off for the whole process>"
    assert not deepcopy_shim.is_enabled()
    assert not hasattr(made, "__dict__")  # slots: the call as written and two settings, no more
    assert all(isinstance(held, (str, ModeSetting, type(None))) or held is type(made)
               for held in gc.get_referents(made))


def test_in_the_repl_enable_shows_one_line_saying_what_it_did() -> None:
    """A REPL (or a notebook) shows the value of an expression statement: one line that says
    what the call did; the shim is on as after the statement in a script."""
    code = ("import code, sys\nconsole = code.InteractiveConsole()\n"
            "for line in ['import deepcopy_shim', \"deepcopy_shim.enable('silent')\", "
            "'print(deepcopy_shim.current_mode())']:\n    console.push(line)\n")
    proc = run([DEV_PYTHON, "-c", code], clean_env())
    assert proc.returncode == 0 and proc.stderr == "", describe(proc)
    assert proc.stdout.splitlines() == [
        "<deepcopy_shim.enable('silent'): mode silent for the whole process>",
        "silent (from deepcopy_shim.enable('silent'))"]


# --- a bad value: one short line, whatever the value -----------------------------------------


@pytest.mark.parametrize("door", [
    deepcopy_shim.enable, deepcopy_shim.enabled, lambda value: deepcopy_shim.deepcopy(1, mode=value)],
    ids=["enable", "enabled", "deepcopy"])
def test_a_bad_mode_value_is_one_short_line_naming_its_type(door: Callable[[Any], Any]) -> None:
    with pytest.raises(TypeError) as refused:
        door(big_model())
    said = one_short_line(refused.value)
    assert said.startswith("deepcopy_shim: mode must be a str, a deepcopy_shim.Mode, a bool or 0/1, "
                           "not Sequential (Sequential( (0): Linear("), said
    with pytest.raises(deepcopy_shim.ModeValueError) as refused:
        door("loud" * 2_500)
    assert one_short_line(refused.value).startswith("deepcopy_shim: invalid mode 'loudloud")
    assert not deepcopy_shim.is_enabled()


def test_arguments_swapped_say_which_comes_first() -> None:
    with pytest.raises(TypeError) as refused:
        deepcopy_shim.deepcopy("silent", big_model())  # type: ignore[call-overload]
    said = one_short_line(refused.value)
    assert said.startswith("deepcopy_shim: deepcopy()'s second argument is the memo, a dict as "
                           "copy.deepcopy takes, or the mode; not Sequential (Sequential( (0): ")
    assert said.endswith("; the object to copy comes first: deepcopy_shim.deepcopy(obj, mode='silent')")
    with pytest.raises(TypeError) as refused:
        deepcopy_shim.deepcopy(big_model(), 3.5)  # type: ignore[arg-type]
    assert one_short_line(refused.value).endswith("or the mode; not float (3.5)")


# --- deepcopy() takes what copy.deepcopy takes ------------------------------------------------


def test_deepcopy_takes_the_memo_second_as_copy_deepcopy_does() -> None:
    source = {"t": with_history(), "leaf": torch.zeros(2), "items": [1, 2]}
    big_memo: dict = {i: i for i in range(5_000)}  # a memo of copy's keys, ids, never collides
    made = deepcopy_shim.deepcopy(source, big_memo, mode="silent")
    assert made["t"].is_leaf and torch.equal(made["t"], source["t"].detach())
    assert big_memo[id(source)] is made and big_memo[id(source["t"])] is made["t"]
    # as copy.deepcopy: what the memo holds is the copy (the same object, copied again)
    again = deepcopy_shim.deepcopy(source["items"], big_memo)
    assert again is made["items"]
    # a memo the caller filled, as copy.deepcopy's callers do to keep objects shared
    keep = torch.ones(1)
    native = copy.deepcopy([keep, 3], {id(keep): keep})
    shimmed = deepcopy_shim.deepcopy([keep, 3], {id(keep): keep})
    assert native[0] is keep and shimmed[0] is keep and shimmed == [keep, 3]


def test_the_mode_given_second_is_still_the_mode_and_not_given_twice() -> None:
    source = {"t": with_history()}
    assert deepcopy_shim.deepcopy(source, "silent")["t"].is_leaf  # as earlier releases took it
    assert deepcopy_shim.deepcopy(source, mode="silent")["t"].is_leaf
    with pytest.raises(deepcopy_shim.NonLeafTensorError):
        deepcopy_shim.deepcopy(source, Mode.STRICT)
    with pytest.raises(RuntimeError, match="graph leaves"):  # 0: off, a native copy
        deepcopy_shim.deepcopy(source, 0)
    with pytest.raises(TypeError) as refused:
        deepcopy_shim.deepcopy(source, "silent", mode="strict")  # type: ignore[arg-type]
    assert one_short_line(refused.value) == (
        "deepcopy_shim: deepcopy() got two modes, 'silent' second and mode='strict'; give one, "
        "by keyword: mode=...")


# --- a misspelt mode: did you mean, at every door -----------------------------------------------


@pytest.mark.parametrize(("typed", "meant"), [
    ("strcit", "strict"), ("Silnet", "silent"), ("warm", "warn"), ("of", "off"), ("ture", "true")])
def test_a_near_miss_says_what_was_probably_meant_at_every_door(typed: str, meant: str,
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    guess = f"{typed!r} (did you mean {meant!r}?); valid values are warn, strict, silent;"
    for door in (deepcopy_shim.enable, deepcopy_shim.enabled, Mode.parse,
                 lambda value: deepcopy_shim.deepcopy(1, mode=value)):
        with pytest.raises(deepcopy_shim.ModeValueError, match="did you mean") as refused:
            door(typed)
        assert f"invalid mode {guess}" in one_short_line(refused.value)
    # the runner's --mode, and DEEPCOPY_SHIM as the runner and start-up activation read it
    monkeypatch.setattr(sys, "argv", ["deepcopy-shim"])
    assert _runner.run([f"--mode={typed}", "x.py"]) == 2
    assert f"deepcopy_shim: invalid --mode value {guess}" in capsys.readouterr().err
    monkeypatch.setenv("DEEPCOPY_SHIM", typed)
    assert _runner.run(["x.py"]) == 2
    assert f"deepcopy_shim: invalid DEEPCOPY_SHIM value {guess}" in capsys.readouterr().err
    stderr = io.StringIO()
    with redirect_stderr(stderr):
        assert _bootstrap.activate_from_environment({"DEEPCOPY_SHIM": typed}) is None
    assert f"deepcopy_shim: invalid DEEPCOPY_SHIM value {guess}" in stderr.getvalue()
    assert not deepcopy_shim.is_enabled()


@pytest.mark.parametrize("typed", ["loud", "maybe", "none", "2", ""])
def test_no_guess_where_nothing_is_close_or_the_closest_means_something_else(typed: str) -> None:
    """`none` is near `on` in letters but means the opposite: no guess is better than that one."""
    with pytest.raises(deepcopy_shim.ModeValueError) as refused:
        deepcopy_shim.enable(typed)
    assert "did you mean" not in one_short_line(refused.value)


def test_the_pytest_option_says_it_too(tmp_path: Any) -> None:
    (tmp_path / "test_x.py").write_text("def test_x():\n    pass\n")
    proc = run([DEV_PYTHON, "-m", "pytest", "-p", "no:cacheprovider", "--deepcopy-shim=strcit"],
               clean_env(), cwd=tmp_path)
    assert proc.returncode == 4, describe(proc)
    said: List[str] = [line for line in proc.stderr.splitlines() if line.strip()]
    assert said == [line for line in said if line.startswith("ERROR: deepcopy_shim: invalid "
                                                              "--deepcopy-shim value 'strcit' (did "
                                                              "you mean 'strict'?); valid values")]
    assert len(said) == 1, describe(proc)
