"""The pure pieces of rock/SWE-v0: bug mutations, diffs, patch filtering, pytest reports,
SWE-bench records, repository layouts. No sandbox needed."""

from __future__ import annotations

import ast
import hashlib
import hmac
import json
import os
import shlex
import subprocess
import sys

import pytest

from rockroll.gem.swe import (PLUGIN, PYTEST, REPORT_PLUGIN, filter_patch, grading_command, is_graded_path,
                              is_test_path, numstat_paths, patch_paths, read_report, task_from_record)
from rockroll.gem.swe_build import (BuildSWEError, detect_layout, env_version, parse_requirement,
                                    problem_statement, _Kept, _order)
from rockroll.gem.swe_mutate import KINDS, find_mutations, unified_diff

SOURCE = '''"""Module docstring: 1 < 2 is not code."""


def clamp(x, lo, hi):
    """Keep x in [lo, hi]."""
    if x < lo:
        return lo
    return min(x, hi)


def last(items):
    return items[-1] if items else None


def window(seq, n=3):
    enabled = True
    return [seq[i:i + 1] for i in range(len(seq) - 1)] if enabled else n
'''


def _by_kind(mutations):
    out = {}
    for m in mutations:
        out.setdefault(m.kind, []).append(m)
    return out


def test_every_kind_is_proposed_and_each_result_parses():
    ms = find_mutations("mod.py", SOURCE)
    kinds = _by_kind(ms)
    assert set(kinds) == set(KINDS)
    for m in ms:
        ast.parse(m.apply(SOURCE))
    assert len({(m.start, m.end, m.after) for m in ms}) == len(ms)  # no duplicates


def test_mutations_edit_exactly_what_they_say():
    kinds = _by_kind(find_mutations("mod.py", SOURCE))
    flips = {m.before + "->" + m.after for m in kinds["flip-comparison"]}
    assert flips == {"<->>="}
    flipped = kinds["flip-comparison"][0].apply(SOURCE)
    assert "    if x >= lo:\n" in flipped and flipped.count("\n") == SOURCE.count("\n")
    swaps = {m.before + "->" + m.after for m in kinds["swap-args"]}
    assert "x, hi->hi, x" in swaps
    removed = [m for m in kinds["remove-branch"] if m.function == "clamp"][0].apply(SOURCE)
    assert "    pass\n    return min(x, hi)" in removed
    offs = {m.before + "->" + m.after for m in kinds["off-by-one"]}
    assert {"-1->-2", "i + 1->i", "len(seq) - 1->len(seq)"} <= offs
    consts = {m.before + "->" + m.after for m in kinds["wrong-constant"]}
    assert consts == {"True->False", "3->4"}


def test_docstrings_and_annotations_are_never_mutated():
    src = 'def f(x: "int" = 2) -> bool:\n    """2 < 3 and True."""\n    return x\n'
    ms = find_mutations("f.py", src)
    assert [m.before for m in ms] == ["2"]  # only the default value
    assert find_mutations("bad.py", "def (:\n") == []


def test_mutation_ids_are_stable_and_apply_checks_the_source():
    a, b = find_mutations("mod.py", SOURCE), find_mutations("mod.py", SOURCE)
    assert [m.id for m in a] == [m.id for m in b] and len({m.id for m in a}) == len(a)
    with pytest.raises(ValueError, match="does not read"):
        a[0].apply(SOURCE.replace("x < lo", "x == lo"))


