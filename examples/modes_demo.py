"""The three modes on a model that caches its activations (output shown in docs/modes.md)."""

import copy
import warnings

import torch
import torch.nn as nn

import deepcopy_shim


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 8)
        self.head = nn.Linear(8, 2)
        self.cache = {}

    def forward(self, x):
        hidden = self.fc(x)
        self.cache["mid"] = hidden.relu()
        out = self.head(hidden)
        self.head.last_out = out
        return out


model = Net()
model(torch.randn(3, 4))

try:
    copy.deepcopy(model)
except RuntimeError as exc:
    print("without the shim:", exc)

deepcopy_shim.enable()  # mode="warn"
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    ema = copy.deepcopy(model)
print(f"\nwarn: {caught[0].category.__name__}: {caught[0].message}")
print("copy's cached output:", ema.head.last_out.is_leaf, ema.head.last_out.requires_grad)

deepcopy_shim.enable("strict")
try:
    copy.deepcopy(model)
except deepcopy_shim.NonLeafTensorError as exc:
    print(f"\nstrict: NonLeafTensorError: {exc}")

with deepcopy_shim.enabled("silent"):
    copy.deepcopy(model)  # no output
deepcopy_shim.disable()
