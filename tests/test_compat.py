"""A torch the shim was not tested with: safe and visible, never refused by the package metadata."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
from support.models import CachedActivationsNet

import deepcopy_shim
from deepcopy_shim import TorchCompatibilityWarning, _report, _tested

ROOT = Path(__file__).resolve().parent.parent


def test_a_newer_torch_gets_one_note_in_mode_warn(
    monkeypatch: pytest.MonkeyPatch, cached_net: CachedActivationsNet
) -> None:
    monkeypatch.setattr(torch, "__version__", "2.16.0")
    monkeypatch.setattr(_report, "_untested_noted", False)
    for mode in ("silent", "strict"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                deepcopy_shim.deepcopy(cached_net, mode)
            except deepcopy_shim.NonLeafTensorError:
                pass
        assert not [w for w in caught if w.category is TorchCompatibilityWarning]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        deepcopy_shim.deepcopy(cached_net, "warn")
        deepcopy_shim.deepcopy(cached_net, "warn")
    notes = [w for w in caught if w.category is TorchCompatibilityWarning]
    assert len(notes) == 1 and notes[0].filename == __file__  # once per process
    text = " ".join(str(notes[0].message).split())
    assert "torch 2.16.0 is newer than any release deepcopy-shim was tested with (newest: 2.15)" in text
    assert "python -m deepcopy_shim --check" in text


def test_a_tested_torch_gets_no_note(monkeypatch: pytest.MonkeyPatch,
                                     cached_net: CachedActivationsNet) -> None:
    monkeypatch.setattr(_report, "_untested_noted", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        deepcopy_shim.deepcopy(cached_net, "warn")
    assert [w.category for w in caught] == [deepcopy_shim.DetachedTensorsWarning]


@pytest.mark.parametrize(("version", "newer"), [
    ("2.15.0", False), ("2.15.9+cu130", False), ("2.16.0", True), ("2.16.0a0+git1234", True),
    ("3.0.0", True), ("2.0.1", False), ("nonsense", False),
])
def test_version_comparison(version: str, newer: bool) -> None:
    assert _tested.torch_newer_than_tested(version) is newer


FAKE_TORCH = textwrap.dedent(
    """
    import copy, warnings, torch
    import deepcopy_shim
    from deepcopy_shim import _patch
    original = torch.Tensor.__deepcopy__

    def fixed(self, memo):  # a torch that {what}
        {body}

    torch.Tensor.__deepcopy__ = fixed
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        deepcopy_shim.enable("strict")
    print(_patch.state(), torch.Tensor.__deepcopy__ is fixed, deepcopy_shim.is_enabled())
    print([" ".join(str(w.message).split()) for w in caught])
    t = torch.ones(2, requires_grad=True) * 2
    try:
        print("copied", copy.deepcopy(t).is_leaf)
    except RuntimeError as exc:
        print("refused", type(exc).__name__)
    except TypeError as exc:
        print("failed", type(exc).__name__)
    """
)


@pytest.mark.parametrize(("what", "body", "says", "then"), [
    ("copies non-leaf tensors itself", "return self.detach().clone()",
     "deep-copies non-leaf tensors itself; the shim is not needed and stays out of the way",
     "copied True"),
    ("refuses them in other words", "raise RuntimeError('cannot copy a tensor with history')",
     "refuses to deep-copy a non-leaf tensor with a message deepcopy_shim does not recognise "
     "(cannot copy a tensor with history); the shim stays out of the way",
     "refused RuntimeError"),
    ("fails in another way", "raise TypeError('no copies today')",
     "failed in an unexpected way when deep-copying a non-leaf tensor (TypeError: no copies "
     "today); the shim stays out of the way",
     "failed TypeError"),
])
def test_the_shim_stays_out_of_the_way_of_a_torch_it_does_not_recognise(
        what: str, body: str, says: str, then: str) -> None:
    code = FAKE_TORCH.replace("{what}", what).replace("{body}", body)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    state, messages, outcome = result.stdout.splitlines()
    assert state == "inert True False"  # nothing patched, and nothing says the shim is on
    assert says in messages
    assert outcome == then  # copies behave as this torch makes them


def test_the_package_metadata_caps_neither_torch_nor_python() -> None:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    requires_python = re.search(r'^requires-python = "([^"]*)"', text, re.M)
    assert requires_python is not None and "<" not in requires_python.group(1)
    torch_requirement = re.search(r'"torch([^"]*)"', text)
    assert torch_requirement is not None and "<" not in torch_requirement.group(1)
    tested = _tested.tested_range_text(_tested.TESTED_TORCH)
    assert f"torch {tested}" in (ROOT / "docs" / "compatibility.md").read_text(encoding="utf-8")
