"""Interpreter start-up cost of the DEEPCOPY_SHIM hook (the figures in docs/activation.md).

Builds the wheel, makes two fresh venvs that differ only by it (torch and wrapt are made
importable in both through the same path ``.pth``), then times ``python -c pass`` (and, for
reference, ``python -c "import torch"``) in interleaved rounds, so drift on the machine hits
every configuration alike.

    .venv/bin/python benchmarks/startup_activation.py [--runs 60]

Prints a markdown table of median / p10 / p90 wall times per configuration.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parent.parent


def _deps(out: Path) -> None:
    sources = set()
    for name in ("torch", "wrapt"):
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None
        sources.add(Path(spec.origin).resolve().parent.parent)
    for source in sources:
        for entry in source.iterdir():
            if entry.suffix == ".pth" or "deepcopy_shim" in entry.name.lower():
                continue
            if not (out / entry.name).exists():
                (out / entry.name).symlink_to(entry)


def _venv(root: Path, deps: Path, wheel: Optional[Path]) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (Path(site) / "00_deps.pth").write_text(f"{deps}\n")
    if wheel is not None:
        subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                        "--no-deps", "--no-index", str(wheel)], check=True)
    return python


def _time(python: Path, code: str, env: Dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run([python, "-c", code], env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--torch-runs", type=int, default=15)
    args = parser.parse_args()
    base = {k: v for k, v in os.environ.items() if k not in ("DEEPCOPY_SHIM", "PYTHONPATH")}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        subprocess.run([sys.executable, "-m", "pip", "wheel", str(REPO), "--no-deps", "-q",
                        "-w", str(tmp / "wheel")], check=True)
        (wheel,) = (tmp / "wheel").glob("*.whl")
        (tmp / "deps").mkdir()
        _deps(tmp / "deps")
        bare = _venv(tmp / "bare", tmp / "deps", None)
        shim = _venv(tmp / "shim", tmp / "deps", wheel)
        configs: List[Tuple[str, Path, Optional[str], str, int]] = [
            ("no deepcopy-shim installed", bare, None, "pass", args.runs),
            ("installed, DEEPCOPY_SHIM unset", shim, None, "pass", args.runs),
            ("installed, DEEPCOPY_SHIM=0", shim, "0", "pass", args.runs),
            ("installed, DEEPCOPY_SHIM=warn (torch never imported)", shim, "warn", "pass",
             args.runs),
            ("`import torch`, no deepcopy-shim installed", bare, None, "import torch",
             args.torch_runs),
            ("`import torch`, DEEPCOPY_SHIM=warn (patch applied)", shim, "warn", "import torch",
             args.torch_runs),
        ]
        samples: Dict[str, List[float]] = {name: [] for name, *_ in configs}
        for _, python, value, code, _runs in configs:  # warm the page cache
            _time(python, code, {**base, **({"DEEPCOPY_SHIM": value} if value else {})})
        for round_ in range(max(c[4] for c in configs)):
            for name, python, value, code, runs in configs:
                if round_ < runs:
                    env = {**base, **({"DEEPCOPY_SHIM": value} if value is not None else {})}
                    samples[name].append(_time(python, code, env))
    print(f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs; wall time per start-up, ms")
    print("\n| configuration | runs | median | p10 | p90 |\n| --- | ---: | ---: | ---: | ---: |")
    for name, values in samples.items():
        ms = sorted(v * 1000 for v in values)
        p10, p90 = ms[len(ms) // 10], ms[(len(ms) * 9) // 10]
        print(f"| {name} | {len(ms)} | {statistics.median(ms):.1f} | {p10:.1f} | {p90:.1f} |")


if __name__ == "__main__":
    main()
