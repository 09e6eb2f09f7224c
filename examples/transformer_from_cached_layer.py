"""nn.TransformerEncoder built from a layer that caches its attention output.

`nn.TransformerEncoder(layer, N)` deep-copies `layer` N times; a layer that has run once and kept
an activation makes it raise the "graph leaves" error without the shim.
"""

import torch
import torch.nn as nn

import deepcopy_shim


class CachingLayer(nn.TransformerEncoderLayer):
    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal=False):
        out = super().forward(src, src_mask, src_key_padding_mask, is_causal)
        self.last_output = out
        return out


def main() -> None:
    torch.manual_seed(0)
    layer = CachingLayer(d_model=32, nhead=4, dim_feedforward=64, batch_first=True)
    layer(torch.randn(2, 5, 32))  # e.g. a shape check before building the stack
    with deepcopy_shim.enabled("silent"):
        encoder = nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False)
    weights = {m.linear1.weight.data_ptr() for m in encoder.layers}
    assert len(weights) == 4, "each layer owns its own parameters"
    assert all(m.last_output.grad_fn is None for m in encoder.layers)
    out = encoder(torch.randn(3, 7, 32))
    out.sum().backward()
    print("encoder output", tuple(out.shape), "- layers", len(encoder.layers))


if __name__ == "__main__":
    main()
