"""deepcopy-shim: ``copy.deepcopy`` for PyTorch models that hold tensors with autograd history.

``import deepcopy_shim; deepcopy_shim.enable()`` and ``copy.deepcopy(model)`` no longer raises
"Only Tensors created explicitly by the user (graph leaves) support the deepcopy protocol": such
tensors are copied as detached leaves, modules are rebuilt from their own state.  Importing this
package does not import torch.

PYTEST_DONT_REWRITE: ``DEEPCOPY_SHIM`` imports this package at interpreter start-up, before pytest
could rewrite it (it holds no assertions); this marker keeps pytest from warning about that.
"""

from ._activation import deepcopy, disable, enable, enabled, is_enabled
from ._modes import Mode
from ._report import (
    DeepcopyShimWarning,
    DetachedTensorsWarning,
    NonLeafTensorError,
    PatchConflictWarning,
)
from ._scan import find_nonleaf_tensors

__version__ = "0.1.0"

__all__ = [
    "DeepcopyShimWarning",
    "DetachedTensorsWarning",
    "Mode",
    "NonLeafTensorError",
    "PatchConflictWarning",
    "deepcopy",
    "disable",
    "enable",
    "enabled",
    "find_nonleaf_tensors",
    "is_enabled",
]