def test_unified_diff_round_trips_through_git_apply(tmp_path):
    m = _by_kind(find_mutations("pkg/mod.py", SOURCE))["flip-comparison"][0]
    (tmp_path / "pkg").mkdir()
    target = tmp_path / "pkg" / "mod.py"
    target.write_text(SOURCE)
    bug = unified_diff("pkg/mod.py", SOURCE, m.apply(SOURCE))
    subprocess.run(["git", "apply", "-"], input=bug, text=True, cwd=tmp_path, check=True)
    assert target.read_text() == m.apply(SOURCE)
    fix = unified_diff("pkg/mod.py", m.apply(SOURCE), SOURCE)
    subprocess.run(["git", "apply", "-"], input=fix, text=True, cwd=tmp_path, check=True)
    assert target.read_text() == SOURCE
    assert unified_diff("x.py", "same\n", "same\n") == ""
    created = unified_diff("pkg/new.py", "", "x = 1\n")
    subprocess.run(["git", "apply", "-"], input=created, text=True, cwd=tmp_path, check=True)
    assert (tmp_path / "pkg" / "new.py").read_text() == "x = 1\n"
    subprocess.run(["git", "apply", "-"], input=unified_diff("pkg/new.py", "x = 1\n", ""), text=True,
                   cwd=tmp_path, check=True)
    assert not (tmp_path / "pkg" / "new.py").exists()


def test_order_alternates_kinds_and_is_seeded():
    ms = find_mutations("mod.py", SOURCE)
    first = _order(list(ms), "pkg==1.0")
    assert first == _order(list(ms), "pkg==1.0") and sorted(first, key=id) == sorted(ms, key=id)
    assert len({m.kind for m in first[:5]}) == 5
    assert [m.id for m in _order(list(ms), "other==2.0")] != [m.id for m in first]


# ---- grading pieces ------------------------------------------------------------------------
def _diff(path: str) -> str:
    return f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n@@ -1 +1 @@\n-a\n+b\n"


@pytest.mark.parametrize("path,graded", [
    ("pkg/core.py", True), ("src/pkg/util.py", True), ("tests/test_core.py", False),
    ("pkg/tests/helpers.py", False), ("test_inflection.py", False), ("pkg/core_test.py", False),
    ("conftest.py", False), ("pkg/conftest.py", False), ("setup.cfg", False), ("tox.ini", False),
    ("pyproject.toml", False), ("pkg/testing_utils.py", True), ("contest.py", True), ("pkg/pytest.ini", False)])
def test_test_paths(path, graded):
    assert is_test_path(path) is not graded


@pytest.mark.parametrize("path,graded", [
    ("pkg/core.py", True), ("inflection.py", True), ("pkg/json.py", True), ("docs/site/index.md", True),
    ("tests/test_core.py", False), ("pkg/__pycache__/core.cpython-311.pyc", False), ("x.egg-info/PKG-INFO", False),
    # what runs when Python or pytest starts, before the reporting plugin hides its key
    ("sitecustomize.py", False), ("src/usercustomize.py", False), ("pkg/evil.pth", False),
    ("evil-1.0.dist-info/entry_points.txt", False), ("pytest.py", False), ("_pytest/__init__.py", False),
    ("json.py", False), ("json/__init__.py", False), ("inspect.cpython-311-x86_64-linux-gnu.so", False),
    ("rockroll_pytest_report.py", False)])
def test_graded_paths(path, graded):
    assert is_graded_path(path) is graded


def test_filter_patch_drops_tests_config_byproducts_hooks_and_test_patch_files():
    diff = "".join(_diff(p) for p in ("pkg/core.py", "tests/test_core.py", "pkg/__pycache__/core.cpython-311.pyc",
                                      "setup.cfg", "pkg/extra.py", "pkg/new_case.py", "sitecustomize.py"))
    kept, dropped = filter_patch(diff, ignore={"pkg/new_case.py"})
    assert kept == _diff("pkg/core.py") + _diff("pkg/extra.py")
    assert dropped == ["tests/test_core.py", "pkg/__pycache__/core.cpython-311.pyc", "setup.cfg", "pkg/new_case.py",
                       "sitecustomize.py"]
    assert filter_patch("") == ("", [])


