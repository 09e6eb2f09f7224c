"""Mutation testing of deepcopy_shim/ with cosmic-ray (CONTRIBUTING.md, "Mutation testing").

    python tools/mutation.py                    # every module, in cosmic-ray.toml's harness.order
    python tools/mutation.py _record _access    # some modules (``_record``, ``_record.py`` or a path)
    python tools/mutation.py --report           # only the report of what the sessions hold so far
    python tools/mutation.py --list             # modules, their tests and their mutant counts
    python tools/mutation.py _access --changed-since 902d337   # only the lines changed since a commit

Each module is one cosmic-ray session, build/mutation/<module>.sqlite, with the tests that
cosmic-ray.toml's [harness.tests] lists for it.  A session is resumed where it stopped (Ctrl-C, a
killed shell): only mutants without a result run again.  It is started afresh when the module's
source changed since it was made, or with --fresh; --rerun-survivors runs its surviving mutants
again (after a test was added to kill them).  With --changed-since REF, the mutants of lines that
`git diff REF` shows unchanged are skipped (recorded as such): for a module whose every other
line was triaged at REF, a change is triaged in minutes instead of the whole module's run.

The mutants run on cosmic-ray HTTP workers (harness.workers, default 2), each in its own copy of
the working tree, build/mutation/worker-<n>/ (the files git tracks or would track, as they are
now, uncommitted changes included), with PYTHONPATH set to that copy: the tests, and every child
interpreter they start that keeps PYTHONPATH (``python -c`` with the test's environment),
import the mutated copy.  The tree itself is never mutated.

The report, build/mutation/report.md, gives each module's score and every surviving mutant with
its diff; survivors recorded as equivalent in tools/mutation-equivalents/<module>.toml are listed as
such.
The exit status is 1 when a survivor is neither killed nor recorded as equivalent, 2 on an error.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Set, Tuple

try:
    import tomllib as _toml_reader

    def _read_toml(path: Path) -> Dict[str, Any]:
        return _toml_reader.loads(path.read_text(encoding="utf-8"))
except ModuleNotFoundError:  # Python < 3.11: cosmic-ray's own dependency
    import toml as _toml_reader  # type: ignore[no-redef]

    def _read_toml(path: Path) -> Dict[str, Any]:
        return dict(_toml_reader.loads(path.read_text(encoding="utf-8")))


ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "deepcopy_shim"
CONFIG = ROOT / "cosmic-ray.toml"
EQUIVALENTS = ROOT / "tools" / "mutation-equivalents"  # one <module>.toml per module
OUT = ROOT / "build" / "mutation"
BIN = Path(sys.executable).parent


def log(message: str) -> None:
    print(f"[mutation {time.strftime('%H:%M:%S')}] {message}", flush=True)


def fmt_seconds(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def cosmic_ray(*args: str) -> List[str]:
    exe = BIN / "cosmic-ray"
    if not exe.exists():
        sys.exit("cosmic-ray is not installed in this environment: pip install -e '.[mutation]'")
    return [str(exe), *args]


# --- configuration ------------------------------------------------------------------------------


class Config:
    def __init__(self) -> None:
        data = _read_toml(CONFIG)
        self.cosmic_ray: Dict[str, Any] = data["cosmic-ray"]
        harness: Dict[str, Any] = data.get("harness", {})
        self.workers = int(harness.get("workers", 2))
        self.timeout_factor = float(harness.get("timeout-factor", 4.0))
        self.timeout_min = float(harness.get("timeout-min", 60.0))
        self.pytest = str(harness.get("pytest", "python -m pytest -x -q"))
        self.order: List[str] = list(harness.get("order", []))
        self.tests: Dict[str, List[str]] = {k: list(v) for k, v in harness.get("tests", {}).items()}
        self.child_tests: Dict[str, List[str]] = {
            k: list(v) for k, v in harness.get("child-tests", {}).items()}

    def modules(self) -> List[str]:
        present = sorted(p.stem for p in PACKAGE.glob("*.py"))
        return [m for m in self.order if m in present] + [m for m in present if m not in self.order]

    def test_command(self, module: str) -> str:
        files = self.tests.get(module)
        if files is None:
            return str(self.cosmic_ray["test-command"])
        paths = [f if "/" in f else f"tests/{f}.py" for f in files]
        deselect = [f"--deselect {test}" for test, wanted_by in self.child_tests.items()
                    if module not in wanted_by and test.split("::")[0] in paths]
        return " ".join([self.pytest, *deselect, *paths])


def module_name(arg: str) -> str:
    name = Path(arg).name
    return name[:-3] if name.endswith(".py") else name


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- sessions -----------------------------------------------------------------------------------


class Session:
    """One module's cosmic-ray session: build/mutation/<module>.{sqlite,toml,json}."""

    def __init__(self, module: str) -> None:
        self.module = module
        self.source = PACKAGE / f"{module}.py"
        self.db = OUT / f"{module}.sqlite"
        self.config = OUT / f"{module}.toml"
        self.meta_path = OUT / f"{module}.json"
        self.meta: Dict[str, Any] = (
            json.loads(self.meta_path.read_text(encoding="utf-8")) if self.meta_path.exists() else {}
        )

    def save_meta(self) -> None:
        self.meta_path.write_text(json.dumps(self.meta, indent=1), encoding="utf-8")

    def write_config(self, cfg: Config, test_command: str, timeout: float, urls: List[str]) -> None:
        def q(s: str) -> str:
            return json.dumps(s)  # a TOML basic string

        self.config.write_text(
            "# Written by tools/mutation.py from cosmic-ray.toml; edit that file instead.\n"
            "[cosmic-ray]\n"
            f"module-path = {q(str(self.source.relative_to(ROOT)))}\n"
            "excluded-modules = []\n"
            f"timeout = {timeout:.1f}\n"
            f"test-command = {q(test_command)}\n"
            "[cosmic-ray.distributor]\n"
            'name = "http"\n'
            "[cosmic-ray.distributor.http]\n"
            f"worker-urls = [{', '.join(q(u) for u in urls)}]\n",
            encoding="utf-8",
        )

    def init(self, cfg: Config, test_command: str) -> None:
        for path in (self.db, self.meta_path):
            path.unlink(missing_ok=True)
        self.write_config(cfg, test_command, cfg.timeout_min, ["http://localhost:1"])
        subprocess.run(cosmic_ray("init", str(self.config), str(self.db)), check=True, cwd=ROOT)
        self.meta = {"source_sha256": sha256(self.source), "test_command": test_command,
                     "exec_seconds": 0.0, "created": time.strftime("%Y-%m-%d %H:%M:%S")}
        self.save_meta()

    def is_current(self, test_command: str, changed_since: Optional[str]) -> Tuple[bool, str]:
        if not self.db.exists() or not self.meta:
            return False, "no session yet"
        if self.meta.get("changed_since") != changed_since:
            made_for = self._scope(self.meta.get("changed_since"))
            return False, f"made for {made_for}, asked for {self._scope(changed_since)}"
        if self.meta.get("source_sha256") != sha256(self.source):
            return False, f"{self.source.name} changed since the session was made"
        if self.meta.get("test_command") != test_command:
            return False, "its tests in cosmic-ray.toml changed"
        return True, ""

    @staticmethod
    def _scope(changed_since: Optional[str]) -> str:
        return "every line" if changed_since is None else f"the lines changed since {changed_since}"

    def skip_unchanged(self, ref: str) -> int:
        """Record the pending mutants of lines unchanged since the commit `ref` as skipped;
        return how many."""
        from cosmic_ray.work_db import WorkDB, use_db
        from cosmic_ray.work_item import WorkerOutcome, WorkResult

        changed = changed_lines(self.source, ref)
        with use_db(str(self.db), WorkDB.Mode.open) as db:
            skip = [item.job_id for item in db.pending_work_items
                    if not any(changed & set(range(m.start_pos[0], m.end_pos[0] + 1))
                               for m in item.mutations)]
            if skip:
                db.set_multiple_results(skip, WorkResult(output=f"unchanged since {ref}",
                                                         worker_outcome=WorkerOutcome.SKIPPED))
        return len(skip)

    @contextlib.contextmanager
    def connect(self) -> Iterator[sqlite3.Connection]:
        con = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=30)
        try:
            yield con
        finally:
            con.close()

    def counts(self) -> Dict[str, int]:
        with self.connect() as con:
            total = con.execute("select count(*) from work_items").fetchone()[0]
            rows = con.execute("select test_outcome, worker_outcome, output = 'timeout' from work_results")
            counts = {"total": total, "done": 0, "killed": 0, "timeout": 0, "survived": 0, "incompetent": 0,
                      "skipped": 0}
            for test_outcome, worker_outcome, timed_out in rows:
                counts["done"] += 1
                outcome = (test_outcome or worker_outcome or "").lower()
                if (worker_outcome or "").lower() == "skipped":
                    counts["skipped"] += 1
                elif outcome == "survived":
                    counts["survived"] += 1
                elif outcome == "killed":
                    counts["timeout" if timed_out else "killed"] += 1
                else:
                    counts["incompetent"] += 1
            return counts

    def survivors(self) -> List[Dict[str, Any]]:
        lines = self.source.read_text(encoding="utf-8").splitlines()
        with self.connect() as con:
            rows = con.execute(
                "select s.operator_name, s.occurrence, s.start_pos_row, s.start_pos_col, "
                "s.definition_name, r.diff, s.job_id from mutation_specs s "
                "join work_results r on r.job_id = s.job_id "
                "where lower(r.test_outcome) = 'survived' order by s.start_pos_row, s.start_pos_col"
            ).fetchall()
        out = []
        for op, occurrence, row, col, definition, diff, job_id in rows:
            out.append({
                "module": self.module, "operator": op, "occurrence": occurrence, "line": row,
                "col": col, "function": definition or "<module>", "diff": diff or "", "job_id": job_id,
                "source": lines[row - 1].strip() if 0 < row <= len(lines) else "",
            })
        return out

    def forget_survivors(self) -> int:
        con = sqlite3.connect(self.db, timeout=30)
        try:
            n = con.execute("delete from work_results where lower(test_outcome) = 'survived'").rowcount
            con.commit()
            return int(n)
        finally:
            con.close()


