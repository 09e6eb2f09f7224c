"""What the messages promise, word by word: pinned by behaviour (found by mutation testing,
CONTRIBUTING.md, "Mutation testing")."""

from __future__ import annotations

import copy
import subprocess
import sys
import textwrap
import warnings
from typing import Any

import pytest
import torch

import deepcopy_shim


def _nonleaf(*shape: int, device: str = "cpu") -> torch.Tensor:
    return torch.ones(*shape, device=device, requires_grad=True) * 2


def _warned(obj: Any) -> str:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        deepcopy_shim.deepcopy(obj, "warn")
    [warning] = [w for w in caught if w.category is deepcopy_shim.DetachedTensorsWarning]
    return str(warning.message)


class Plain(torch.Tensor):
    """A tensor subclass torch cannot deep-copy even as a leaf (no `new_empty` of its own):
    torch's own code raises, so the shim's detached copy fails with `DetachedCopyError`."""


def _failure(obj_of: Any = None) -> str:
    tensor = _nonleaf(2).as_subclass(Plain)
    obj = tensor if obj_of is None else obj_of(tensor)
    with deepcopy_shim.enabled("silent"), pytest.raises(deepcopy_shim.DetachedCopyError) as failed:
        copy.deepcopy(obj)
    assert type(failed.value.__cause__) is RuntimeError  # torch's, as the cause
    return str(failed.value)


def _failure_saying(error: str) -> str:
    """The message of a failed detached copy whose error says `error`."""
    return deepcopy_shim._report.detached_copy_failure("", _nonleaf(2), RuntimeError(error))


def test_one_tensor_is_one_tensor_not_one_tensors() -> None:
    assert _warned({"a": _nonleaf(2)}).splitlines()[0] == (
        "deepcopy_shim: deep copy of a dict detached 1 tensor with autograd history:"
    )
    assert _warned({"a": _nonleaf(2), "b": _nonleaf(2)}).splitlines()[0] == (
        "deepcopy_shim: deep copy of a dict detached 2 tensors with autograd history:"
    )


def test_the_listing_says_how_many_more_there_are() -> None:
    message = _warned([_nonleaf(1) for _ in range(25)])
    listed = [line for line in message.splitlines() if line.startswith("  [")]
    assert len(listed) == deepcopy_shim._report.MAX_LISTED == 20
    assert "  ... and 5 more (all are in the warning's .paths)" in message.splitlines()


def test_the_device_is_named_only_where_it_is_not_the_cpu() -> None:
    message = _warned({"cpu": _nonleaf(2), "meta": _nonleaf(2, device="meta")})
    lines = message.splitlines()
    assert lines[1] == "  ['cpu']: grad_fn=MulBackward0, shape=(2,), dtype=torch.float32"
    assert lines[2] == "  ['meta']: grad_fn=MulBackward0, shape=(2,), dtype=torch.float32, device=meta"


def test_a_failed_detached_copy_of_the_copied_object_itself_says_so() -> None:
    assert _failure().splitlines()[0] == (
        "deepcopy_shim: cannot deep-copy the copied object, a tensor with autograd history:"
    )
    assert _failure(lambda t: {"t": t}).splitlines()[0] == (
        "deepcopy_shim: cannot deep-copy ['t'], a tensor with autograd history:"
    )


def test_long_words_and_hyphenated_words_are_never_broken() -> None:
    """A path, a class name or torch's own words longer than a line stay whole (they are
    copied into code and searches)."""
    long_word = "x" * 100
    hyphenated = "-".join(["ab"] * 40)
    message = _failure_saying(f"nope {long_word} {hyphenated} end")
    assert long_word in message.split() and hyphenated in message.split()


@pytest.mark.parametrize("error", [
    *(" ".join(["w" * length] * 60) for length in range(1, 13)),
    # a word of a whole line, then two words that fill the next one to exactly 88 columns
    " ".join(["z" * 88, "a" * 43, "b" * 44, "c" * 43, "d" * 44]),
])
def test_paragraphs_are_filled_to_88_columns(error: str) -> None:
    """Every paragraph of a message is filled greedily to 88 columns: no line longer (but for
    a word longer than a line), and no line that could have taken the next word."""
    lines = _failure_saying(error).splitlines()
    paragraph = lines[1:-1]  # between the first line and the advice
    assert max(len(line) for line in paragraph if " " in line) <= 88
    refilled = textwrap.fill(" ".join(" ".join(paragraph).split()), 88,
                             break_long_words=False, break_on_hyphens=False)
    assert paragraph == refilled.splitlines()


def test_a_newer_torch_is_noted_once_in_a_fresh_process() -> None:
    """The first warn copy of a process under a torch newer than the tested range adds one
    TorchCompatibilityWarning (checked in a child: the note is once per process)."""
    code = textwrap.dedent("""
        import copy, warnings, torch
        torch.__version__ = "99.0.0"
        import deepcopy_shim
        w = torch.ones(2, requires_grad=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            deepcopy_shim.deepcopy([w * 2], "warn")
            deepcopy_shim.deepcopy([w * 2], "warn")
        print(sorted(type(c.message).__name__ for c in caught))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[-2] == (
        "['DetachedTensorsWarning', 'DetachedTensorsWarning', 'TorchCompatibilityWarning']"
    )