def test_filter_patch_reads_every_path_a_chunk_header_names():
    renamed = "diff --git a/pkg/a.py b/pkg/a.py\nrename from tests/test_a.py\nrename to pkg/a.py\n"
    lying = "diff --git a/pkg/b.py b/pkg/b.py\n--- a/conftest.py\n+++ b/conftest.py\n@@ -1 +1 @@\n-a\n+b\n"
    garbled = 'diff --git a/pkg/c.py "b/pkg/c\\q.py"\n--- a/pkg/c.py\n'  # an escape git never writes
    prefixless = "diff --git pkg/d.py pkg/d.py\n--- pkg/d.py\n+++ pkg/d.py\n@@ -1 +1 @@\n-a\n+b\n"
    # Hunk lines are not header lines: a removed line reading "-- a/tests/x" is code.
    hunk = "diff --git a/pkg/e.py b/pkg/e.py\n--- a/pkg/e.py\n+++ b/pkg/e.py\n@@ -1 +1 @@\n--- a/tests/x\n+b\n"
    kept, dropped = filter_patch(renamed + lying + garbled + prefixless + hunk)
    assert kept == hunk
    assert dropped == ["pkg/a.py", "pkg/b.py", 'diff --git a/pkg/c.py "b/pkg/c\\q.py"', "diff --git pkg/d.py pkg/d.py"]
    assert patch_paths(renamed + lying) == {"pkg/a.py", "tests/test_a.py", "pkg/b.py", "conftest.py"}


def _git(repo, *args, **kwargs) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                          capture_output=True, text=True, **kwargs).stdout


def test_filter_patch_handles_the_paths_git_quotes(tmp_path):
    # Real git output: names with spaces are written bare, names with unusual bytes quoted.
    names = ["pkg/x y.py", "pkg/caf\u00e9.py", 'pkg/q"uote.py', "tests/t \u00e9.py", "tests/test_core.py"]
    repo = tmp_path / "repo"
    for name in names:
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text("a\n")
    _git(tmp_path, "init", "-q", "repo")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    _git(repo, "clone", "-q", str(repo), str(tmp_path / "clean"))
    for name in names:
        (repo / name).write_text("b\n")
    _git(repo, "add", "-A")
    diff = _git(repo, "diff", "--cached", "--binary", "--no-renames", "HEAD")
    assert '"b/pkg/caf\\303\\251.py"' in diff and "b/pkg/x y.py\n" in diff  # both forms are there
    kept, dropped = filter_patch(diff)
    assert sorted(dropped) == ["tests/t \u00e9.py", "tests/test_core.py"]
    assert patch_paths(kept) == set(names[:3])
    _git(tmp_path / "clean", "apply", "-", input=kept)  # what is kept still applies
    assert [(tmp_path / "clean" / n).read_text() for n in names] == ["b\n"] * 3 + ["a\n"] * 2


def test_numstat_shows_what_a_crafted_diff_hides_from_its_headers(tmp_path):
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "pkg" / "x.py").write_text("a\n")
    (repo / "tests" / "test_x.py").write_text("a\n")
    _git(tmp_path, "init", "-q", "repo")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    # After the hunks of a graded file, git apply also takes a plain ---/+++ patch.
    crafted = _diff("pkg/x.py") + "--- a/tests/test_x.py\n+++ b/tests/test_x.py\n@@ -1 +1 @@\n-a\n+b\n"
    kept, dropped = filter_patch(crafted)
    assert kept == crafted and dropped == []  # the headers alone do not tell
    (tmp_path / "p.diff").write_text(kept)
    assert numstat_paths(_git(repo, "apply", "--numstat", "-z", str(tmp_path / "p.diff"))) == [
        "pkg/x.py", "tests/test_x.py"]
    # A rename shows the file it writes.
    _git(repo, "mv", "tests/test_x.py", "pkg/y.py")
    (tmp_path / "r.diff").write_text(_git(repo, "diff", "--cached", "-M", "HEAD"))
    _git(repo, "reset", "-q", "--hard")
    assert numstat_paths(_git(repo, "apply", "--numstat", "-z", str(tmp_path / "r.diff"))) == ["pkg/y.py"]


