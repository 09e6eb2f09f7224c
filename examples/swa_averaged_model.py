"""Stochastic weight averaging with torch.optim.swa_utils.AveragedModel.

`AveragedModel(model)` deep-copies the model; this one keeps its last hidden activation in a
dict, so without the shim the constructor raises the "graph leaves" error.
"""

import torch
import torch.nn as nn
from torch.optim.swa_utils import SWALR, AveragedModel, update_bn

import deepcopy_shim


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 16), nn.BatchNorm1d(16), nn.ReLU())
        self.head = nn.Linear(16, 1)
        self.cache = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.body(x)
        self.cache["hidden"] = hidden
        return self.head(hidden)


def main() -> None:
    torch.manual_seed(0)
    x = torch.randn(256, 4)
    y = (x ** 2).sum(dim=1, keepdim=True)
    loader = [(x[i:i + 32], y[i:i + 32]) for i in range(0, 256, 32)]
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    swa_scheduler = SWALR(opt, swa_lr=0.02)
    with deepcopy_shim.enabled("warn"):
        for epoch in range(6):
            for xb, yb in loader:
                loss = nn.functional.mse_loss(model(xb), yb)
                opt.zero_grad()
                loss.backward()
                opt.step()
            if epoch == 2:
                swa_model = AveragedModel(model)  # warns once: cache['hidden'] detached
            if epoch >= 2:
                swa_model.update_parameters(model)
                swa_scheduler.step()
    update_bn(((xb,) for xb, _ in loader), swa_model)
    with torch.no_grad():
        swa_loss = nn.functional.mse_loss(swa_model(x), y).item()
    print(f"SWA model loss {swa_loss:.4f} after averaging {int(swa_model.n_averaged)} models")
    assert int(swa_model.n_averaged) == 4


if __name__ == "__main__":
    main()