# --- workers ------------------------------------------------------------------------------------


def changed_lines(source: Path, ref: str) -> Set[int]:
    """The line numbers of `source` that `git diff -U0 ref` shows added or changed."""
    diff = subprocess.run(["git", "diff", "-U0", ref, "--", str(source.relative_to(ROOT))], cwd=ROOT,
                          capture_output=True, text=True, check=True).stdout
    lines: Set[int] = set()
    for hunk in re.finditer(r"^@@ -\S+ \+(\d+)(?:,(\d+))? @@", diff, re.MULTILINE):
        start = int(hunk.group(1))
        lines.update(range(start, start + int(hunk.group(2) or 1)))
    return lines


def tree_files() -> List[str]:
    """The files of the working tree that git tracks or would track (not ignored), as now."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         cwd=ROOT, check=True, capture_output=True).stdout
    return [f for f in out.decode().split("\0") if f and (ROOT / f).is_file()]


def make_copy(dest: Path, files: List[str]) -> None:
    if dest.exists():
        shutil.rmtree(dest)
    for f in files:
        target = dest / f
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, target)


def child_env(copy: Path) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("DEEPCOPY_SHIM", "PYTHONPATH", "PYTHONSTARTUP", "COVERAGE_PROCESS_START")}
    env["PYTHONPATH"] = str(copy)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"  # `python` is this environment's
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Workers:
    def __init__(self, n: int) -> None:
        self.n = n
        self.copies = [OUT / f"worker-{i}" for i in range(n)]
        self.procs: List[subprocess.Popen[bytes]] = []
        self.urls: List[str] = []

    def __enter__(self) -> Workers:
        files = tree_files()
        for copy in self.copies:
            make_copy(copy, files)
        log(f"{self.n} worker copies of the tree ({len(files)} files) in {OUT.relative_to(ROOT)}/worker-*")
        for copy in self.copies:
            port = free_port()
            logf = open(OUT / f"{copy.name}.log", "ab")  # the worker keeps its own descriptor
            proc = subprocess.Popen(cosmic_ray("http-worker", "--port", str(port)), cwd=copy,
                                    env=child_env(copy), stdout=logf, stderr=subprocess.STDOUT)
            logf.close()
            self.procs.append(proc)
            self.urls.append(f"http://127.0.0.1:{port}")
        for proc, url in zip(self.procs, self.urls):
            port = int(url.rsplit(":", 1)[1])
            deadline = time.monotonic() + 60
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"a cosmic-ray worker exited at start; see {OUT}/worker-*.log")
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"a cosmic-ray worker did not listen on {url} within 60 s")
                time.sleep(0.2)
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def baseline(self, test_command: str) -> Tuple[bool, float, str]:
        """The module's tests on the unmutated copy: (passed, seconds, output)."""
        copy = self.copies[0]
        start = time.monotonic()
        proc = subprocess.run(shlex.split(test_command), cwd=copy, env=child_env(copy),
                              capture_output=True, text=True)
        return proc.returncode == 0, time.monotonic() - start, proc.stdout + proc.stderr