def _signed(records: list[dict], key: str) -> str:
    return "".join(json.dumps(r) + " " + hmac.new(key.encode(), json.dumps(r).encode(), hashlib.sha256).hexdigest()
                   + "\n" for r in records)


def test_read_report_takes_the_worst_phase_of_signed_lines():
    lines = [
        {"id": "t.py::a", "when": "call", "outcome": "passed"},
        {"id": "t.py::b", "when": "call", "outcome": "failed", "msg": "E assert 1 == 2"},
        {"id": "t.py::c", "when": "call", "outcome": "passed"},
        {"id": "t.py::c", "when": "teardown", "outcome": "failed", "msg": "teardown broke"},
        {"id": "t.py::d", "when": "setup", "outcome": "skipped"},
        {"id": "t.py", "when": "collect", "outcome": "failed", "msg": "ImportError"},
    ]
    forged = [{"id": "t.py::e", "when": "call", "outcome": "passed"}]
    text = _signed(lines, "k1") + "not json\n" + _signed(forged, "other") + json.dumps(forged[0]) + "\n"
    outcomes, messages = read_report(text, "k1")
    assert outcomes == {"t.py::a": "passed", "t.py::b": "failed", "t.py::c": "failed", "t.py::d": "skipped",
                        "t.py": "failed"}
    assert messages["t.py::b"] == "E assert 1 == 2" and messages["t.py::c"] == "teardown broke"
    assert read_report(text, "other") == ({"t.py::e": "passed"}, {})


TESTS_THAT_PROBE = """
import glob, json, os

def test_nothing_of_the_reporter_is_visible():
    assert "ROCKROLL_REPORT" not in os.environ and conftest.SEEN == []

def test_fails():
    assert 1 == 2

def test_forges():
    # What code under test can find: the report's path (the process's initial environment).
    env = open("/proc/self/environ", "rb").read().split(b"\\0")
    path = [v.split(b"=", 1)[1] for v in env if v.startswith(b"ROCKROLL_REPORT=")][0].decode()
    with open(path) as f:
        line = f.readline()
    body, _, mac = line.rstrip("\\n").rpartition(" ")
    with open(path, "a") as f:
        f.write(json.dumps({"id": "test_probe.py::test_fails", "when": "call", "outcome": "passed"}) + "\\n")
        f.write(body.replace("test_nothing_of_the_reporter_is_visible", "test_ghost") + " " + mac + "\\n")

import conftest
"""


