"""What each mode says: one warning per top-level copy, a precise strict refusal, or nothing."""

from __future__ import annotations

import copy
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
import torch.nn as nn
from conftest import CachingNet

import deepcopy_shim
from deepcopy_shim import DeepcopyShimWarning, DetachedTensorsWarning, NonLeafTensorError

pytestmark = pytest.mark.filterwarnings("default::deepcopy_shim.DeepcopyShimWarning")

PATHS = ["head.last_out", "cache['mid']", "cache['list'][0]"]


def test_warn_emits_one_warning_naming_every_tensor(caching_net: CachingNet) -> None:
    deepcopy_shim.enable("warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        copy.deepcopy(caching_net)
    assert len(caught) == 1
    w = caught[0]
    assert issubclass(w.category, DetachedTensorsWarning) and issubclass(w.category, DeepcopyShimWarning)
    assert issubclass(w.category, UserWarning)
    text = str(w.message)
    assert "detached 3 non-leaf tensors" in text and "mode='warn'" in text
    assert "  cache['mid']: grad_fn=ReluBackward0, shape=(3, 8), dtype=torch.float32" in text
    assert "  cache['list'][0]: grad_fn=MulBackward0, shape=(3, 8), dtype=torch.float32" in text
    assert "  head.last_out: grad_fn=AddmmBackward0, shape=(3, 2), dtype=torch.float32" in text
    assert "a conftest.CachingNet" in text
    # it points at the line above that called copy.deepcopy, not inside copy or the shim
    assert w.filename == __file__
    assert w.lineno == test_warn_emits_one_warning_naming_every_tensor.__code__.co_firstlineno + 4


def test_warn_paths_are_relative_to_the_outermost_copied_object(caching_net: CachingNet) -> None:
    deepcopy_shim.enable("warn")
    with pytest.warns(DetachedTensorsWarning) as record:
        copy.deepcopy({"model": caching_net, "step": 3})
    assert len(record) == 1
    assert "  ['model'].head.last_out: grad_fn=AddmmBackward0" in str(record[0].message)
    assert "deep copy of a dict" in str(record[0].message)


def test_warning_points_at_the_user_line_through_library_code(caching_net: CachingNet) -> None:
    from torch.optim.swa_utils import AveragedModel

    deepcopy_shim.enable("warn")
    with pytest.warns(DetachedTensorsWarning) as record:
        AveragedModel(caching_net)
    assert record[0].filename == __file__


def test_warn_via_deepcopy_function_points_at_caller(caching_net: CachingNet) -> None:
    with pytest.warns(DetachedTensorsWarning) as record:
        deepcopy_shim.deepcopy(caching_net)
    assert len(record) == 1 and record[0].filename == __file__


def test_each_top_level_copy_warns_once(caching_net: CachingNet) -> None:
    deepcopy_shim.enable()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            copy.deepcopy(caching_net)
    assert len(caught) == 3


def test_leaf_only_copies_say_nothing_in_any_mode() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    with torch.no_grad():
        model.out = model(torch.randn(1, 2))
    for mode in ("warn", "strict", "silent"):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            deepcopy_shim.deepcopy(model, mode=mode)
            deepcopy_shim.deepcopy({"t": torch.ones(2)}, mode=mode)


def test_silent_says_nothing(caching_net: CachingNet) -> None:
    deepcopy_shim.enable("silent")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        copy.deepcopy(caching_net)


def test_strict_refuses_before_copying_with_a_precise_report(caching_net: CachingNet) -> None:
    deepcopy_shim.enable("strict")
    with pytest.raises(NonLeafTensorError) as info:
        copy.deepcopy(caching_net)
    err = info.value
    assert isinstance(err, RuntimeError)
    assert err.paths == tuple(PATHS) and err.mode is deepcopy_shim.Mode.STRICT
    text = str(err)
    assert "mode='strict'" in text and "refused to deep-copy a conftest.CachingNet" in text
    assert "3 non-leaf tensors" in text
    assert "  head.last_out: grad_fn=AddmmBackward0, shape=(3, 2), dtype=torch.float32" in text
    assert "Nothing was copied and the source is unchanged" in text
    assert "mode='warn'" in text and "mode='silent'" in text
    assert "`obj.head.last_out = obj.head.last_out.detach()` or `del obj.head.last_out`" in text
    assert caching_net.head.last_out.grad_fn is not None  # untouched


def test_strict_refuses_before_any_tensor_is_copied(
    caching_net: CachingNet, monkeypatch: pytest.MonkeyPatch
) -> None:
    copies = []
    original = torch.nn.Parameter.__deepcopy__

    def counting(self: torch.nn.Parameter, memo: dict) -> torch.nn.Parameter:
        copies.append(self)
        return original(self, memo)

    monkeypatch.setattr(torch.nn.Parameter, "__deepcopy__", counting)
    with pytest.raises(NonLeafTensorError):
        deepcopy_shim.deepcopy(caching_net, mode="strict")
    with pytest.raises(NonLeafTensorError):
        with deepcopy_shim.enabled("strict"):
            copy.deepcopy(caching_net)
    assert copies == []


def test_strict_error_is_catchable_as_runtime_error(caching_net: CachingNet) -> None:
    with pytest.raises(RuntimeError, match="non-leaf tensors"):
        deepcopy_shim.deepcopy({"m": caching_net}, mode="strict")


def test_strict_on_bare_nonleaf_tensor() -> None:
    y = torch.ones(2, requires_grad=True) * 2
    with pytest.raises(NonLeafTensorError) as info:
        deepcopy_shim.deepcopy(y, mode="strict")
    assert info.value.paths == ("",)
    assert "<the copied object itself>: grad_fn=MulBackward0" in str(info.value)


class Doubling:
    """Its state is computed in __getstate__: the non-leaf tensor exists only during the copy."""

    def __init__(self, x: torch.Tensor) -> None:
        self.x = x

    def __getstate__(self) -> dict:
        return {"x": self.x * 2}


def test_strict_reports_a_tensor_hidden_behind_a_custom_protocol() -> None:
    obj = Doubling(torch.ones(2, requires_grad=True))
    assert deepcopy_shim.find_nonleaf_tensors(obj) == []
    with pytest.raises(NonLeafTensorError) as info:
        deepcopy_shim.deepcopy(obj, mode="strict")
    assert info.value.paths == ("<reached only through a custom copy protocol>",)


def test_warn_names_a_tensor_hidden_behind_a_custom_protocol() -> None:
    with pytest.warns(DetachedTensorsWarning, match="custom copy protocol>: grad_fn=MulBackward0"):
        copied = deepcopy_shim.deepcopy(Doubling(torch.ones(2, requires_grad=True)))
    assert copied.x.is_leaf and torch.equal(copied.x, torch.full((2,), 2.0))


def test_warnings_escalate_with_filters(caching_net: CachingNet) -> None:
    deepcopy_shim.enable("warn")
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeepcopyShimWarning)
        with pytest.raises(DetachedTensorsWarning):
            copy.deepcopy(caching_net)


def test_W_error_on_the_command_line() -> None:
    """Every shim warning starts with "deepcopy_shim", so `python -W error:deepcopy_shim` escalates
    them all (CPython cannot resolve a third-party category given to -W at start-up, bpo-22543;
    pytest's -W and filterwarnings can, and this suite runs with the category escalated)."""
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
    result = subprocess.run(
        [sys.executable, "-W", "error:deepcopy_shim", "-c", code],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "escalated: DetachedTensorsWarning"
