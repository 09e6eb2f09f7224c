"""Fixtures of the ecosystem suite (helpers live in ecosystem_support.py).

Nothing may be downloaded at run time: the Hugging Face libraries are put offline before any test
module imports them (module level: test modules import their libraries at collection time, before
any fixture runs; the session fixture below checks the setting held).
"""

from __future__ import annotations

import os
import random
from typing import Iterator

import pytest

OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRL_EXPERIMENTAL_SILENCE": "1",  # trl.experimental warns on import otherwise
    "TOKENIZERS_PARALLELISM": "false",
}
for _key, _value in OFFLINE_ENV.items():
    os.environ.setdefault(_key, _value)

if os.environ.get("DEEPCOPY_SHIM", "").strip().lower() not in ("", "0", "false", "off", "no"):
    raise pytest.UsageError(
        "tests_ecosystem compares the shim with native deepcopy and needs it off at start-up: "
        "unset DEEPCOPY_SHIM")

import ecosystem_support  # noqa: E402
import numpy  # noqa: E402
import torch  # noqa: E402

import deepcopy_shim  # noqa: E402

if ecosystem_support.shim_state_problems() or "__deepcopy__" in vars(torch.nn.Module):
    raise pytest.UsageError(
        f"deepcopy_shim is active before the ecosystem suite starts: "
        f"{ecosystem_support.shim_state_problems()}")


@pytest.fixture(scope="session", autouse=True)
def _offline() -> None:
    """Every Hugging Face library is offline for the whole session."""
    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        assert os.environ.get(key) == "1", f"{key} must be 1: nothing may be downloaded"


@pytest.fixture(autouse=True)
def _seeded() -> None:
    """Every test starts from the same random state."""
    random.seed(0)
    numpy.random.seed(0)
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _shim_off_and_torch_restored() -> Iterator[None]:
    """Every test starts and ends with the shim off and torch's own ``Tensor.__deepcopy__`` and
    ``nn.Module`` attributes in place (a test that leaves a scope open or the patch installed
    fails here, and the global mode is reset so the next test starts clean)."""
    before = ecosystem_support.shim_state_problems()
    assert not before, f"the shim is not off before the test: {before}"
    yield
    after = ecosystem_support.shim_state_problems()
    if after:
        deepcopy_shim.disable()
    assert not after, f"the test left the shim active or torch patched: {after}"
