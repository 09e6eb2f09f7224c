"""What the modes report is what the copy did: the tensors it detached (warn), the tensors it met
(strict), with paths a user can paste, at the user's line, in messages that read well."""

from __future__ import annotations

import copy
import functools
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any, Dict, List

import pytest
import torch
import torch.nn as nn
from support.lines import marked_line
from support.models import CachedActivationsNet, ObjectIdMemo, native_refuses, resolve, with_history

import deepcopy_shim
from deepcopy_shim import DeepcopyShimWarning, DetachedTensorsWarning, NonLeafTensorError

pytestmark = pytest.mark.filterwarnings("default::deepcopy_shim.DeepcopyShimWarning")

PATHS = CachedActivationsNet.PATHS


def warned(call: Any) -> List[warnings.WarningMessage]:
    """Every warning ``call()`` emits, none filtered."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return caught


def refusal(call: Any) -> NonLeafTensorError:
    with pytest.raises(NonLeafTensorError) as info:
        call()
    return info.value


# --- mode warn: one warning per top-level copy, naming what was detached --------------------


def test_warn_emits_one_warning_naming_every_tensor(cached_net: CachedActivationsNet) -> None:
    deepcopy_shim.enable("warn")
    caught = warned(lambda: copy.deepcopy(cached_net))  # line: warn-call
    assert len(caught) == 1
    w = caught[0]
    assert issubclass(w.category, DetachedTensorsWarning) and issubclass(w.category, UserWarning)
    assert w.message.paths == PATHS
    assert str(w.message) == textwrap.dedent("""\
        deepcopy_shim: deep copy of a CachedActivationsNet detached 3 tensors with autograd history:
          head.last_out: grad_fn=AddmmBackward0, shape=(3, 2), dtype=torch.float32
          cache['mid']: grad_fn=ReluBackward0, shape=(3, 8), dtype=torch.float32
          cache['list'][0]: grad_fn=MulBackward0, shape=(3, 8), dtype=torch.float32
        Each copy is a leaf with the same values and requires_grad, without the graph. Mode
        'warn' is set by deepcopy_shim.enable('warn'): deepcopy_shim.enable('silent') copies
        without this warning, deepcopy_shim.enable('strict') refuses such copies; or detach
        these tensors before copying.""")
    # it points at the line that called copy.deepcopy, not inside copy or the shim
    assert (w.filename, w.lineno) == (__file__, marked_line(__file__, "warn-call"))


def test_paths_start_at_the_outermost_copied_object(cached_net: CachedActivationsNet) -> None:
    deepcopy_shim.enable("warn")
    (w,) = warned(lambda: copy.deepcopy({"model": cached_net, "step": 3}))
    assert w.message.paths == tuple(f"['model'].{p}" for p in PATHS)
    assert "deep copy of a dict detached 3 tensors" in str(w.message)


def test_each_top_level_copy_warns_once(cached_net: CachedActivationsNet) -> None:
    deepcopy_shim.enable()
    assert len(warned(lambda: [copy.deepcopy(cached_net) for _ in range(3)])) == 3


class FreshCopyInside:
    """A custom ``__deepcopy__`` that starts a copy of its own (a new memo) inside the user's."""

    def __init__(self, cache: Dict[str, torch.Tensor]) -> None:
        self.cache = cache

    def __deepcopy__(self, memo: Dict[int, Any]) -> FreshCopyInside:
        return FreshCopyInside(copy.deepcopy(self.cache))


def test_a_copy_started_inside_a_custom_deepcopy_is_part_of_the_users_copy() -> None:
    obj = {"outer": with_history(), "inner": FreshCopyInside({"t": with_history()})}
    (w,) = warned(lambda: deepcopy_shim.deepcopy(obj, "warn"))
    assert w.message.paths == ("['outer']", "['inner'].cache['t']")


def test_leaf_only_copies_say_nothing_in_any_mode() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    with torch.no_grad():
        model.out = model(torch.randn(1, 2))
    for mode in ("warn", "strict", "silent"):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            deepcopy_shim.deepcopy(model, mode=mode)
            deepcopy_shim.deepcopy({"t": torch.ones(2)}, mode=mode)


