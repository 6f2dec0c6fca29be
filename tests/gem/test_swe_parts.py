"""The pure pieces of rock/SWE-v0: bug mutations, diffs, patch filtering, pytest reports,
SWE-bench records, repository layouts. No sandbox needed."""

from __future__ import annotations

import ast
import json
import subprocess

import pytest

from rockroll.gem.swe import filter_patch, is_test_path, read_report, task_from_record, grading_command
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
    ("pyproject.toml", False), ("pkg/testing_utils.py", True), ("contest.py", True)])
def test_test_paths(path, graded):
    assert is_test_path(path) is not graded


def test_filter_patch_drops_tests_config_byproducts_and_test_patch_files():
    diff = "".join(_diff(p) for p in ("pkg/core.py", "tests/test_core.py", "pkg/__pycache__/core.cpython-311.pyc",
                                      "setup.cfg", "pkg/extra.py", "pkg/new_case.py"))
    kept, dropped = filter_patch(diff, ignore={"pkg/new_case.py"})
    assert kept == _diff("pkg/core.py") + _diff("pkg/extra.py")
    assert dropped == ["tests/test_core.py", "pkg/__pycache__/core.cpython-311.pyc", "setup.cfg", "pkg/new_case.py"]
    assert filter_patch("") == ("", [])


def test_read_report_takes_the_worst_phase():
    lines = [
        {"id": "t.py::a", "when": "call", "outcome": "passed"},
        {"id": "t.py::b", "when": "call", "outcome": "failed", "msg": "E assert 1 == 2"},
        {"id": "t.py::c", "when": "call", "outcome": "passed"},
        {"id": "t.py::c", "when": "teardown", "outcome": "failed", "msg": "teardown broke"},
        {"id": "t.py::d", "when": "setup", "outcome": "skipped"},
        {"id": "t.py", "when": "collect", "outcome": "failed", "msg": "ImportError"},
    ]
    text = "\n".join(json.dumps(l) for l in lines) + "\nnot json\n"
    outcomes, messages = read_report(text)
    assert outcomes == {"t.py::a": "passed", "t.py::b": "failed", "t.py::c": "failed", "t.py::d": "skipped",
                        "t.py": "failed"}
    assert messages["t.py::b"] == "E assert 1 == 2" and messages["t.py::c"] == "teardown broke"


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