# --- running ------------------------------------------------------------------------------------


def progress(session: Session, stop: threading.Event, started: float, every: float) -> None:
    last = -1
    while not stop.wait(every):
        with contextlib.suppress(sqlite3.Error):
            c = session.counts()
            if c["done"] == last:
                continue
            last = c["done"]
            elapsed = time.monotonic() - started
            done_now = c["done"] - session.meta.get("_done_at_start", 0)
            eta = elapsed / done_now * (c["total"] - c["done"]) if done_now else 0.0
            log(f"{session.module}: {c['done']}/{c['total']} mutants, {c['survived']} survived, "
                f"{c['killed'] + c['timeout']} killed ({c['timeout']} by timeout), "
                f"{fmt_seconds(elapsed)} so far, ~{fmt_seconds(eta)} left")


def run_module(session: Session, cfg: Config, workers: Workers, args: argparse.Namespace) -> bool:
    test_command = cfg.test_command(session.module)
    current, why = session.is_current(test_command, args.changed_since)
    if args.fresh or not current:
        log(f"{session.module}: new session ({'--fresh' if args.fresh else why})")
        session.init(cfg, test_command)
        if args.changed_since is not None:
            skipped = session.skip_unchanged(args.changed_since)
            session.meta["changed_since"] = args.changed_since
            session.save_meta()
            log(f"{session.module}: {skipped} mutants of lines unchanged since {args.changed_since} skipped")
    elif args.rerun_survivors:
        log(f"{session.module}: {session.forget_survivors()} survivors to run again")
    c = session.counts()
    if c["done"] == c["total"]:
        log(f"{session.module}: complete ({c['total']} mutants); --fresh or --rerun-survivors runs it again")
        return True
    passed, seconds, output = workers.baseline(test_command)
    if not passed:
        log(f"{session.module}: its tests FAIL on the unmutated tree; not mutating it:\n{output[-4000:]}")
        return False
    timeout = max(cfg.timeout_min, cfg.timeout_factor * seconds)
    session.write_config(cfg, test_command, timeout, workers.urls)
    log(f"{session.module}: {c['total'] - c['done']} of {c['total']} mutants to run; tests pass unmutated "
        f"in {seconds:.1f}s (timeout per mutant {timeout:.0f}s): {test_command}")
    session.meta["_done_at_start"] = c["done"]
    stop = threading.Event()
    started = time.monotonic()
    ticker = threading.Thread(target=progress, args=(session, stop, started, args.progress_every),
                              daemon=True)
    ticker.start()
    try:
        proc = subprocess.run(cosmic_ray("exec", str(session.config), str(session.db)), cwd=ROOT)
    finally:
        stop.set()
        ticker.join()
        session.meta.pop("_done_at_start", None)
        session.meta["exec_seconds"] = session.meta.get("exec_seconds", 0.0) + time.monotonic() - started
        session.meta["baseline_seconds"] = seconds
        session.meta["workers"] = workers.n
        session.save_meta()
    c = session.counts()
    log(f"{session.module}: {c['done']}/{c['total']} done in {fmt_seconds(time.monotonic() - started)}, "
        f"{c['survived']} survived")
    return proc.returncode == 0 and c["done"] == c["total"]