def test_silent_says_nothing(cached_net: CachedActivationsNet) -> None:
    deepcopy_shim.enable("silent")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        copy.deepcopy(cached_net)


def test_warnings_escalate_with_filters(cached_net: CachedActivationsNet) -> None:
    deepcopy_shim.enable("warn")
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeepcopyShimWarning)
        with pytest.raises(DetachedTensorsWarning):
            copy.deepcopy(cached_net)


def test_W_error_on_the_command_line() -> None:
    """Every message starts with "deepcopy_shim", so `python -W error:deepcopy_shim` escalates
    them all (CPython cannot resolve a third-party category given to -W at start-up, bpo-22543)."""
    code = textwrap.dedent(
        """
        import copy, torch, deepcopy_shim
        deepcopy_shim.enable()
        t = torch.ones(2, requires_grad=True) * 2
        try:
            copy.deepcopy(t)
        except deepcopy_shim.DeepcopyShimWarning as w:
            print("escalated:", type(w).__name__)
        """
    )
    result = subprocess.run([sys.executable, "-W", "error:deepcopy_shim", "-c", code],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "escalated: DetachedTensorsWarning"


# --- where the warning points --------------------------------------------------------------


def test_warning_points_at_the_user_line_through_torch(cached_net: CachedActivationsNet) -> None:
    from torch.optim.swa_utils import AveragedModel

    deepcopy_shim.enable("warn")
    (w,) = warned(lambda: AveragedModel(cached_net))  # line: averaged
    assert (w.filename, w.lineno) == (__file__, marked_line(__file__, "averaged"))


def test_warning_points_at_the_user_line_through_an_installed_library(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cached_net: CachedActivationsNet
) -> None:
    """A library in a site-packages directory makes the copy (as Lightning, timm or trl do)."""
    package = tmp_path / "site-packages" / "ema_library"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(textwrap.dedent(
        """
        import copy

        class EMA:
            def __init__(self, model):
                self.module = self._clone(model)

            def _clone(self, model):
                return copy.deepcopy(model)
        """
    ))
    monkeypatch.syspath_prepend(str(tmp_path / "site-packages"))
    import ema_library

    deepcopy_shim.enable("warn")
    (w,) = warned(lambda: ema_library.EMA(cached_net))  # line: library-call
    assert (w.filename, w.lineno) == (__file__, marked_line(__file__, "library-call"))


def test_one_off_deepcopy_points_at_its_caller(cached_net: CachedActivationsNet) -> None:
    (w,) = warned(lambda: deepcopy_shim.deepcopy(cached_net))  # line: one-off
    assert (w.filename, w.lineno) == (__file__, marked_line(__file__, "one-off"))


# --- mode strict: refuses exactly what the copy met -----------------------------------------


def test_strict_refuses_with_a_precise_report(cached_net: CachedActivationsNet) -> None:
    deepcopy_shim.enable("strict")
    err = refusal(lambda: copy.deepcopy(cached_net))
    assert isinstance(err, RuntimeError) and err.mode is deepcopy_shim.Mode.STRICT
    assert err.paths == PATHS
    assert [t is resolve(cached_net, p) for p, t in zip(err.paths, err.tensors)] == [True] * 3
    assert str(err) == textwrap.dedent("""\
        deepcopy_shim: refused to copy a CachedActivationsNet holding 3 tensors with autograd history:
          head.last_out: grad_fn=AddmmBackward0, shape=(3, 2), dtype=torch.float32
          cache['mid']: grad_fn=ReluBackward0, shape=(3, 8), dtype=torch.float32
          cache['list'][0]: grad_fn=MulBackward0, shape=(3, 8), dtype=torch.float32
        Mode 'strict' is set by deepcopy_shim.enable('strict'). The copy was discarded; nothing
        in the source was detached. deepcopy_shim.enable('warn') or
        deepcopy_shim.enable('silent') copies these tensors as detached leaves; or detach or
        drop them before copying, e.g. (obj is the object copied):
            obj.head.last_out = obj.head.last_out.detach()
            del obj.head.last_out
        torch's refusal: """) + " ".join(str(err.__cause__).split())
    # raised where torch raised, with torch's error as its cause and its words kept
    assert type(err.__cause__) is RuntimeError and "graph leaves" in str(err)
    assert cached_net.head.last_out.grad_fn is not None  # untouched


def test_strict_hint_is_valid_python_for_sequential_children() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    model[0].out = model[0](torch.randn(1, 2))
    err = refusal(lambda: deepcopy_shim.deepcopy(model, "strict"))
    assert err.paths == ("[0].out",)
    assert "\n    obj[0].out = obj[0].out.detach()\n    del obj[0].out\ntorch's refusal: " in str(err)
    obj = model
    obj[0].out = obj[0].out.detach()  # the hint, pasted
    deepcopy_shim.deepcopy(model, "strict")


def test_strict_error_is_catchable_as_runtime_error(cached_net: CachedActivationsNet) -> None:
    with pytest.raises(RuntimeError, match="autograd history"):
        deepcopy_shim.deepcopy({"m": cached_net}, mode="strict")


def test_strict_on_a_bare_nonleaf_tensor() -> None:
    err = refusal(lambda: deepcopy_shim.deepcopy(with_history(), mode="strict"))
    assert err.paths == ("",)
    assert "  <the copied object itself>: grad_fn=MulBackward0" in str(err)


class DropsItsCache:
    """A custom ``__deepcopy__`` that leaves its non-leaf cache out of the copy (as gpytorch's
    prediction strategies do, returning None)."""

    def __init__(self) -> None:
        self.cache = with_history()

    def __deepcopy__(self, memo: Dict[int, Any]) -> None:
        return None


def test_strict_never_refuses_what_native_deepcopy_completes() -> None:
    model = nn.Linear(2, 2)
    model.prediction_strategy = DropsItsCache()
    assert not native_refuses(model)
    native = copy.deepcopy(model)
    strict = deepcopy_shim.deepcopy(model, "strict")
    assert native.prediction_strategy is None and strict.prediction_strategy is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        deepcopy_shim.deepcopy(model, "warn")  # and warn has nothing to say
    assert deepcopy_shim.find_nonleaf_tensors(model) == []


def test_only_what_the_copy_meets_is_reported() -> None:
    """The gpytorch case: a model whose cache is dropped, beside a posterior that is copied."""
    model = nn.Linear(2, 2)
    model.prediction_strategy = DropsItsCache()
    obj = {"model": model, "posterior": {"loc": with_history(), "scale": with_history()}}
    (w,) = warned(lambda: deepcopy_shim.deepcopy(obj, "warn"))
    assert w.message.paths == ("['posterior']['loc']", "['posterior']['scale']")
    assert refusal(lambda: deepcopy_shim.deepcopy(obj, "strict")).paths == w.message.paths


def test_strict_works_with_a_memo_that_supplies_detached_tensors() -> None:
    layer = nn.Linear(2, 2)
    layer.cached = layer(torch.ones(1, 2))
    native = copy.deepcopy(layer, ObjectIdMemo())
    for mode in ("strict", "warn", "silent"):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with deepcopy_shim.enabled(mode):
                made = copy.deepcopy(layer, ObjectIdMemo())
        assert type(made.weight) is type(native.weight)  # plain tensors, as pyro makes them
        assert made.cached.is_leaf and made.cached.data_ptr() == layer.cached.data_ptr()


class KeysMustBeIds(dict):  # type: ignore[type-arg]
    """A memo subclass that fails on any key that is not an object id, in every method it has.

    torch's own ``Tensor.__deepcopy__`` keeps its storage memo under the key ``"torch"``
    (natively, too): that one is allowed.
    """

    def _check(self, key: Any) -> None:
        assert type(key) is int or key == "torch", f"the memo was used with the key {key!r}"

    def get(self, key: Any, default: Any = None) -> Any:
        self._check(key)
        return super().get(key, default)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._check(key)
        super().__setitem__(key, value)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        self._check(key)
        return super().setdefault(key, default)


def test_the_memo_is_used_only_as_deepcopy_uses_it(cached_net: CachedActivationsNet) -> None:
    for mode in ("warn", "strict", "silent"):
        with deepcopy_shim.enabled(mode), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                copy.deepcopy(cached_net, KeysMustBeIds())
            except NonLeafTensorError as err:
                assert err.paths == PATHS
        assert [w.message.paths for w in caught] == ([PATHS] if mode == "warn" else [])


class Recorder:
    def __init__(self) -> None:
        self.outputs: Dict[str, torch.Tensor] = {}

    def hook(self, name: str, module: nn.Module, args: Any, output: torch.Tensor) -> None:
        self.outputs[name] = output


def test_tensors_behind_partial_forward_hooks_are_named() -> None:
    """Feature recorders registered as functools.partial(bound method, name), as trl users do."""
    model = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    recorder = Recorder()
    handle = model[0].register_forward_hook(functools.partial(recorder.hook, "block0"))
    model[2].register_forward_hook(functools.partial(recorder.hook, "block2"))
    model(torch.ones(1, 2))
    expected = tuple(f"[0]._forward_hooks[{handle.id}].func.__self__.outputs['{name}']"
                     for name in ("block0", "block2"))
    (w,) = warned(lambda: deepcopy_shim.deepcopy(model, "warn"))
    assert w.message.paths == expected and "detached 2 tensors" in str(w.message)
    assert refusal(lambda: deepcopy_shim.deepcopy(model, "strict")).paths == expected
    for path in expected:
        assert resolve(model, path) is recorder.outputs[path[-8:-2]]


def test_a_retained_grad_with_its_own_history_is_named_in_the_single_warning() -> None:
    x = torch.randn(3, requires_grad=True)
    y = x * 2
    y.retain_grad()
    (y ** 3).sum().backward(create_graph=True)
    assert not y.is_leaf and not y.grad.is_leaf
    (w,) = warned(lambda: deepcopy_shim.deepcopy({"y": y}, "warn"))
    assert w.message.paths == ("['y']", "['y'].grad")
    assert resolve({"y": y}, "['y'].grad") is y.grad


# --- paths a user can paste -----------------------------------------------------------------


def test_every_spelled_path_resolves_to_its_tensor() -> None:
    class Slotted:
        __slots__ = ("a", "__private")

        def __init__(self) -> None:
            self.a = with_history()
            self.__private = with_history()

    obj: Dict[Any, Any] = {
        "list": [1, with_history()],
        "tuple": (with_history(),),
        "od": __import__("collections").OrderedDict(k=with_history()),
        "slots": Slotted(),
        7: with_history(),
        ("a", 1): with_history(),
        "partial": functools.partial(print, with_history(), sep=with_history()),
        "model": nn.ModuleDict({"x y": nn.Linear(1, 1), "block": nn.ModuleList([nn.Linear(1, 1)])}),
    }
    obj["model"]["x y"].out = with_history()
    obj["model"]["block"][0].out = with_history()
    found = deepcopy_shim.find_nonleaf_tensors(obj)
    assert [p for p, _ in found] == [
        "['list'][1]", "['tuple'][0]", "['od']['k']", "['slots'].a", "['slots']._Slotted__private",
        "[7]", "[('a', 1)]", "['partial'].args[0]", "['partial'].keywords['sep']",
        "['model']['x y'].out", "['model']['block'][0].out",
    ]
    for path, tensor in found:
        assert resolve(obj, path) is tensor, path


def test_a_step_without_a_spelling_is_said_once_with_its_reason() -> None:
    class Doubling:
        """Its state is computed in __getstate__: the tensor exists only inside the copy."""

        def __init__(self, x: torch.Tensor) -> None:
            self.x = x

        def __getstate__(self) -> Dict[str, Any]:
            return {"x": self.x * 2}

    obj = {"set": {with_history(), with_history()}, "doubling": Doubling(torch.ones(2, requires_grad=True))}
    err = refusal(lambda: deepcopy_shim.deepcopy(obj, "strict"))
    assert sorted(err.paths) == sorted([
        "['set'] <a member of this set (sets have no index)>",
        "['set'] <a member of this set (sets have no index)>",
        "['doubling'] <rebuilt from what Doubling.__getstate__ returns>",
    ])
    text = str(err)
    assert text.count("<a member of this set (sets have no index)>") == 1  # once, then the tensors
    assert "  ['set'] <a member of this set (sets have no index)>: 2 tensors\n    grad_fn=" in text


def test_paths_are_the_same_on_every_run(tmp_path: Path) -> None:
    """No memory address or hash order in a path: two interpreters report the same text."""
    code = textwrap.dedent(
        """
        import functools, torch, torch.nn as nn, deepcopy_shim
        class Key:  # a dict key with no literal spelling
            pass
        torch.manual_seed(0)
        t = lambda: torch.ones(2, requires_grad=True) * 2
        obj = {"s": {t()}, Key(): t(), "m": nn.Sequential(nn.Linear(1, 1))}
        obj["m"][0].register_forward_hook(functools.partial(print, t()))
        try:
            deepcopy_shim.deepcopy(obj, "strict")
        except deepcopy_shim.NonLeafTensorError as err:
            print(err.paths)
        """
    )
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                           env={**__import__("os").environ, "PYTHONHASHSEED": seed})
            for seed in ("1", "2")]
    assert runs[0].returncode == 0, runs[0].stderr
    assert runs[0].stdout == runs[1].stdout and "0x" not in runs[0].stdout
    assert "<under a key of this dict that has no literal spelling (Key)>" in runs[0].stdout


