"""DEEPCOPY_SHIM activation in real installs: a wheel and an editable install, each in a fresh venv.

The package under test is installed by pip exactly as a user gets it (the built wheel, or
``pip install -e``), so these tests see the shipped ``deepcopy_shim.pth``, console script and
entry points.  Its dependencies (torch, wrapt, pytest) are *not* reinstalled: each venv gets a
directory of symlinks to the test interpreter's copies, added to ``sys.path`` by a ``.pth``
path line.  Reinstalling torch would cost tens of seconds per venv and test nothing of ours;
the symlink directory holds no ``.pth`` files and no ``deepcopy_shim`` files (site never
processes ``.pth`` files in a directory added by a path line), so the only activation machinery
in the venv is what pip installed from our wheel.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

import pytest
from support.processes import (
    CHILD_NET_SRC,
    DEV_PYTHON,
    PROBE_SRC,
    REPO,
    clean_env,
    describe,
    run,
    run_code,
)

from deepcopy_shim._modes import OFF_WORDS, ON_WORDS

PTH_NAME = "deepcopy_shim.pth"


@dataclass
class Venv:
    kind: str
    root: Path
    python: Path
    site_packages: Path

    @property
    def bin(self) -> Path:
        return self.python.parent


def _pip(*args: str) -> None:
    proc = subprocess.run([DEV_PYTHON, "-m", "pip", "--disable-pip-version-check", *args],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, describe(proc)


@pytest.fixture(scope="session")
def built_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's wheel, built once per session exactly as `pip wheel .` builds it."""
    out = tmp_path_factory.mktemp("wheel")
    _pip("wheel", str(REPO), "--no-deps", "-q", "-w", str(out))
    (wheel,) = out.glob("deepcopy_shim-*.whl")
    return wheel


@pytest.fixture(scope="session")
def deps_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Symlinks to this interpreter's torch, wrapt, pytest & co., without any deepcopy_shim."""
    out = tmp_path_factory.mktemp("deps")
    sources = set()
    for name in ("torch", "wrapt", "pytest", "_pytest", "pluggy"):
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None, name
        sources.add(Path(spec.origin).resolve().parent.parent)
    for source in sorted(sources):
        for entry in source.iterdir():
            lowered = entry.name.lower()
            if (entry.suffix == ".pth" or "deepcopy_shim" in lowered or "__editable__" in lowered
                    or (out / entry.name).exists()):
                continue
            (out / entry.name).symlink_to(entry)
    return out


