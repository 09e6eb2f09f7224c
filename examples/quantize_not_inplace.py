"""Dynamic quantization with inplace=False, which deep-copies the float model first.

The float model keeps its last logits; without the shim `quantize_dynamic(..., inplace=False)`
raises the "graph leaves" error.  The float model is left untouched.
"""

import warnings

import torch
import torch.nn as nn

import deepcopy_shim

# Notices of other libraries, not of the shim: silenced, so that what you see is what the shim says.
warnings.filterwarnings("ignore", "torch.ao.quantization is deprecated", DeprecationWarning)
warnings.filterwarnings("ignore", r"torch\.quantize_per_tensor, .* are deprecated", UserWarning)


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.last_logits = self.fc2(torch.relu(self.fc1(x)))
        return self.last_logits


def main() -> None:
    from torch.ao.quantization import quantize_dynamic

    torch.manual_seed(0)
    model = Classifier().eval()
    x = torch.randn(8, 16)
    model(x)
    with deepcopy_shim.enabled("silent"):
        quantized = quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8, inplace=False)
    assert type(model.fc1) is nn.Linear, "the float model is unchanged"
    with torch.no_grad():
        err = (quantized(x) - model(x)).abs().max().item()
    print(f"quantized {type(quantized.fc1).__module__}.{type(quantized.fc1).__name__}, max error {err:.4f}")
    assert err < 0.1


if __name__ == "__main__":
    main()