# --- messages that read well at any size ----------------------------------------------------


def test_a_large_report_lists_twenty_paths_and_says_how_many_more() -> None:
    model = nn.ModuleList([nn.Linear(1, 1) for _ in range(500)])
    for layer in model:
        layer.out = layer(torch.ones(1, 1))
    (w,) = warned(lambda: deepcopy_shim.deepcopy(model, "warn"))
    lines = str(w.message).splitlines()
    assert len(w.message.paths) == 500 and w.message.paths[-1] == "[499].out"
    assert len(lines) < 30 and max(map(len, lines)) < 100
    assert "  ... and 480 more (all are in the warning's .paths)" in lines
    err = refusal(lambda: deepcopy_shim.deepcopy(model, "strict"))
    assert len(err.paths) == 500 and "  ... and 480 more (all are in the error's .paths)" in str(err)


def test_the_first_line_is_short(cached_net: CachedActivationsNet) -> None:
    (w,) = warned(lambda: deepcopy_shim.deepcopy(cached_net, "warn"))
    err = refusal(lambda: deepcopy_shim.deepcopy(cached_net, "strict"))
    for text in (str(w.message), str(err)):
        assert len(text.splitlines()[0]) <= 100, text


# --- find_nonleaf_tensors follows the same rules -------------------------------------------


