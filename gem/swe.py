"""``rock/SWE-v0``: repair a real Python repository in a sandbox; hidden tests grade it.

A task is a SWE-bench record: a repository at a buggy commit, a problem statement, and
the tests that must go from failing to passing (``FAIL_TO_PASS``) and those that must keep
passing (``PASS_TO_PASS``). The agent works with bash in the repository (its working
directory), then submits. Reward 1.0 iff every FAIL_TO_PASS and every PASS_TO_PASS test
passes; ``info`` carries both pass fractions.

Grading, SWE-bench style, so the reward cannot be gamed from inside the sandbox:

1. the agent's change is taken as a diff (``git add -A; git diff --cached HEAD`` in its
   repository), minus the test files, pytest configuration and build byproducts: edits to
   tests do not count;
2. a *fresh* sandbox from the task's pool (at the buggy state) gets the diff applied (then the task's ``test_patch``, if any), and the test files that hold the
   graded tests run under pytest with a small reporting plugin (one JSON line per test
   phase, to a file the agent never had access to);
3. outcomes are read per test id; a test that did not report (crash, timeout) failed.

Where tasks come from:

- ``tasks=`` (``SWETask`` objects) or ``tasks_file=`` (JSONL of SWE-bench records: ``instance_id,
  repo, base_commit, patch, test_patch, FAIL_TO_PASS, PASS_TO_PASS, problem_statement,
  image``; the list fields may be JSON-encoded strings as in the SWE-bench datasets). Such
  records run in their Docker ``image`` (``swebench/sweb.eval.x86_64.<id>`` if absent) on the
  Docker backend, in ``/testbed``, with the image's ``testbed`` conda env if it has one;
- ``private_dir=``: a hub env built by ``rockroll envs build-swe`` (its host-only files hold
  the tasks; its named snapshots hold each task's buggy state);
- neither: every SWE env on the hub (``hub=``, default: the default hub), which is what
  ``gymnasium.make("rock/SWE-v0")`` gives after ``make demo``.
"""

from __future__ import annotations

import functools
import json
import os
import re
import secrets
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from rockroll.sandbox import AsyncSandbox, SandboxSpec

from .actions import TOOL_FORMATS, Action
from .core import truncate_observation
from .tools import ENV_DIR, Evaluation, SandboxToolEnv, _release_quietly, select_tasks

__all__ = ["ENTRY_POINT", "REPORT_PLUGIN", "SWEEnv", "SWETask", "hub_swe_tasks", "load_swe_tasks",
           "grading_command", "read_report", "task_from_record", "is_test_path", "filter_patch"]

ENTRY_POINT = "rockroll.gem.swe:SWEEnv"  # what marks a hub env as a set of SWE tasks
TASKS_FILE = "tasks.jsonl"  # in a SWE hub env's private folder

#: The pytest plugin the grader loads (``-p rockroll_pytest_report``): one JSON line per
#: test phase to ``$ROCKROLL_REPORT``. Written for pytest 7 and 8.
REPORT_PLUGIN = '''
import json, os
_out = None
def pytest_configure(config):
    global _out
    path = os.environ.get("ROCKROLL_REPORT")
    if path and _out is None:
        _out = open(path, "w")
def pytest_runtest_logreport(report):
    if _out is None or (report.when != "call" and report.outcome == "passed"):
        return
    msg = report.longreprtext[-2000:] if report.failed else ""
    _out.write(json.dumps({"id": report.nodeid, "when": report.when, "outcome": report.outcome,
                           "msg": msg}) + "\\n")
    _out.flush()
def pytest_collectreport(report):
    if _out is not None and report.failed:
        _out.write(json.dumps({"id": report.nodeid, "when": "collect", "outcome": "failed",
                               "msg": str(report.longrepr)[-2000:]}) + "\\n")
        _out.flush()
'''

# Activates SWE-bench images' conda env when there is one; a no-op elsewhere.
_CONDA = "if [ -f /opt/miniconda3/bin/activate ]; then . /opt/miniconda3/bin/activate testbed; fi"
PYTEST = "python3 -m pytest -p no:cacheprovider -o addopts= -q -p rockroll_pytest_report"
_TEST_FILE = re.compile(r"(^|/)(tests?|testing)/|(^|/)test_[^/]*\.py$|_tests?\.py$|(^|/)conftest\.py$")
_CONFIG_FILES = {"pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml", "noxfile.py"}
_BYPRODUCT = re.compile(r"(^|/)(__pycache__|\.pytest_cache|[^/]*\.egg-info)(/|$)|\.py[co]$")