# --- report -------------------------------------------------------------------------------------


def load_equivalents() -> List[Dict[str, str]]:
    """Every recorded equivalent: the entries of each module's file in EQUIVALENTS (one file
    per module, so that survivors of different modules are judged apart)."""
    found: List[Dict[str, str]] = []
    for path in sorted(EQUIVALENTS.glob("*.toml")):
        found.extend(dict(e) for e in _read_toml(path).get("equivalent", []))
    return found


def is_equivalent(survivor: Dict[str, Any], equivalents: List[Dict[str, str]]) -> Optional[str]:
    for e in equivalents:
        if (module_name(e.get("module", "")) == survivor["module"]
                and e.get("operator") == survivor["operator"]
                and " ".join(e.get("line", "").split()) == " ".join(survivor["source"].split())):
            return e.get("why", "")
    return None


def report(modules: List[str]) -> int:
    equivalents = load_equivalents()
    table = ["| module | mutants | done | killed | timeout | survived | equivalent | score | run time |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    details: List[str] = []
    unexplained = 0
    totals = dict.fromkeys(("total", "done", "killed", "timeout", "survived", "incompetent", "equiv"), 0)
    seconds_total = 0.0
    for module in modules:
        session = Session(module)
        if not session.db.exists():
            continue
        c = session.counts()
        survivors = session.survivors()
        equiv = [(s, is_equivalent(s, equivalents)) for s in survivors]
        n_equiv = sum(1 for _, why in equiv if why is not None)
        unexplained += len(survivors) - n_equiv
        for k in totals:
            totals[k] += n_equiv if k == "equiv" else c[k]
        killed = c["killed"] + c["timeout"]
        judged = killed + c["survived"] - n_equiv
        score = f"{100 * killed / judged:.1f}%" if judged else "-"
        seconds = float(session.meta.get("exec_seconds", 0.0))
        seconds_total += seconds
        stale = ("" if session.meta.get("source_sha256") == sha256(session.source)
                 else " (source changed since)")
        if session.meta.get("changed_since"):
            stale += (f" (lines changed since {session.meta['changed_since']} only: "
                      f"{c['skipped']} mutants skipped)")
        table.append(f"| `{module}`{stale} | {c['total']} | {c['done']} | {c['killed']} | {c['timeout']} | "
                     f"{c['survived']} | {n_equiv} | {score} | {fmt_seconds(seconds)} |")
        if survivors:
            details.append(f"\n## `{module}`: {len(survivors)} surviving\n")
            details.append(f"Tests: `{session.meta.get('test_command', '?')}`\n")
            for s, why in equiv:
                verdict = (f"equivalent: {why}" if why is not None
                           else "**not killed, not recorded as equivalent**")
                details.append(f"### {module}.py:{s['line']} `{s['function']}` {s['operator']} "
                               f"(occurrence {s['occurrence']})\n\n{verdict}\n\n"
                               f"```diff\n{s['diff'].strip()}\n```\n")
    killed = totals["killed"] + totals["timeout"]
    judged = killed + totals["survived"] - totals["equiv"]
    table.append(f"| **all** | {totals['total']} | {totals['done']} | {totals['killed']} | "
                 f"{totals['timeout']} | {totals['survived']} | {totals['equiv']} | "
                 f"{f'{100 * killed / judged:.1f}%' if judged else '-'} | {fmt_seconds(seconds_total)} |")
    text = "\n".join([
        "# Mutation testing report (tools/mutation.py)\n",
        "Score: killed (timeouts included) / (killed + survived - equivalent). Run time: cosmic-ray's",
        "exec time summed over the session's runs, on the workers it had.\n",
        *table, *details, ""])
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "report.md").write_text(text, encoding="utf-8")
    print("\n".join(table))
    log(f"report: {(OUT / 'report.md').relative_to(ROOT)}; {unexplained} survivors neither killed nor "
        "recorded as equivalent")
    return 1 if unexplained else 0