def test_find_nonleaf_tensors_lists_exactly_what_a_copy_detaches(cached_net: CachedActivationsNet) -> None:
    found = deepcopy_shim.find_nonleaf_tensors(cached_net)
    assert [p for p, _ in found] == list(PATHS)
    assert found[0][1] is cached_net.head.last_out
    (w,) = warned(lambda: deepcopy_shim.deepcopy(cached_net, "warn"))
    assert w.message.paths == PATHS
    assert not deepcopy_shim.is_enabled()  # it enabled nothing


def test_find_nonleaf_tensors_on_leaves_and_plain_values() -> None:
    model = nn.Linear(2, 2)
    with torch.no_grad():
        model.out = model(torch.randn(1, 2))
    assert deepcopy_shim.find_nonleaf_tensors([model, "text", 3, None, torch.ones(2), print, int]) == []
    with pytest.raises(TypeError, match="cannot pickle 'module' object"):  # as the copy would
        deepcopy_shim.find_nonleaf_tensors([nn])


def test_weight_norm_is_found_before_any_forward() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # the hook-based weight_norm is deprecated
        layer = torch.nn.utils.weight_norm(nn.Linear(3, 3))
    assert [p for p, _ in deepcopy_shim.find_nonleaf_tensors(layer)] == ["weight"]


