"""Under load (issue 28): first use from many threads and tasks at once, and a bounded soak.

Each test starts fresh interpreters, so that the shim's modules are imported by the load
itself (the start-up race lives in the first use).  The soak runs a few seconds by default;
`DEEPCOPY_SHIM_SOAK_SECONDS` (and `DEEPCOPY_SHIM_SOAK_STARTS`) make it longer, as tox's
`soak` environment does.
"""

from __future__ import annotations

import os
import sys
import textwrap

from support.processes import REPO, describe, run_code, same_code_env

# A scope that ends in one thread while another imports deepcopy_shim._record (the first
# copy's install imports it): the import is held half-made until the scope has ended.
_HALF_IMPORTED = textwrap.dedent(
    """
    import importlib.util, sys, threading
    import torch
    import deepcopy_shim

    importing, left = threading.Event(), threading.Event()

    class Holds:
        # Finds deepcopy_shim._record and holds its execution until another thread has left a
        # scope: sys.modules holds the half-made module meanwhile, as in any import.
        def find_spec(self, name, path=None, target=None):
            if name != "deepcopy_shim._record":
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            run = spec.loader.exec_module

            def exec_module(module):
                importing.set()
                left.wait(20)
                run(module)

            spec.loader.exec_module = exec_module
            return spec

    assert "deepcopy_shim._record" not in sys.modules
    sys.meta_path.insert(0, Holds())
    errors = []

    def first_user():
        try:
            deepcopy_shim.enable("warn")
        except BaseException as exc:
            errors.append(repr(exc))

    def leaves_a_scope():
        importing.wait(20)
        try:  # neither needs the patch, so neither waits for the import
            with deepcopy_shim.enabled("off"):
                pass
            deepcopy_shim.disable()
        except BaseException as exc:
            errors.append(repr(exc))
        finally:
            left.set()

    threads = [threading.Thread(target=first_user), threading.Thread(target=leaves_a_scope)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    deepcopy_shim.disable()
    print("errors:", errors)
    """
)


def test_a_scope_that_ends_while_another_thread_imports_the_records_module_is_harmless() -> None:
    proc = run_code(sys.executable, _HALF_IMPORTED, same_code_env(), cwd=REPO, timeout=120)
    assert proc.returncode == 0, describe(proc)
    assert proc.stdout.strip().splitlines()[-1] == "errors: []", describe(proc)