def _make_venv(root: Path, deps: Path) -> Venv:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True,
                   timeout=120)
    python = root / "bin" / "python"
    site = Path(run_code(python, "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                         clean_env()).stdout.strip())
    # "00_" sorts before every other .pth, so the dependencies are importable when ours runs,
    # as they are in a real install where they live in site-packages itself.
    (site / "00_test_dependencies.pth").write_text(f"{deps}\n")
    return Venv("", root, python, site)


@pytest.fixture(scope="session")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory, built_wheel: Path, deps_dir: Path) -> Venv:
    venv = _make_venv(tmp_path_factory.mktemp("venv") / "wheel", deps_dir)
    _pip("--python", str(venv.python), "install", "-q", "--no-deps", "--no-index", str(built_wheel))
    venv.kind = "wheel"
    return venv


@pytest.fixture(scope="session")
def editable_venv(tmp_path_factory: pytest.TempPathFactory, deps_dir: Path) -> Venv:
    venv = _make_venv(tmp_path_factory.mktemp("venv") / "editable", deps_dir)
    _pip("--python", str(venv.python), "install", "-q", "--no-deps", "-e", str(REPO))
    venv.kind = "editable"
    return venv


@pytest.fixture(params=["wheel", "editable"])
def venv(request: pytest.FixtureRequest) -> Venv:
    return request.getfixturevalue(f"{request.param}_venv")  # type: ignore[no-any-return]


def probe(venv: Venv, value: Optional[str],
          code: str = PROBE_SRC) -> subprocess.CompletedProcess[str]:
    return run_code(venv.python, code, clean_env(value))


# ---------------------------------------------------------------------------------------------
# What the installs contain


def test_wheel_ships_the_pth_at_top_level(built_wheel: Path) -> None:
    with zipfile.ZipFile(built_wheel) as zf:
        names = zf.namelist()
        pth = zf.read(PTH_NAME).decode()
    assert PTH_NAME in names
    assert f"deepcopy_shim/{PTH_NAME}" not in names  # only the copy site will process
    (line,) = pth.splitlines()
    # Gate first: with DEEPCOPY_SHIM unset or off, the line imports `os` (already imported by
    # site) and nothing else.
    assert line.startswith('import os; os.environ.get("DEEPCOPY_SHIM", "").strip().lower() not in ')
    assert (REPO / "deepcopy_shim" / PTH_NAME).read_text() == pth


def test_install_layout(venv: Venv) -> None:
    pths = sorted(p.name for p in venv.site_packages.glob("*.pth"))
    assert PTH_NAME in pths
    if venv.kind == "editable":
        # hatchling's editable .pth puts the source tree on sys.path; ours must run after it.
        editable = [n for n in pths if n != PTH_NAME and "deepcopy_shim" in n]
        assert editable and all(n < PTH_NAME for n in editable), pths
    assert (venv.bin / "deepcopy-shim").exists()
    code = ("import importlib.metadata as m; eps = m.entry_points(); "
            # entry_points(group=...) / .select() are Python 3.10+; 3.9 returns a dict
            "eps = eps.select(group='pytest11') if hasattr(eps, 'select') else eps['pytest11']; "
            "print(sorted(e.value for e in eps if e.name == 'deepcopy_shim'))")
    proc = probe(venv, None, code)
    assert proc.stdout.strip() == "['deepcopy_shim.pytest_plugin']", describe(proc)


# ---------------------------------------------------------------------------------------------
# The environment variable


def test_unset_imports_nothing(venv: Venv) -> None:
    proc = probe(venv, None)
    assert proc.stdout.strip() == "mode=None torch=False shim=False wrapt=False", describe(proc)
    assert proc.stderr == ""


VOCABULARY = (
    [(v, "warn") for v in [*ON_WORDS, "warn", "TRUE", " On ", "Yes\n", "WARN"]]
    + [(v, "strict") for v in ["strict", "STRICT", "  strict\t"]]
    + [(v, "silent") for v in ["silent", "Silent"]]
    + [(v, None) for v in [*OFF_WORDS, "FALSE", " off ", "No", "", "   "]]
)


def test_vocabulary_and_torch_stays_unimported(venv: Venv) -> None:
    failures: List[str] = []
    for value, expected in VOCABULARY:
        proc = probe(venv, value)
        out = proc.stdout.strip()
        if not out.startswith(f"mode={expected} torch=False") or proc.stderr or proc.returncode:
            failures.append(f"{value!r}: {describe(proc)}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("bad", ["loud", "2", "warn,strict", "enable"])
def test_bad_value_one_line_and_program_runs(venv: Venv, bad: str) -> None:
    proc = probe(venv, bad, PROBE_SRC + "\nprint('program ran')\n")
    assert proc.returncode == 0, describe(proc)
    assert proc.stdout.splitlines()[-1] == "program ran"
    assert proc.stdout.startswith("mode=None torch=False"), describe(proc)
    (line,) = proc.stderr.splitlines()  # exactly one line, even though venvs process .pth twice
    assert line.startswith(f"deepcopy_shim: invalid DEEPCOPY_SHIM value {bad!r}"), line
    assert "warn, strict, silent" in line and line.endswith("start-up activation by DEEPCOPY_SHIM skipped")


def test_broken_package_never_breaks_startup(venv: Venv, tmp_path: Path) -> None:
    shadow = tmp_path / "deepcopy_shim"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("raise ImportError('simulated\\nbroken install')\n")
    env = clean_env("warn", PYTHONPATH=str(tmp_path))
    proc = run_code(venv.python, "print('program ran')", env)
    assert proc.returncode == 0 and proc.stdout == "program ran\n", describe(proc)
    (line,) = proc.stderr.splitlines()
    assert line.startswith("deepcopy_shim: start-up activation by DEEPCOPY_SHIM failed "
                           "(ImportError: simulated broken install)"), line


LAZY_SRC = PROBE_SRC + textwrap.dedent(
    """
    import copy, warnings
    from deepcopy_shim import _patch
    print("installed before import torch:", (_patch.state() == "installed"))
    """
) + CHILD_NET_SRC + textwrap.dedent(
    """
    print("installed after import torch:", (_patch.state() == "installed"))
    net = make_child_net()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        twin = copy.deepcopy(net)
    print("copied:", twin.last_hidden.is_leaf, torch.equal(twin.last_hidden, net.last_hidden))
    print("warnings:", [type(w.message).__name__ for w in caught])
    """
)


@pytest.mark.parametrize("value", ["warn", "silent"])
def test_patch_is_applied_when_the_program_imports_torch(venv: Venv, value: str) -> None:
    proc = probe(venv, value, LAZY_SRC)
    assert proc.returncode == 0, describe(proc)
    lines = proc.stdout.splitlines()
    assert lines[0] == f"mode={value} torch=False shim=True wrapt=True"
    assert lines[1:4] == ["installed before import torch: False",
                          "installed after import torch: True", "copied: True True"]
    expected = ["DetachedTensorsWarning"] if value == "warn" else []
    assert lines[4] == f"warnings: {expected}"


def test_strict_from_environment_refuses(venv: Venv) -> None:
    code = CHILD_NET_SRC + textwrap.dedent(
        """
        import copy, deepcopy_shim
        try:
            copy.deepcopy(make_child_net())
        except deepcopy_shim.NonLeafTensorError as exc:
            print("refused:", exc.paths)
        """
    )
    proc = probe(venv, "strict", code)
    assert proc.stdout.strip() == "refused: ('last_hidden',)", describe(proc)


def test_without_the_variable_torch_still_refuses(venv: Venv) -> None:
    code = CHILD_NET_SRC + textwrap.dedent(
        """
        import copy
        try:
            copy.deepcopy(make_child_net())
        except RuntimeError as exc:
            print("graph leaves" in str(exc))
        """
    )
    proc = probe(venv, "off", code)
    assert proc.stdout.strip() == "True", describe(proc)


def test_explicit_code_wins_over_environment(venv: Venv) -> None:
    code = CHILD_NET_SRC + textwrap.dedent(
        """
        import copy, deepcopy_shim
        deepcopy_shim.disable()
        try:
            copy.deepcopy(make_child_net())
        except RuntimeError as exc:
            print("native again:", "graph leaves" in str(exc))
        deepcopy_shim.enable("silent")
        print("mode:", deepcopy_shim.current_mode().mode.value)
        """
    )
    proc = probe(venv, "strict", code)
    assert proc.stdout.splitlines() == ["native again: True", "mode: silent"], describe(proc)


# ---------------------------------------------------------------------------------------------
# The runner, console script and pytest plugin as installed


def test_console_script_runs_program(venv: Venv, tmp_path: Path) -> None:
    script = tmp_path / "prog.py"
    script.write_text(PROBE_SRC + "import os, sys\nprint(sys.argv, os.environ['DEEPCOPY_SHIM'])\n"
                      "sys.exit(5)\n")
    proc = run([venv.bin / "deepcopy-shim", "--mode", "silent", script, "--mode", "x"],
               clean_env(), cwd=tmp_path)
    assert proc.returncode == 5, describe(proc)
    assert proc.stdout.splitlines() == [
        "mode=silent torch=False shim=True wrapt=True",
        f"[{str(script)!r}, '--mode', 'x'] silent",
    ]


def test_pytest_plugin_header(venv: Venv, tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\ndeepcopy_shim = strict\n")
    (tmp_path / "test_one.py").write_text(
        "import deepcopy_shim\n"
        "def test_on():\n    assert deepcopy_shim.current_mode().mode.value == 'strict'\n")
    proc = run([venv.python, "-m", "pytest", "-p", "no:cacheprovider"], clean_env(), cwd=tmp_path)
    assert proc.returncode == 0, describe(proc)
    assert ("deepcopy_shim: active, mode strict (from `deepcopy_shim = strict` in the pytest ini file)"
            in proc.stdout)


# ---------------------------------------------------------------------------------------------
# Child interpreters: multiprocessing spawn, DataLoader workers, torchrun ranks

SPAWN_SRC = CHILD_NET_SRC + textwrap.dedent(
    """
    import copy, multiprocessing as mp, os, sys

    def child(_):
        # A fresh interpreter: activated only by DEEPCOPY_SHIM through the .pth hook.
        twin = copy.deepcopy(make_child_net())
        return os.getpid(), twin.last_hidden.is_leaf

    class Copies(torch.utils.data.Dataset):
        def __len__(self):
            return 4
        def __getitem__(self, i):
            twin = copy.deepcopy(make_child_net(i))
            return torch.tensor([os.getpid(), int(twin.last_hidden.is_leaf)])

    if __name__ == "__main__":
        with mp.get_context(sys.argv[1]).Pool(1) as pool:
            results = pool.map(child, range(2))
        assert all(leaf for _, leaf in results) and os.getpid() not in {p for p, _ in results}
        print(sys.argv[1], "ok")
        if sys.argv[2:] != ["loader"]:
            sys.exit(0)
        loader = torch.utils.data.DataLoader(Copies(), batch_size=1, num_workers=2,
                                             multiprocessing_context=sys.argv[1])
        rows = torch.cat(list(loader))
        assert rows[:, 1].all() and os.getpid() not in set(rows[:, 0].tolist())
        print("dataloader ok")
    """
)


def test_spawn_and_dataloader_workers_inherit_activation(wheel_venv: Venv, tmp_path: Path) -> None:
    script = tmp_path / "spawn_prog.py"
    script.write_text(SPAWN_SRC)
    proc = run([wheel_venv.python, script, "spawn", "loader"], clean_env("silent"), cwd=tmp_path)
    assert proc.returncode == 0, describe(proc)
    assert proc.stdout.splitlines() == ["spawn ok", "dataloader ok"]


def test_spawn_children_of_the_runner_inherit(editable_venv: Venv, tmp_path: Path) -> None:
    # Under the runner the program's functions live in a runpy-made __main__; spawn must still
    # find them, and the children get the activation from the variable the runner set.
    script = tmp_path / "spawn_prog.py"
    script.write_text(SPAWN_SRC)
    proc = run([editable_venv.python, "-m", "deepcopy_shim", "--mode", "silent", script,
                "forkserver"], clean_env(), cwd=tmp_path)
    assert proc.returncode == 0, describe(proc)
    assert proc.stdout.splitlines() == ["forkserver ok"]


DDP_SRC = CHILD_NET_SRC + textwrap.dedent(
    """
    import copy, hashlib, json, os, sys
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    assert "deepcopy_shim" in sys.modules  # activated by DEEPCOPY_SHIM, never imported here
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DDP(make_child_net(seed=0))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(100 + rank)  # each rank its own batch; DDP averages the gradients
    loss = model(torch.randn(5, 4)).square().mean()
    loss.backward()
    opt.step()
    model(torch.randn(5, 4))  # leaves a fresh non-leaf activation cached in the module
    assert not model.module.last_hidden.is_leaf
    ema = copy.deepcopy(model.module)
    assert ema.last_hidden.is_leaf and ema.last_hidden.grad_fn is None
    digest = hashlib.sha256()
    for name, tensor in sorted(ema.state_dict().items()):
        digest.update(name.encode())
        digest.update(repr(tensor.tolist()).encode())  # exact: float repr round-trips
    with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "world": dist.get_world_size(), "sha": digest.hexdigest()}, f)
    dist.barrier()
    dist.destroy_process_group()
    """
)


@pytest.mark.parametrize("install", ["wheel", "editable"])
def test_torchrun_ranks_are_activated_by_the_variable(request: pytest.FixtureRequest, install: str,
                                                      tmp_path: Path) -> None:
    script = tmp_path / "ddp_ema.py"
    script.write_text(DDP_SRC)
    out = tmp_path / "out"
    out.mkdir()
    env = clean_env("silent", GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    if install == "wheel":
        # `python -m torch.distributed.run` is what the `torchrun` script runs; each rank is
        # started with sys.executable, the venv's interpreter.
        venv: Venv = request.getfixturevalue("wheel_venv")
        launcher = [str(venv.python), "-m", "torch.distributed.run"]
    else:
        # The torchrun console script of the interpreter running these tests (an editable
        # install of this project, as the README sets it up).
        torchrun = Path(DEV_PYTHON).parent / "torchrun"
        if not torchrun.exists():
            pytest.skip("no torchrun script beside the test interpreter")
        launcher = [str(torchrun)]
    proc = run([*launcher, "--standalone", "--nproc-per-node=2", script, out], env,
               cwd=tmp_path, timeout=180)
    assert proc.returncode == 0, describe(proc)
    reports: Dict[int, Dict[str, object]] = {}
    for rank in (0, 1):
        reports[rank] = json.loads((out / f"rank{rank}.json").read_text())
    assert {r["world"] for r in reports.values()} == {2}
    assert reports[0]["sha"] == reports[1]["sha"]
