"""benchmarks/bench_copy.py's targets, chosen and judged from made-up timings (no GPU needed, no
model built): the CPU's plan judges what it judged before the GPU got a plan of its own."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType
from typing import Dict, List

import pytest
from support.processes import REPO

SERIES = ["warm wall", "warm cpu"]


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_copy", REPO / "benchmarks" / "bench_copy.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_copy"] = module  # dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules["bench_copy"]
    return module


def case(bench: ModuleType, name: str, ms: Dict[str, float], kinds: Dict[str, str]) -> object:
    """A measured case: each method took ``ms[method]`` in every round of every series."""
    made = bench.Case(name, None, 3)
    made.model_bytes = 1 << 20
    for method, value in ms.items():
        result = bench.Result(name, bench.Method(method, None, kind=kinds.get(method, "copy")))
        result.times = {key: [value / 1e3] * 3 for key in SERIES}
        result.peak = 1 << 20
        made.results[method] = result
    return made


COPIES = {"native deepcopy": 60.0, "shim silent": 28.0, "shim warn": 29.0, "shim strict": 28.5,
          "limit: storage clone": 13.0, "limit: empty_like+copy_": 12.0,
          "limit: _foreach_copy_ into empty_like": 2.5, "limit: one flat copy_ of the same bytes": 0.02}
KINDS = {"limit: storage clone": "limit", "limit: empty_like+copy_": "limit",
         "limit: _foreach_copy_ into empty_like": "floor",
         "limit: one flat copy_ of the same bytes": "floor"}


def texts(found: List[object]) -> List[str]:
    return [f"{t.text} {'>=' if t.higher_is_better else '<='} {t.limit}" for t in found]


def test_the_cpu_plan_judges_what_it_judged_before(bench: ModuleType) -> None:
    names = ["module-heavy", "big", "transformer", "transformer non-leaf", "module-heavy non-leaf",
             "bare tensor", "dict of 1000 tensors"]
    cases = {n: case(bench, n, COPIES, KINDS) for n in names}
    cases["big refused"] = case(bench, "big refused", {"torch's refusal": 1.0, "shim strict refusal": 1.5},
                                {"torch's refusal": "refusal", "shim strict refusal": "refusal"})
    found = bench.targets(cases, SERIES, "cpu")
    assert texts(found) == [
        "module-heavy: native / shim >= 3.0",
        "module-heavy: copium / shim >= 2.0",
        "module-heavy: shim / clone limit <= 2.5",
        "transformer: native / shim >= 1.5",
        "big: shim / clone limit <= 1.1",
        "big: shim peak extra memory / model bytes <= 1.1",
        "bare tensor: shim / native <= 1.1",
        "dict of 1000 tensors: shim / native <= 1.05",
        "module-heavy non-leaf: fresh / shim >= 5.0",
        "module-heavy non-leaf: save/load / shim >= 10.0",
        "module-heavy non-leaf: save/load / clone limit (the most any copy could reach) >= 10.0",
        "transformer non-leaf: fresh / shim >= 5.0",
        "transformer non-leaf: save/load / shim >= 10.0",
        "transformer non-leaf: save/load / clone limit (the most any copy could reach) >= 10.0",
        *[f"{n}: {m} / silent <= 1.05" for n in ("module-heavy", "big", "transformer", "bare tensor",
                                                "dict of 1000 tensors") for m in ("strict", "warn")],
        "module-heavy non-leaf: warn / silent <= 1.1",
        "transformer non-leaf: warn / silent <= 1.15",
        "big refused: strict refusal time - torch's refusal time, message included <= 250.0",
        "big refused: strict refusal peak extra memory - torch's <= 32.0",
    ]
    # The clone limit is still the faster clone-loop row, never a floor.
    shim_limit = next(t for t in found if t.text == "module-heavy: shim / clone limit")
    assert shim_limit.values["warm wall"] == pytest.approx(28.0 / 12.0)


def test_the_cuda_plan_judges_the_gpu_by_its_own_targets(bench: ModuleType) -> None:
    cases = {n: case(bench, n, COPIES, KINDS) for n in ("module-heavy", "big bf16", "bare tensor")}
    found = {t.text: t for t in bench.targets(cases, SERIES, "cuda")}
    assert "module-heavy: copium / shim" not in found  # no copium on the device
    assert "module-heavy: shim / clone limit" not in found  # host work per module: CPU-specific
    never_slower = found["module-heavy: shim / native (never slower)"]
    assert never_slower.limit == 1.05 and all(map(never_slower.passed, SERIES))
    assert found["bare tensor: shim / native (never slower)"].limit == 1.10
    assert found["module-heavy: native / shim"].limit == 2.0
    bytes_bound = found["big bf16: shim / clone limit (bytes-bound)"]
    assert bytes_bound.values["warm wall"] == pytest.approx(28.0 / 12.0)  # the clone loop, not a floor
    assert not bytes_bound.passed("warm wall")
    assert "big bf16: shim peak extra memory / model bytes" in found


def test_a_slower_shim_misses_the_never_slower_target(bench: ModuleType) -> None:
    slower = dict(COPIES, **{"shim silent": 66.0})
    found = {t.text: t for t in bench.targets({"big": case(bench, "big", slower, KINDS)}, SERIES, "cuda")}
    assert not found["big: shim / native (never slower)"].passed("warm wall")


@pytest.mark.parametrize("plan", ["cpu", "cuda"])
def test_after_compile_the_ratio_is_judged_against_the_same_process_before(bench: ModuleType,
                                                                           plan: str) -> None:
    fresh = case(bench, "module-heavy", COPIES, KINDS)
    collapsed = case(bench, "module-heavy after compile",
                     {"native deepcopy": 60.0, "shim silent": 59.0}, {})
    collapsed.tagged = {"native deepcopy": 1.0, "shim silent": 0.0}
    found = {t.text: t for t in bench.targets({"module-heavy": fresh, collapsed.name: collapsed},
                                              SERIES, plan)}
    kept = found["module-heavy after compile: (native / shim) / the same before any compile"]
    assert kept.limit == 0.85 and kept.values["warm wall"] == pytest.approx((60 / 59) / (60 / 28))
    assert not kept.passed("warm wall")  # the module copier's gain is lost after compile
    assert all(map(found["module-heavy after compile: shim / native (never slower)"].passed, SERIES))
    tag = found["module-heavy after compile: share of the copy's modules with dynamo's generation tag"]
    assert tag.info_only and tag.values == {"native deepcopy": 1.0, "shim silent": 0.0}
    assert "shim silent 0.00" in tag.line()
