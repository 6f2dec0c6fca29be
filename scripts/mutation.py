"""Mutation score of the pure cores (``make mutation``): cosmic-ray, one module at a time.

Usage: ``python scripts/mutation.py [NAME ...]`` (default: every module of ``MODULES``).
Prints a score table (killed / total, %) and writes ``runs/mutation/<NAME>.json`` with the
module's score and every surviving mutant (operator, line, diff).

Each module is mutated against ONLY its own fast test files, with cosmic-ray's arithmetic,
comparison, boolean and constant operators (``OPERATORS``). cosmic-ray mutates the module
file in place, so it never runs on the checkout: every module gets a throw-away copy of the
packages and tests in a temporary folder, laid out as the installed ``rockroll`` package
(``rockroll/<subpackage>/...``, from pyproject's package-dir), which Python imports before
the editable install's finder. An interrupted run (Ctrl-C, a killed job) can therefore leave
at most a stale temporary folder, never a mutated file in the working tree.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "runs" / "mutation"

# name -> (module file, its fast test files, top-level definitions to mutate or None = all).
# Paths are relative to the repository root: the one place to edit when a module moves.
MODULES: dict[str, tuple[str, list[str], list[str] | None]] = {
    "algorithms": ("trainer/algorithms/pg.py", ["tests/trainer/test_algorithms.py"], None),
    "credit": ("trainer/algorithms/credit.py", ["tests/trainer/test_credit.py"], None),
    "actions": ("gem/actions.py", ["tests/gem/test_actions.py"], None),
    "version": ("envhub/version.py", ["tests/envhub/test_version.py"], None),
    # The host <-> guest protocol: its framing, stdlib-only and pure, is mutated (the
    # guest's config travels in a frame and is checked by every real sandbox).
    "framing": ("sandbox/protocol/frames.py", ["tests/sandbox/test_wire.py"], ["encode_frame", "FrameReader"]),
    "wire": ("sandbox/protocol/wire.py", ["tests/sandbox/test_wire.py"], None),
}

# The mutation operators kept (regexes over cosmic-ray's operator names; the rest are
# skipped). Arithmetic: + - * / swapped pairwise, // -> /, ** -> *, & <-> | (masks), unary
# minus / ~ / not deleted. Comparison: PIT's "boundary" (< -> <=) and "negation" (< -> >=)
# pairs. Boolean: and <-> or, True <-> False, `not` added to if/while conditions.
# Constant: every number literal +1 and -1.
OPERATORS = [
    r"core/ReplaceBinaryOperator_(Add_Sub|Sub_Add|Mul_Div|Div_Mul|FloorDiv_Div|Pow_Mul|BitAnd_BitOr|BitOr_BitAnd)$",
    r"core/ReplaceUnaryOperator_Delete_(USub|Invert|Not)$",
    r"core/ReplaceComparisonOperator_(Lt_LtE|Lt_GtE|LtE_Lt|LtE_Gt|Gt_GtE|Gt_LtE|GtE_Gt|GtE_Lt"
    r"|Eq_NotEq|NotEq_Eq|Is_IsNot|IsNot_Is|In_NotIn|NotIn_In)$",
    r"core/(ReplaceAndWithOr|ReplaceOrWithAnd|ReplaceTrueWithFalse|ReplaceFalseWithTrue|AddNot)$",
    r"core/NumberReplacer$",
]


def _package_dirs() -> dict[str, str]:
    """{source folder: its path in the installed layout}, e.g. {"trainer": "rockroll/trainer"}."""
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    mapping = cfg["tool"]["setuptools"]["package-dir"]
    return {src: pkg.replace(".", "/") for pkg, src in mapping.items()}


def _copy_tree(dest: Path) -> dict[str, str]:
    """Copy the packages (installed layout), the tests and pyproject.toml under ``dest``."""
    dirs = _package_dirs()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    # the top package first: the sub-packages are copied into it
    for src, dst in sorted(dirs.items(), key=lambda kv: kv[1].count("/")):
        shutil.copytree(ROOT / src, dest / dst, ignore=ignore, dirs_exist_ok=True)
    shutil.copytree(ROOT / "tests", dest / "tests", ignore=ignore)
    shutil.copy2(ROOT / "pyproject.toml", dest / "pyproject.toml")
    return dirs


def _installed_path(path: str, dirs: dict[str, str]) -> str:
    top, _, rest = path.partition("/")
    return f"{dirs[top]}/{rest}"


def _scope_lines(source: Path, names: list[str]) -> list[tuple[int, int]]:
    """Line ranges (1-based, inclusive) of the named top-level definitions."""
    tree = ast.parse(source.read_text())
    found = {n.name: (n.lineno, n.end_lineno) for n in tree.body
             if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    missing = [n for n in names if n not in found]
    if missing:
        raise SystemExit(f"{source}: no top-level definition {missing}")
    return [found[n] for n in names]


def _span(n: ast.AST) -> tuple[tuple[int, int], tuple[int, int]]:
    return (n.lineno, n.col_offset), (n.end_lineno, n.end_col_offset)


def _not_run(source: Path):
    """A predicate: is a mutant at this (line, col) in text that never runs as an operator?
    Two places cosmic-ray mutates are not code: annotations, in a module with ``from
    __future__ import annotations`` (never evaluated, so ``Tensor | None`` -> ``Tensor &
    None`` changes nothing), and the bare ``*`` that starts keyword-only parameters, which
    it takes for a multiplication (no ``ast.BinOp`` is there)."""
    tree = ast.parse(source.read_text())
    lazy = any(isinstance(n, ast.ImportFrom) and n.module == "__future__" and
               any(a.name == "annotations" for a in n.names) for n in tree.body)
    notes = []
    if lazy:
        for n in ast.walk(tree):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.returns is not None:
                notes.append(_span(n.returns))
            elif isinstance(n, ast.arg) and n.annotation is not None:
                notes.append(_span(n.annotation))
            elif isinstance(n, ast.AnnAssign):
                notes.append(_span(n.annotation))
    binops = [_span(n) for n in ast.walk(tree) if isinstance(n, (ast.BinOp, ast.AugAssign))]

    def inside(pos, spans):
        return any(lo <= pos < hi for lo, hi in spans)

    def not_run(m) -> bool:
        pos = tuple(m.start_pos)
        if inside(pos, notes):
            return True
        return m.operator_name.startswith("core/ReplaceBinaryOperator") and not inside(pos, binops)
    return not_run


def _skip(db_path: Path, keep) -> None:
    """Mark every pending mutant for which ``keep(mutation)`` is false as skipped."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    with use_db(str(db_path), WorkDB.Mode.open) as db:
        for item in list(db.pending_work_items):
            if not all(keep(m) for m in item.mutations):
                db.set_result(item.job_id, WorkResult(output="filtered", worker_outcome=WorkerOutcome.SKIPPED))


