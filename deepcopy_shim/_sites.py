"""Where Python keeps code on this machine: the standard library's and installed packages'
directories, and this package's own.

Two rules need them: where a warning points (the first frame outside all of them, see
`_notices`) and where the start-up hook must be for `DEEPCOPY_SHIM` to work (the doctor).
"""

from __future__ import annotations

import os
import site
import sysconfig
from typing import List, Tuple

__all__ = ["PACKAGE_DIR", "library_dirs", "site_packages_dirs"]

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def site_packages_dirs() -> List[str]:
    """The site-packages directories this interpreter reads `.pth` files from, in order."""
    dirs: List[str] = []
    try:
        dirs.extend(site.getsitepackages())
    except AttributeError:  # virtualenv's old site.py has no getsitepackages
        pass
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    return dirs


def library_dirs() -> Tuple[str, ...]:
    """Every directory of code that is not the user's own (the standard library, installed
    packages, this package), normalised and ending in a separator, for prefix tests."""
    paths = {sysconfig.get_paths().get(key, "") for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    paths.update(site_packages_dirs())
    paths.add(PACKAGE_DIR)
    return tuple(os.path.join(os.path.normcase(os.path.abspath(p)), "") for p in paths if p)
