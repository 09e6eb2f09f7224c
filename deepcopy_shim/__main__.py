"""`python -m deepcopy_shim`: see `_runner` (the same as the `deepcopy-shim` command)."""

from ._runner import main

if __name__ == "__main__":
    main()