def is_test_path(path: str) -> bool:
    """Test files and what configures pytest: the agent's edits to them are not graded."""
    return bool(_TEST_FILE.search(path)) or path in _CONFIG_FILES


# ---- tasks ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class SWETask:
    """One repair task, in SWE-bench's terms (``id`` is the ``instance_id``)."""

    id: str
    repo: str
    problem_statement: str
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    image: str                        # sandbox image: "hub:<env>@<ver>", a Docker image, ...
    backend: str = "local"
    workdir: str = "/testbed"
    snapshot: str | None = None       # the buggy state, when the image holds the fixed one
    base_commit: str = ""
    patch: str = ""                   # the reference fix (hidden: for oracles and checks)
    test_patch: str = ""              # applied before grading (SWE-bench's new tests)
    version: str = ""
    test_cmd: str = ""                # "" : pytest on the files of the graded tests
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def test_files(self) -> list[str]:
        """The files holding the graded tests (what the grader runs)."""
        return sorted({t.split("::", 1)[0] for t in (*self.fail_to_pass, *self.pass_to_pass)})


def _id_list(value: Any, key: str, where: str) -> tuple[str, ...]:
    if isinstance(value, str):  # the SWE-bench datasets store these lists as JSON text
        try:
            value = json.loads(value)
        except ValueError:
            raise ValueError(f"{where}: {key} is neither a list nor a JSON list") from None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{where}: {key} must be a list of test ids")
    return tuple(value)


def _swebench_image(instance_id: str) -> str:
    # SWE-bench's naming of its per-instance evaluation images.
    return f"swebench/sweb.eval.x86_64.{instance_id.replace('__', '_1776_')}:latest".lower()


def task_from_record(record: dict[str, Any], where: str = "task") -> SWETask:
    """A SWE-bench record (or one of ours, which adds ``snapshot``, ``workdir``, ...) as a task."""
    missing = [k for k in ("instance_id", "problem_statement", "FAIL_TO_PASS", "PASS_TO_PASS") if k not in record]
    if missing:
        raise ValueError(f"{where}: missing field(s) {', '.join(missing)}")
    image = record.get("image") or _swebench_image(record["instance_id"])
    hub = image.startswith("hub:")
    return SWETask(
        id=str(record["instance_id"]), repo=str(record.get("repo", "")),
        problem_statement=str(record["problem_statement"]),
        fail_to_pass=_id_list(record["FAIL_TO_PASS"], "FAIL_TO_PASS", where),
        pass_to_pass=_id_list(record["PASS_TO_PASS"], "PASS_TO_PASS", where),
        image=image, backend=record.get("backend") or ("local" if hub else "docker"),
        workdir=record.get("workdir") or ("/workspace" if hub else "/testbed"),
        snapshot=record.get("snapshot"), base_commit=str(record.get("base_commit", "")),
        patch=str(record.get("patch", "")), test_patch=str(record.get("test_patch", "")),
        version=str(record.get("version", "")), test_cmd=str(record.get("test_cmd", "")),
        extra={k: v for k, v in record.items() if k in ("mutation", "created_by")})


def load_swe_tasks(path: str | os.PathLike) -> tuple[SWETask, ...]:
    """Tasks from a JSONL file of SWE-bench records (parsed once per file version: a vector
    env of n SWE envs reads a hub's task files once, not n times)."""
    st = os.stat(path)
    return _load_swe_tasks(os.fspath(path), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=64)
def _load_swe_tasks(path: str, mtime_ns: int, size: int) -> tuple[SWETask, ...]:
    tasks = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                try:
                    record = json.loads(line)
                except ValueError as e:
                    raise ValueError(f"{path}:{lineno}: not JSON ({e})") from None
                tasks.append(task_from_record(record, f"{path}:{lineno}"))
    return tuple(tasks)


def hub_swe_tasks(hub: str | None = None) -> list[SWETask]:
    """The tasks of every SWE env on ``hub`` (latest release of each major), pulling them."""
    from rockroll.envhub.pull import pull, resolve
    from rockroll.envhub.cache import LocalCache
    from rockroll.envhub.store import HubStore, default_hub_url, normalize_url
    from rockroll.envhub.version import latest_per_major

    store = HubStore(normalize_url(hub or default_hub_url()))
    cache = LocalCache()
    tasks: list[SWETask] = []
    for name, versions in sorted(store.listing().items()):
        for version in latest_per_major(versions).values():
            manifest, _ = resolve(f"{name}@{version}", store, cache)
            if manifest.entry_point != ENTRY_POINT or manifest.private is None:
                continue
            env = pull(f"{name}@{version}", hub=store, cache=cache)
            tasks += load_swe_tasks(env.private_dir / TASKS_FILE)
    return tasks


