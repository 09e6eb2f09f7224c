"""An exponential-moving-average (EMA) copy of a model during training.

The model caches its last attention map (a tensor with a grad_fn) and uses hook-based
weight_norm, so `copy.deepcopy(model)` raises the "graph leaves" error without the shim.
"""

import copy
import warnings

import torch
import torch.nn as nn

import deepcopy_shim

# Notices of other libraries, not of the shim: silenced, so that what you see is what the shim says.
warnings.filterwarnings("ignore", r"`?torch\.nn\.utils\.weight_norm`? is deprecated")


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.utils.weight_norm(nn.Linear(8, 8))
        self.out = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = torch.softmax(self.proj(x) @ x.T, dim=-1)
        self.last_attention = scores  # kept for inspection: has a grad_fn
        return self.out(scores @ x)


@torch.no_grad()
def ema_update(ema: nn.Module, model: nn.Module, decay: float = 0.9) -> None:
    for e, p in zip(ema.parameters(), model.parameters()):
        e.mul_(decay).add_(p, alpha=1 - decay)


def main() -> None:
    torch.manual_seed(0)
    deepcopy_shim.enable("silent")
    model = Model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x = torch.randn(32, 8)
    y = x.sum(dim=1, keepdim=True)
    model(x)
    ema = copy.deepcopy(model).requires_grad_(False)  # made mid-training: caches are non-leaf
    for step in range(50):
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        ema_update(ema, model)
        if step % 25 == 0:
            teacher = copy.deepcopy(model)  # e.g. a periodic teacher snapshot
            assert teacher.last_attention.grad_fn is None
    deepcopy_shim.disable()
    with torch.no_grad():
        print(f"model loss {nn.functional.mse_loss(model(x), y):.4f}, "
              f"EMA loss {nn.functional.mse_loss(ema(x), y):.4f}")
    assert all(p.grad is None for p in ema.parameters())


if __name__ == "__main__":
    main()