def list_modules(cfg: Config, modules: List[str]) -> None:
    scratch = OUT / "list"
    scratch.mkdir(parents=True, exist_ok=True)
    for module in modules:
        conf = scratch / f"{module}.toml"
        conf.write_text(f'[cosmic-ray]\nmodule-path = "deepcopy_shim/{module}.py"\nexcluded-modules = []\n'
                        'timeout = 1.0\ntest-command = "true"\n[cosmic-ray.distributor]\nname = "local"\n',
                        encoding="utf-8")
        db = scratch / f"{module}.sqlite"
        db.unlink(missing_ok=True)
        subprocess.run(cosmic_ray("init", str(conf), str(db)), check=True, cwd=ROOT)
        con = sqlite3.connect(db)
        n = con.execute("select count(*) from work_items").fetchone()[0]
        con.close()
        print(f"{module:15s} {n:5d} mutants   {cfg.test_command(module)}")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("modules", nargs="*", help="modules of deepcopy_shim/ (default: all)")
    parser.add_argument("--fresh", action="store_true", help="discard the sessions' results and start again")
    parser.add_argument("--rerun-survivors", action="store_true",
                        help="run the sessions' surviving mutants again (after adding tests)")
    parser.add_argument("--report", action="store_true", help="only write the report of the sessions")
    parser.add_argument("--list", action="store_true", help="list modules, their tests and mutant counts")
    parser.add_argument("--changed-since", metavar="REF",
                        help="skip the mutants of lines unchanged since the commit REF (git diff REF)")
    parser.add_argument("--workers", type=int, help="cosmic-ray workers (default: harness.workers)")
    parser.add_argument("--progress-every", type=float, default=30.0, metavar="S",
                        help="seconds between progress lines (default 30)")
    args = parser.parse_args(argv)

    cfg = Config()
    known = cfg.modules()
    modules = [module_name(m) for m in args.modules] or known
    unknown = [m for m in modules if m not in known]
    if unknown:
        parser.error(f"no such module in deepcopy_shim/: {', '.join(unknown)}")
    OUT.mkdir(parents=True, exist_ok=True)
    if args.list:
        list_modules(cfg, modules)
        return 0
    if args.report:
        return report(modules)

    # Ctrl-C, and a SIGTERM (or a SIGINT that a background shell set to be ignored), stop the
    # run the same way: the workers are stopped and the sessions keep what is done.
    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)
    n_workers = args.workers or cfg.workers
    started = time.monotonic()
    ok = True
    try:
        with Workers(n_workers) as workers:
            for module in modules:
                ok = run_module(Session(module), cfg, workers, args) and ok
    except KeyboardInterrupt:
        log("interrupted: run the same command again to resume")
        return 130
    log(f"{len(modules)} modules in {fmt_seconds(time.monotonic() - started)} on {n_workers} workers")
    status = report(modules)
    return status if ok else 2


if __name__ == "__main__":
    sys.exit(main())