# ---- grading pieces (pure) -------------------------------------------------------------------
_DIFF_HEADER = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.M)


def filter_patch(diff: str, ignore: Iterable[str] = ()) -> tuple[str, list[str]]:
    """``diff`` without the files that are not graded: tests, pytest config, build
    byproducts, and the paths in ``ignore`` (a task's ``test_patch`` files).
    Returns (the kept diff, the dropped paths)."""
    ignore = set(ignore)
    starts = [m.start() for m in _DIFF_HEADER.finditer(diff)]
    kept, dropped = [], []
    for start, end in zip(starts, [*starts[1:], len(diff)]):
        chunk = diff[start:end]
        m = _DIFF_HEADER.match(chunk)
        paths = {m.group(1), m.group(2)}
        if any(is_test_path(p) or _BYPRODUCT.search(p) or p in ignore for p in paths):
            dropped.append(m.group(2))
        else:
            kept.append(chunk)
    return "".join(kept), dropped


def read_report(text: str) -> tuple[dict[str, str], dict[str, str]]:
    """The plugin's JSON lines -> ({test id: passed|failed|skipped}, {test id: failure text})."""
    outcome: dict[str, str] = {}
    messages: dict[str, str] = {}
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        tid, res = rec.get("id"), rec.get("outcome")
        if not isinstance(tid, str):
            continue
        if res == "failed":
            outcome[tid] = "failed"
            messages.setdefault(tid, rec.get("msg", ""))
        elif outcome.get(tid) != "failed":
            outcome[tid] = "passed" if res == "passed" and rec.get("when") == "call" else outcome.get(tid, res)
    return outcome, messages


def grading_command(task: SWETask, report: str) -> str:
    """The shell command that runs the graded tests of ``task`` with the reporting plugin."""
    env = f"PYTHONPATH={ENV_DIR}${{PYTHONPATH:+:$PYTHONPATH}} ROCKROLL_REPORT={report}"
    files = " ".join(shlex.quote(f) for f in task.test_files)
    if task.test_cmd:
        return f"{_CONDA}; {env} {task.test_cmd.replace('{tests}', files)}"
    return f"{_CONDA}; {env} {PYTEST} {files}"


def _first_observation(task: SWETask) -> str:
    formats = "\n".join(f"- {form}" for form in TOOL_FORMATS)
    return (
        f"You are working in the repository of {task.repo or 'a Python project'} at {task.workdir} "
        "(a Linux sandbox: bash, python3, pytest, git; no network).\n\n"
        f"Issue:\n{task.problem_statement}\n\n"
        "Fix the code so that the issue is resolved. Do not change the tests: they are replaced by the "
        "originals when your work is graded.\n"
        f"Act with exactly one action per reply, in one of these formats:\n{formats}\n"
        "Each command's exit code, stdout and stderr come back to you. When you are done, submit: "
        "your changes (git diff against HEAD) are then tested with hidden tests and the episode ends."
    )