_SOAK = textwrap.dedent(
    """
    import asyncio, copy, gc, random, sys, threading, time, warnings
    import torch
    import deepcopy_shim
    from deepcopy_shim import NonLeafTensorError

    ORIGINAL = vars(torch.Tensor)["__deepcopy__"]
    TABLE = copy._deepcopy_dispatch
    start = threading.Barrier(5)
    errors, done = [], []

    class Fails:
        def __deepcopy__(self, memo):
            raise ValueError("cannot copy this")

    # Warnings caught per thread (catch_warnings is process-wide state: no use across threads).
    caught = threading.local()

    def show(message, category, filename, lineno, file=None, line=None):
        if category is deepcopy_shim.DetachedTensorsWarning:
            caught.paths = getattr(caught, "paths", []) + [message.paths]

    warnings.simplefilter("always")
    warnings.showwarning = show

    def warned(step):
        caught.paths = []
        made = step()
        return made, caught.paths

    def source():
        return {"t": torch.ones(2, requires_grad=True) * 2, "leaf": torch.ones(1)}

    def one_step(rng):
        choice = rng.randrange(8)
        src = source()
        if choice == 0:
            mode = rng.choice(["warn", "silent"])
            with deepcopy_shim.enabled(mode):
                made, paths = warned(lambda: copy.deepcopy(src))
            assert made["t"].grad_fn is None and made["t"].requires_grad
            assert paths == ([("['t']",)] if mode == "warn" else []), paths
        elif choice == 1:
            try:
                with deepcopy_shim.enabled("strict"):
                    copy.deepcopy(src)
                raise AssertionError("strict copied a tensor with history")
            except NonLeafTensorError as exc:
                assert exc.paths == ("['t']",), exc.paths
        elif choice == 2:
            made = deepcopy_shim.deepcopy(src, "silent")
            assert made["t"].grad_fn is None
        elif choice == 3:
            assert [p for p, _ in deepcopy_shim.find_nonleaf_tensors(src)] == ["['t']"]
        elif choice == 4:
            deepcopy_shim.enable(rng.choice(["warn", "silent", "strict"]))
            deepcopy_shim.disable()
        elif choice == 5:
            with deepcopy_shim.enabled(rng.choice(["warn", "silent", "strict", "off"])):
                pass
        elif choice == 6:  # a failing copy, in a mode
            src["x"] = Fails()
            try:
                with deepcopy_shim.enabled(rng.choice(["warn", "silent", "strict"])):
                    warned(lambda: copy.deepcopy(src))
                raise AssertionError("a failing copy completed")
            except (ValueError, NonLeafTensorError):
                assert caught.paths == [], caught.paths  # nothing said of a failed copy
        else:  # no mode here: native, whatever other threads do
            try:
                copy.deepcopy(src)
                raise AssertionError("a native copy of a tensor with history completed")
            except RuntimeError as exc:
                assert "graph leaves" in str(exc)

    def worker(seed):
        rng = random.Random(seed)
        start.wait()
        deadline = time.monotonic() + SECONDS
        while time.monotonic() < deadline:
            try:
                one_step(rng)
                done.append(1)
            except BaseException as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
                return

    async def task(seed):
        rng = random.Random(seed)
        deadline = time.monotonic() + SECONDS
        while time.monotonic() < deadline:
            try:
                mode = rng.choice(["warn", "silent"])
                with deepcopy_shim.enabled(mode):
                    made = copy.deepcopy([torch.ones(2, requires_grad=True) * 2])
                    await asyncio.sleep(0)  # another task runs inside this one's scope
                    assert deepcopy_shim.current_mode().mode == mode, (deepcopy_shim.current_mode(), mode)
                assert made[0].grad_fn is None, made
                done.append(1)
            except BaseException as exc:
                errors.append(f"task {type(exc).__name__}: {exc}")
                return

    async def tasks():
        await asyncio.to_thread(start.wait)
        await asyncio.gather(task(SEED + 10), task(SEED + 11))

    threads = [threading.Thread(target=worker, args=(SEED + i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    asyncio.run(tasks())
    for thread in threads:
        thread.join(SECONDS + 60)
        if thread.is_alive():
            errors.append("a thread hung")
    deepcopy_shim.disable()
    if (vars(torch.Tensor)["__deepcopy__"] is not ORIGINAL or "__deepcopy__" in vars(torch.nn.Module)
            or copy._deepcopy_dispatch is not TABLE):
        errors.append("torch or copy not restored")
    if deepcopy_shim._record.current() is not None:
        errors.append("a copy left running")
    print("steps:", len(done), "errors:", errors[:5])
    """
)


def test_a_soak_from_cold_threads_and_tasks_get_right_results_and_torch_is_restored() -> None:
    seconds = float(os.environ.get("DEEPCOPY_SHIM_SOAK_SECONDS", "2"))
    starts = int(os.environ.get("DEEPCOPY_SHIM_SOAK_STARTS", "2"))
    for seed in range(starts):
        proc = run_code(sys.executable, f"SECONDS, SEED = {seconds}, {seed}\n{_SOAK}",
                        same_code_env(), cwd=REPO, timeout=seconds + 180)
        assert proc.returncode == 0, describe(proc)
        last = proc.stdout.strip().splitlines()[-1]
        assert last.endswith("errors: []") and not last.startswith("steps: 0 "), describe(proc)