# --- the remedy names the door the mode came through ----------------------------------------


def test_the_remedy_names_how_the_mode_was_set(cached_net: CachedActivationsNet) -> None:
    with deepcopy_shim.enabled("warn"):
        (w,) = warned(lambda: copy.deepcopy(cached_net))
    assert "deepcopy_shim.enabled('silent') copies without this warning" in " ".join(str(w.message).split())
    (w,) = warned(lambda: deepcopy_shim.deepcopy(cached_net))
    assert "deepcopy_shim.deepcopy(obj, mode='strict') refuses" in " ".join(str(w.message).split())


def test_the_remedy_names_the_environment_variable() -> None:
    code = textwrap.dedent(
        """
        import copy, warnings, torch, deepcopy_shim
        t = torch.ones(2, requires_grad=True) * 2
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            copy.deepcopy(t)
        print(" ".join(str(caught[0].message).split()))
        print(deepcopy_shim.current_mode())
        """
    )
    env = {**__import__("os").environ, "DEEPCOPY_SHIM": "warn"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            env=env)
    assert result.returncode == 0, result.stderr
    message, mode = result.stdout.strip().splitlines()
    assert "Mode 'warn' is set by DEEPCOPY_SHIM=warn: DEEPCOPY_SHIM=silent copies" in message
    assert "DEEPCOPY_SHIM=strict refuses such copies" in message
    assert mode == "warn (from DEEPCOPY_SHIM=warn)"