# ---- the env ---------------------------------------------------------------------------------
class SWEEnv(SandboxToolEnv):
    """Repository repair graded by hidden tests; see the module docstring."""

    def __init__(
        self,
        *,
        tasks: Sequence[SWETask] | None = None,
        tasks_file: str | os.PathLike | None = None,
        private_dir: str | os.PathLike | None = None,
        image: str | None = None,
        hub: str | None = None,
        task_ids: Sequence[str] | None = None,
        test_timeout: float = 300.0,
        max_turns: int = 40,
        step_timeout: float = 120.0,
        **kwargs: Any,
    ):
        if tasks is None:
            if tasks_file is not None:
                tasks = load_swe_tasks(tasks_file)
            elif private_dir is not None:
                tasks = load_swe_tasks(Path(private_dir) / TASKS_FILE)
            else:
                tasks = hub_swe_tasks(hub)
                if not tasks:
                    from rockroll.envhub.store import default_hub_url

                    raise ValueError(f"no SWE tasks on the hub {hub or default_hub_url()}: build them with "
                                     "`rockroll envs build-swe` (make demo builds the default set)")
        tasks = select_tasks(tasks, task_ids)
        if task_ids is not None and not tasks:
            raise ValueError(f"none of task_ids {list(task_ids)[:5]} is a known task")
        super().__init__(tasks, max_turns=max_turns, step_timeout=step_timeout, **kwargs)
        self.test_timeout = float(test_timeout)
        self._specs: dict[tuple[str, str, str], SandboxSpec] = {}

    def _spec_for(self, task: SWETask) -> SandboxSpec:
        key = (task.image, task.backend, task.workdir)
        if key not in self._specs:
            base = self.sandbox_spec.to_dict()
            base.update(image=task.image, backend=task.backend, workdir=task.workdir)
            self._specs[key] = SandboxSpec(**base)
        return self._specs[key]

    def _pool_for(self, task: SWETask) -> tuple[SandboxSpec, int, str | None]:
        # One pool per task, its sandboxes already at the buggy state: a reset is an acquire.
        # Warm sandboxes are shared out over the tasks (a vector env of n asks for n).
        per_task = min(self.pool_size, -(-self.pool_size // len(self.tasks)) + 1)
        return self._spec_for(task), per_task, task.snapshot

    async def _setup(self, sandbox: AsyncSandbox, task: SWETask) -> str:
        return _first_observation(task)

    async def _evaluate(self, sandbox: AsyncSandbox, task: SWETask, action: Action, text: str) -> Evaluation:
        diff_result = await self._env_run(sandbox, "diff.sh", "git add -A >/dev/null 2>&1; git diff --cached --binary HEAD",
                                          timeout=60)
        if diff_result.exit_code != 0:
            msg = "Submitted, but the repository's changes could not be read (is it still a git repository?)."
            return Evaluation(0.0, msg, {"f2p_pass_fraction": 0.0, "p2p_pass_fraction": 0.0, "resolved": False})
        test_patch_files = {m.group(2) for m in _DIFF_HEADER.finditer(task.test_patch)}
        patch, dropped = filter_patch(diff_result.stdout, test_patch_files)
        grader = await self._lease.pool.acquire()
        try:
            return await self._grade(grader, task, patch, dropped)
        finally:
            await _release_quietly(self._lease.pool, grader)

    async def _grade(self, sb: AsyncSandbox, task: SWETask, patch: str, dropped: list[str]) -> Evaluation:
        report = f"{ENV_DIR}/report-{secrets.token_hex(6)}.jsonl"
        await sb.write_file(f"{ENV_DIR}/rockroll_pytest_report.py", REPORT_PLUGIN)
        info: dict[str, Any] = {"ignored_files": dropped, "patch_chars": len(patch)}
        for name, body in (("model.diff", patch), ("test.diff", task.test_patch)):
            if not body.strip():
                continue
            await sb.write_file(f"{ENV_DIR}/{name}", body)
            applied = await self._env_run(sb, f"apply-{name}.sh", f"git apply --whitespace=nowarn {ENV_DIR}/{name}",
                                          timeout=60)
            if applied.exit_code != 0:
                why = truncate_observation(applied.stderr.strip(), 1500)
                what = "Your changes" if name == "model.diff" else "The task's test patch"
                return Evaluation(0.0, f"Submitted. {what} did not apply to a clean checkout:\n{why}",
                                  {**info, "f2p_pass_fraction": 0.0, "p2p_pass_fraction": 0.0, "resolved": False})
        result = await self._env_run(sb, "test.sh", grading_command(task, report), timeout=self.test_timeout)
        outcomes, messages = read_report((await sb.read_file(report)).decode(errors="replace")
                                         if await sb.exists(report) else "")
        f2p = [t for t in task.fail_to_pass if outcomes.get(t) == "passed"]
        p2p = [t for t in task.pass_to_pass if outcomes.get(t) == "passed"]
        f2p_frac = len(f2p) / len(task.fail_to_pass) if task.fail_to_pass else 1.0
        p2p_frac = len(p2p) / len(task.pass_to_pass) if task.pass_to_pass else 1.0
        resolved = len(f2p) == len(task.fail_to_pass) and len(p2p) == len(task.pass_to_pass)
        lines = [f"Submitted. Tests that had to be fixed: {len(f2p)}/{len(task.fail_to_pass)} pass. "
                 f"Tests that had to keep passing: {len(p2p)}/{len(task.pass_to_pass)} pass."]
        if result.timed_out:
            lines.append(f"The tests were stopped after {self.test_timeout:.0f}s.")
        if dropped:
            lines.append("Not graded (tests, test config or byproducts): " + ", ".join(dropped[:10]))
        still = [t for t in (*task.fail_to_pass, *task.pass_to_pass) if outcomes.get(t) != "passed"][:3]
        for t in still:
            lines.append(f"{t}: {outcomes.get(t, 'did not run')}\n" + truncate_observation(messages.get(t, ""), 600))
        info.update(f2p_pass_fraction=f2p_frac, p2p_pass_fraction=p2p_frac, resolved=resolved,
                    pass_fraction=(len(f2p) + len(p2p)) / max(1, len(task.fail_to_pass) + len(task.pass_to_pass)))
        return Evaluation(1.0 if resolved else 0.0, truncate_observation("\n".join(lines), 6000), info)
