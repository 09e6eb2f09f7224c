"""find_nonleaf_tensors: every non-leaf tensor, with a path that reads like Python access."""

from __future__ import annotations

import dataclasses
import functools
from collections import OrderedDict, namedtuple
from typing import Any, List

import torch
import torch.nn as nn
from conftest import CachingNet

from deepcopy_shim import find_nonleaf_tensors


def nonleaf() -> torch.Tensor:
    return torch.ones(2, requires_grad=True) * 2


def paths(obj: Any) -> List[str]:
    return [p for p, _ in find_nonleaf_tensors(obj)]


def test_module_paths_follow_state_dict_names(caching_net: CachingNet) -> None:
    found = find_nonleaf_tensors(caching_net)
    assert [p for p, _ in found] == ["head.last_out", "cache['mid']", "cache['list'][0]"]
    assert found[0][1] is caching_net.head.last_out


def test_containers() -> None:
    Point = namedtuple("Point", "x y")

    @dataclasses.dataclass
    class Record:
        value: Any

    @dataclasses.dataclass(frozen=True)
    class Frozen:
        value: Any

    class Slotted:
        __slots__ = ("a", "__private")

        def __init__(self) -> None:
            self.a = nonleaf()
            self.__private = nonleaf()

    t_set = nonleaf()
    obj = {
        "list": [1, nonleaf()],
        "tuple": (nonleaf(),),
        "named": Point(0, nonleaf()),
        "set": {t_set},
        "od": OrderedDict(k=nonleaf()),
        "record": Record(nonleaf()),
        "frozen": Frozen(nonleaf()),
        "slots": Slotted(),
        7: nonleaf(),
        "partial": functools.partial(print, nonleaf(), sep=nonleaf()),
    }
    assert paths(obj) == [
        "['list'][1]",
        "['tuple'][0]",
        "['named'].y",
        "['set']{0}",
        "['od']['k']",
        "['record'].value",
        "['frozen'].value",
        "['slots'].a",
        "['slots']._Slotted__private",
        "[7]",
        "['partial'].args[0]",
        "['partial'].keywords['sep']",
    ]


def test_cycles_and_shared_objects_are_visited_once() -> None:
    t = nonleaf()
    a: dict = {"t": t}
    b = {"a": a, "again": a, "t_again": t}
    a["b"] = b
    assert paths(b) == ["['a']['t']"]


def test_root_tensor_and_grads() -> None:
    t = nonleaf()
    assert paths(t) == [""]
    x = torch.randn(3, requires_grad=True)
    (x ** 3).sum().backward(create_graph=True)
    assert paths({"x": x}) == ["['x'].grad"]
    p = nn.Parameter(torch.randn(2))
    p.grad = nonleaf()
    assert paths(p) == []  # Parameter.__deepcopy__ does not copy .grad


def test_hooks_that_keep_activations() -> None:
    class Keeper:
        def __call__(self, module: nn.Module, inp: Any, out: torch.Tensor) -> None:
            self.out = out

    model = nn.Sequential(nn.Linear(2, 2))
    model[0].register_forward_hook(Keeper())
    model(torch.randn(1, 2))
    (path,) = paths(model)
    assert path.startswith("0._forward_hooks[") and path.endswith("].out")


def test_leaves_and_plain_values_are_not_reported() -> None:
    model = nn.Linear(2, 2)
    with torch.no_grad():
        model.out = model(torch.randn(1, 2))
    assert paths([model, "text", 3, None, torch.ones(2), print, nn, int]) == []


def test_deep_structures_do_not_hit_the_recursion_limit() -> None:
    node: Any = {"t": nonleaf()}
    for _ in range(5000):
        node = {"next": node}
    (path,) = paths(node)
    assert path.endswith("['t']") and path.count("['next']") == 5000


def test_weight_norm_is_found_before_any_forward() -> None:
    layer = torch.nn.utils.weight_norm(nn.Linear(3, 3))
    assert paths(layer) == ["weight"]