def test_a_tensor_under_two_names_is_named_by_the_first() -> None:
    """The copy meets an aliased tensor under its first attribute, and so does the report."""
    layer = nn.Linear(2, 2)
    out = layer(torch.ones(1, 2))
    layer.first = out
    layer.second = out
    assert [p for p, _ in deepcopy_shim.find_nonleaf_tensors(layer)] == ["first"]


@pytest.mark.parametrize(("name", "article"), [
    ("Actor", "an"), ("MLP", "an"), ("LSTMCell", "an"), ("GPT2Model", "a"), ("Net", "a"),
    ("Unit", "a"), ("UpBlock", "an"), ("ActorCriticWrapper", "an"),
])
def test_messages_use_the_article_the_class_name_is_read_with(name: str, article: str) -> None:
    cls = type(name, (nn.Module,), {})
    model = cls()
    model.cached = with_history()
    (w,) = warned(lambda: deepcopy_shim.deepcopy(model, "warn"))
    assert str(w.message).startswith(f"deepcopy_shim: deep copy of {article} {name} detached 1 tensor")


def test_a_bare_tensor_refusal_suggests_no_statement_on_obj_itself() -> None:
    err = refusal(lambda: deepcopy_shim.deepcopy(with_history(), "strict"))
    assert "obj = obj.detach()" not in str(err) and "del obj\n" not in str(err)
    assert "or detach or drop them before copying." in " ".join(str(err).split())


STRICT_UNDER_PYTEST = """
import copy, torch, torch.nn as nn

def test_copies_a_model_that_caches():
    model = nn.Linear(2, 2)
    model.cached = model(torch.ones(1, 2))
    copy.deepcopy(model)  # line: user-copy
"""


@pytest.mark.parametrize("options", [
    ["--deepcopy-shim=strict"],
    ["--deepcopy-shim=warn", "-W", "error::deepcopy_shim.DeepcopyShimWarning"],
], ids=["strict", "warn as error"])
def test_a_refusal_under_pytest_shows_the_users_frames_not_the_shims(options: List[str],
                                                                     tmp_path: Path) -> None:
    """pytest prints the user's line and copy's, with its location line in copy.py: none of the
    shim's frames, which read as a crash of the shim (`__tracebackhide__`)."""
    (tmp_path / "test_user.py").write_text(STRICT_UNDER_PYTEST.lstrip())
    result = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *options,
                             "test_user.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stdout
    assert "deepcopy_shim/" not in result.stdout, result.stdout
    locations = re.findall(r"^(\S+\.py):\d+: (?:NonLeafTensorError|DetachedTensorsWarning)$",
                           result.stdout, re.M)
    assert locations and Path(locations[-1]).name == "copy.py", result.stdout
    assert "test_user.py:6: " in result.stdout  # the user's own line, with its source shown