def run_module(name: str, timeout_floor: float) -> dict:
    path, tests, scope = MODULES[name]
    work = Path(tempfile.mkdtemp(prefix=f"rockroll-mutation-{name}-"))
    try:
        dirs = _copy_tree(work)
        module = _installed_path(path, dirs)
        # no plugin autoload: the pure tests need none, and loading them (hypothesis,
        # schemathesis, ...) would cost seconds per mutant
        # no bytecode cache: a mutant written within the second of the last one, at the
        # same size, could otherwise be run from the previous mutant's .pyc
        test_cmd = ["env", "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1", "PYTHONDONTWRITEBYTECODE=1",
                    sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
        # the unmutated module must pass its tests, or every mutant would count as killed
        start = time.monotonic()
        base = subprocess.run(test_cmd, cwd=work, capture_output=True, text=True)
        took = time.monotonic() - start
        if base.returncode != 0:
            raise SystemExit(f"{name}: the tests fail without a mutant:\n{base.stdout[-3000:]}")
        cfg = work / "cosmic-ray.toml"
        cfg.write_text(
            "[cosmic-ray]\n"
            f"module-path = {json.dumps(module)}\n"
            # a mutant that loops forever is killed by the timeout
            f"timeout = {max(timeout_floor, 5 * took):.0f}\n"
            "excluded-modules = []\n"
            f"test-command = {json.dumps(shlex.join(test_cmd))}\n"  # cosmic-ray shlex.splits it
            "[cosmic-ray.distributor]\nname = \"local\"\n")
        db = work / "session.sqlite"
        cr = str(Path(sys.executable).parent / "cosmic-ray")
        subprocess.run([cr, "init", str(cfg), str(db)], cwd=work, check=True, capture_output=True)
        kept = re.compile("|".join(f"(?:{o})" for o in OPERATORS))
        lines = _scope_lines(work / module, scope) if scope else None
        not_run = _not_run(work / module)
        _skip(db, lambda m: kept.match(m.operator_name) and not not_run(m) and (
            lines is None or any(lo <= m.start_pos[0] <= hi for lo, hi in lines)))
        subprocess.run([cr, "exec", str(cfg), str(db)], cwd=work, check=True, capture_output=True)
        return _score(name, path, db)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _score(name: str, path: str, db_path: Path) -> dict:
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import TestOutcome, WorkerOutcome

    killed, survivors, total = 0, [], 0
    with use_db(str(db_path), WorkDB.Mode.open) as db:
        for item, result in db.completed_work_items:
            if result.worker_outcome == WorkerOutcome.SKIPPED:
                continue
            total += 1
            if result.test_outcome == TestOutcome.SURVIVED:
                m = item.mutations[0]
                survivors.append({"operator": m.operator_name.removeprefix("core/"), "line": m.start_pos[0],
                                  "diff": "\n".join(l for l in (result.diff or "").splitlines()
                                                    if l[:1] in "+-" and l[:3] not in ("+++", "---"))})
            else:
                killed += 1
        pending = db.num_work_items - db.num_results
    if pending:
        raise SystemExit(f"{name}: {pending} mutants were not run")
    survivors.sort(key=lambda s: (s["line"], s["operator"]))
    return {"module": path, "killed": killed, "total": total,
            "score": round(100 * killed / total, 1) if total else 100.0, "survivors": survivors}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help=f"modules to mutate (default all: {', '.join(MODULES)})")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="least seconds one mutant's test run may take (default 60; else 5x the clean run)")
    args = parser.parse_args(argv)
    names = args.names or list(MODULES)
    unknown = [n for n in names if n not in MODULES]
    if unknown:
        parser.error(f"unknown module {unknown}; choose from {', '.join(MODULES)}")
    results = {}
    for name in names:
        start = time.monotonic()
        results[name] = run_module(name, args.timeout)
        r = results[name]
        print(f"{name:<11} {r['module']:<22} {r['killed']:>4}/{r['total']:<4} {r['score']:5.1f} %"
              f"  ({time.monotonic() - start:.0f} s)", flush=True)
        for s in r["survivors"]:
            print(f"    survived line {s['line']} {s['operator']}: " + s["diff"].replace("\n", " | "))
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / f"{name}.json").write_text(json.dumps(r, indent=2) + "\n")
    print(f"\nmodule      file                   killed/total  score   (results: {RESULTS.relative_to(ROOT)}/NAME.json)")
    for name in names:
        r = results[name]
        print(f"{name:<11} {r['module']:<22} {r['killed']:>4}/{r['total']:<4}    {r['score']:5.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