def test_report_plugin_hides_its_key_before_conftests_and_signs_what_it_writes(tmp_path):
    env_dir, repo = tmp_path / "env", tmp_path / "repo"
    env_dir.mkdir()
    repo.mkdir()
    (env_dir / f"{PLUGIN}.py").write_text(REPORT_PLUGIN)
    report = env_dir / "report.jsonl"
    (env_dir / "report.jsonl.key").write_text("k" * 32)
    # A conftest is the first code of the repository pytest imports.
    (repo / "conftest.py").write_text(f"import glob, os\nSEEN = glob.glob({str(env_dir)!r} + '/*.key') + "
                                      "[os.environ.get('ROCKROLL_REPORT')] * ('ROCKROLL_REPORT' in os.environ)\n")
    (repo / "test_probe.py").write_text(TESTS_THAT_PROBE)
    cmd = PYTEST.replace("python3", shlex.quote(sys.executable), 1) + " test_probe.py"
    env = {**os.environ, "PYTHONPATH": str(env_dir), "ROCKROLL_REPORT": str(report),
           "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}  # this venv's plugins only slow the run down
    subprocess.run(["bash", "-c", cmd], cwd=repo, capture_output=True, text=True, env=env)
    outcomes, _ = read_report(report.read_text(), "k" * 32)
    assert outcomes == {"test_probe.py::test_nothing_of_the_reporter_is_visible": "passed",
                        "test_probe.py::test_fails": "failed", "test_probe.py::test_forges": "passed"}
    assert not (env_dir / "report.jsonl.key").exists()


def test_swebench_records_load_with_their_json_string_lists():
    record = {"instance_id": "astropy__astropy-12907", "repo": "astropy/astropy", "base_commit": "d16bfe05",
              "patch": "diff --git a/x b/x\n", "test_patch": _diff("astropy/tests/test_new.py"),
              "FAIL_TO_PASS": '["astropy/tests/test_new.py::test_a"]',
              "PASS_TO_PASS": '["astropy/tests/test_old.py::test_b", "astropy/tests/test_new.py::test_c"]',
              "problem_statement": "It breaks.", "version": "4.3", "environment_setup_commit": "x"}
    task = task_from_record(record)
    assert task.id == "astropy__astropy-12907" and task.fail_to_pass == ("astropy/tests/test_new.py::test_a",)
    assert task.image == "swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest"
    assert (task.backend, task.workdir, task.snapshot) == ("docker", "/testbed", None)
    assert task.test_files == ["astropy/tests/test_new.py", "astropy/tests/test_old.py"]
    cmd = grading_command(task, "/tmp/r.jsonl")
    assert "activate testbed" in cmd and cmd.endswith("astropy/tests/test_new.py astropy/tests/test_old.py")
    ours = task_from_record({**record, "image": "hub:swe-x@1.0.0", "snapshot": "hub:swe-x@1.0.0#t"})
    assert (ours.backend, ours.workdir) == ("local", "/workspace")
    with pytest.raises(ValueError, match="missing field.*FAIL_TO_PASS"):
        task_from_record({k: v for k, v in record.items() if k != "FAIL_TO_PASS"})
    with pytest.raises(ValueError, match="PASS_TO_PASS must be a list"):
        task_from_record({**record, "PASS_TO_PASS": 3})


# ---- builder pieces ------------------------------------------------------------------------
def test_detect_layout(tmp_path):
    (tmp_path / "src" / "pkg" / "tests").mkdir(parents=True)
    for rel in ("src/pkg/__init__.py", "src/pkg/core.py", "src/pkg/_version.py", "src/pkg/tests/__init__.py",
                "src/pkg/tests/test_core.py", "setup.py", "docs/conf.py", "test_top.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x = 1\n")
    layout = detect_layout(tmp_path)
    assert layout.pythonpath == "src"
    assert layout.sources == ("src/pkg/__init__.py", "src/pkg/core.py")
    assert layout.tests == ("src/pkg/tests", "test_top.py")
    assert "compileall" in layout.setup_commands()[1] and "/workspace/src" in layout.setup_commands()[0]
    (tmp_path / "test_top.py").unlink()
    (tmp_path / "src/pkg/tests/test_core.py").unlink()
    with pytest.raises(BuildSWEError, match="no tests"):
        detect_layout(tmp_path)


def test_requirements_and_versions():
    assert parse_requirement("toolz == 0.12.1") == ("toolz", "0.12.1")
    for bad in ("toolz", "toolz>=1", "toolz==", "../x==1"):
        with pytest.raises(BuildSWEError, match="NAME==VERSION"):
            parse_requirement(bad)
    assert env_version("2.0") == "2.0.0" and env_version("10.2.1") == "10.2.1"
    with pytest.raises(BuildSWEError, match="pre/post/dev"):
        env_version("1.0.post1")


def test_problem_statement_quotes_assertions_not_locations():
    m = find_mutations("mod.py", SOURCE)[0]
    msg = "def test_a():\n>       assert clamp(5, 0, 3) == 3\nE       assert 5 == 3\n\ntests/test_m.py:7: AssertionError"
    kept = _Kept(m, ["tests/test_m.py::test_a", "tests/test_m.py::test_b"], ["tests/test_m.py::test_c"],
                 {"tests/test_m.py::test_a": msg})
    text = problem_statement("pkg", "1.0", kept)
    assert "2 test(s) of pkg 1.0 fail" in text and "E       assert 5 == 3" in text
    assert "tests/test_m.py:7" not in text and "mod.py" not in text
