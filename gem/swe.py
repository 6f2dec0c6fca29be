"""``rock/SWE-v0``: repair a real Python repository in a sandbox; hidden tests grade it.

A task is a SWE-bench record: a repository at a buggy commit, a problem statement, and
the tests that must go from failing to passing (``FAIL_TO_PASS``) and those that must keep
passing (``PASS_TO_PASS``). The agent works with bash in the repository (its working
directory), then submits. Reward 1.0 iff every FAIL_TO_PASS and every PASS_TO_PASS test
passes; ``info`` carries both pass fractions.

Grading, SWE-bench style:

1. the agent's change is taken as a diff against the task's commit (``base_commit``; committed
   and uncommitted work both count), minus what is not graded: test files, pytest
   configuration, build byproducts, and files that would run before the reporting plugin
   (``sitecustomize``/``usercustomize``, ``.pth``, package metadata, top-level modules named
   like a module of the standard library or of pytest);
2. a *fresh* sandbox from the task's pool (at the buggy state) gets the diff applied (then the
   task's ``test_patch``, if any); if git reads the diff as touching anything not graded (a
   diff crafted to fool the filter), it is refused. The test files that hold the graded tests
   run under pytest with a small reporting plugin, loaded before any conftest or test module:
   it takes its report path and a one-use key and removes both, and signs each line it
   writes (one per test phase) with that key, so lines written by anything else are ignored;
3. outcomes are read per test id; a test that did not report (crash, timeout) failed, and a
   run cut off by ``test_timeout`` is flagged in ``info["tests_timed_out"]``.

What this does not stop: the code under test runs in the same Python process as pytest, so
code that deliberately patches pytest's reporting (or reads the plugin's key from memory)
can still forge passes. SWE-bench, which parses pytest's log, has the same limit.

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

``agent=NAME`` runs hub tasks in their env's variant with that agent installed
(``rockroll envs build-swe --agent NAME``, pulled from ``hub``): every hub task whose env
has one, or, for tasks named (``task_ids``, ``tasks``, ...), all of them, a missing variant
being a ``ValueError`` that names the command building it. ``rock/Agent-v0`` passes its
agent this way when the agent must be installed.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import os
import re
import secrets
import shlex
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Sequence

from rockroll.sandbox import AsyncSandbox, SandboxSpec

from .actions import TOOL_FORMATS, Action
from .core import truncate_observation
from .tools import ENV_DIR, Evaluation, SandboxToolEnv, release_quietly, select_tasks

__all__ = ["ENTRY_POINT", "PLUGIN", "REPORT_PLUGIN", "SWEEnv", "SWETask", "hub_swe_tasks", "load_swe_tasks",
           "grading_command", "pytest_command", "arm_report", "fetch_report", "read_report", "task_from_record",
           "is_test_path", "is_graded_path", "filter_patch", "patch_paths", "numstat_paths", "agent_tasks",
           "pull_agent_tasks"]

ENTRY_POINT = "rockroll.gem.swe:SWEEnv"  # what marks a hub env as a set of SWE tasks
TASKS_FILE = "tasks.jsonl"  # in a SWE hub env's private folder

#: The module name of the reporting plugin (``-p rockroll_pytest_report``), in ``ENV_DIR``.
PLUGIN = "rockroll_pytest_report"
#: The pytest plugin the grader (and the builder) loads: one JSON line per test phase to
#: ``$ROCKROLL_REPORT``, each signed with the key in ``$ROCKROLL_REPORT.key``. ``-p`` loads it
#: before any conftest or test module is imported; it then removes the variable and the key
#: file, so the code under test finds neither (``/proc/self/environ`` still shows the path,
#: which is why the key is a file). Written for pytest 7 and 8.
REPORT_PLUGIN = '''
import hashlib, hmac, json, os
_out = _key = None
_path = os.environ.pop("ROCKROLL_REPORT", "")
if _path:
    with open(_path + ".key", "rb") as _f:
        _key = _f.read().strip()
    os.unlink(_path + ".key")
    _out = open(_path, "w")
def _write(rec):
    line = json.dumps(rec)
    _out.write(line + " " + hmac.new(_key, line.encode(), hashlib.sha256).hexdigest() + "\\n")
    _out.flush()
def pytest_runtest_logreport(report):
    if _out is None or (report.when != "call" and report.outcome == "passed"):
        return
    msg = report.longreprtext[-2000:] if report.failed else ""
    _write({"id": report.nodeid, "when": report.when, "outcome": report.outcome, "msg": msg})
def pytest_collectreport(report):
    if _out is not None and report.failed:
        _write({"id": report.nodeid, "when": "collect", "outcome": "failed", "msg": str(report.longrepr)[-2000:]})
'''

# Activates SWE-bench images' conda env when there is one; a no-op elsewhere.
_CONDA = "if [ -f /opt/miniconda3/bin/activate ]; then . /opt/miniconda3/bin/activate testbed; fi"
# --rootdir=.: test ids relative to the repository, whatever ini files the test paths find.
PYTEST = f"python3 -m pytest -p no:cacheprovider -o addopts= -q --rootdir=. -p {PLUGIN}"
_TEST_FILE = re.compile(r"(^|/)(tests?|testing)/|(^|/)test_[^/]*\.py$|_tests?\.py$|(^|/)conftest\.py$")
_CONFIG_FILES = {"pytest.ini", ".pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml", "noxfile.py"}
_BYPRODUCT = re.compile(r"(^|/)(__pycache__|\.pytest_cache|[^/]*\.egg-info)(/|$)|\.py[co]$")
# What Python or pytest runs at startup, before the plugin has hidden its key: startup hooks,
# .pth files, package metadata (pytest autoloads pytest11 entry points from it), and top-level
# modules that shadow one pytest imports (`python -m` puts the repository first on sys.path).
_STARTUP_HOOK = re.compile(r"(^|/)(sitecustomize|usercustomize)\.py$|\.pth$|(^|/)[^/]*\.dist-info(/|$)")
_TOP_MODULE = re.compile(r"([A-Za-z_]\w*)(\.py|/__init__\.py|(\.[^/]*)?\.so)")
_SHADOWED = frozenset(sys.stdlib_module_names) | {
    "pytest", "_pytest", "py", "pluggy", "iniconfig", "packaging", "attr", "attrs", "exceptiongroup", "tomli",
    "pygments", "colorama", PLUGIN}


def is_test_path(path: str) -> bool:
    """Test files and what configures pytest: the agent's edits to them are not graded."""
    return bool(_TEST_FILE.search(path)) or path.rsplit("/", 1)[-1] in _CONFIG_FILES


def is_graded_path(path: str) -> bool:
    """Whether the agent's change to ``path`` is graded: not a test or pytest config file, not
    a build byproduct, nothing that runs before the reporting plugin holds its key."""
    top = _TOP_MODULE.fullmatch(path)
    return not (is_test_path(path) or _BYPRODUCT.search(path) or _STARTUP_HOOK.search(path)
                or (top is not None and top.group(1) in _SHADOWED))


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


def _repeats_swe_env(manifest, store, cache) -> bool:
    """Whether a hub env is built on another SWE env (an agent installed in it: the same tasks)."""
    from rockroll.envhub.pull import resolve

    if not manifest.base.startswith("hub:"):
        return False
    parent, _ = resolve(manifest.base[4:], store, cache)
    return parent.entry_point == ENTRY_POINT and parent.private is not None


def hub_swe_tasks(hub: str | None = None) -> list[SWETask]:
    """The tasks of every SWE env on ``hub`` (latest release of each major), pulling them;
    agent variants (``build-swe --agent``) are left out: they repeat their base env's tasks."""
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
            if (manifest.entry_point != ENTRY_POINT or manifest.private is None
                    or _repeats_swe_env(manifest, store, cache)):
                continue
            env = pull(f"{name}@{version}", hub=store, cache=cache)
            tasks += load_swe_tasks(env.private_dir / TASKS_FILE)
    return tasks


# ---- grading pieces (pure) -------------------------------------------------------------------
_CHUNK = re.compile(r"^diff --git ", re.M)
_QUOTED = r'"(?:[^"\\]|\\.)*"'
_HEADER_NAMES = re.compile(rf'({_QUOTED}|[^"\s]\S*) ({_QUOTED}|[^"\s]\S*)')
_ESCAPES = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}
# Header lines that name a path, and whether the name carries git's a/ or b/ prefix.
_PATH_LINES = (("--- ", True), ("+++ ", True), ("rename from ", False), ("rename to ", False),
               ("copy from ", False), ("copy to ", False))


def _unquote(name: str) -> str:
    """A path as git writes it: C-quoted, with octal bytes, when it has unusual characters."""
    if not name.startswith('"'):
        return name
    raw = re.sub(rb'\\([0-7]{3}|.)', lambda m: bytes([int(m[1], 8) if len(m[1]) == 3 else _ESCAPES[m[1].decode()]]),
                 name[1:-1].encode())
    return raw.decode()


def _chunk_paths(chunk: str) -> list[str] | None:
    """Every path the header of a ``diff --git`` chunk names (prefixes removed); None when
    the header cannot be read."""
    lines = chunk.split("\n")
    rest = lines[0][len("diff --git "):]
    m = _HEADER_NAMES.fullmatch(rest)
    if m:
        names = [m.group(1), m.group(2)]
    else:  # unquoted names with spaces: git writes them only as "a/NAME b/NAME"
        half = len(rest) // 2
        names = [rest[:half], rest[half + 1:]]
        if rest[half:half + 1] != " " or names[0][2:] != names[1][2:]:
            return None
    try:
        names = [_unquote(n) for n in names]
        if not (names[0].startswith("a/") and names[1].startswith("b/")):
            return None
        paths = [names[0][2:], names[1][2:]]
        for line in lines[1:]:
            if line.startswith(("@@", "GIT binary patch", "Binary files")):
                break  # the header ends; hunk lines could look like anything
            for prefix, prefixed in _PATH_LINES:
                if line.startswith(prefix):
                    name = _unquote(line[len(prefix):].split("\t", 1)[0])
                    if name == "/dev/null":
                        continue
                    if prefixed and not name.startswith(("a/", "b/")):
                        return None
                    paths.append(name[2:] if prefixed else name)
    except (KeyError, UnicodeDecodeError):  # an escape git never writes
        return None
    return paths


def _chunks(diff: str) -> list[str]:
    """``diff`` cut at its ``diff --git`` lines (anything before the first is not kept)."""
    starts = [m.start() for m in _CHUNK.finditer(diff)]
    return [diff[a:b] for a, b in zip(starts, [*starts[1:], len(diff)])]


def patch_paths(diff: str) -> set[str]:
    """The paths the ``diff --git`` chunks of ``diff`` name (a task's ``test_patch`` files)."""
    return {p for chunk in _chunks(diff) for p in _chunk_paths(chunk) or ()}


def filter_patch(diff: str, ignore: Iterable[str] = ()) -> tuple[str, list[str]]:
    """``diff`` without the chunks that are not graded (see :func:`is_graded_path`), those
    that touch a path in ``ignore`` (a task's ``test_patch`` files), and those whose header
    cannot be read. Returns (the kept diff, the dropped paths)."""
    ignore = set(ignore)
    kept, dropped = [], []
    for chunk in _chunks(diff):
        paths = _chunk_paths(chunk)
        if paths is not None and all(is_graded_path(p) and p not in ignore for p in paths):
            kept.append(chunk)
        else:
            dropped.append(paths[1] if paths else chunk.split("\n", 1)[0])
    return "".join(kept), dropped


def numstat_paths(out: str) -> list[str]:
    """The paths in ``git apply --numstat -z`` output: the files git will write when it
    applies (a rename shows its new name only; removing a file cannot make a test pass)."""
    return [record.split("\t", 2)[-1] for record in out.split("\0") if record]


def read_report(text: str, key: str) -> tuple[dict[str, str], dict[str, str]]:
    """The plugin's JSON lines -> ({test id: passed|failed|skipped}, {test id: failure text}).
    Lines not signed with ``key`` are ignored."""
    outcome: dict[str, str] = {}
    messages: dict[str, str] = {}
    for line in text.splitlines():
        body, _, mac = line.rpartition(" ")
        signed = hmac.new(key.encode(), body.encode(), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(mac.encode(), signed.encode()):
            continue
        try:
            rec = json.loads(body)
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


def pytest_command(tests: str, report: str) -> str:
    """pytest on ``tests`` (shell words) with the reporting plugin writing to ``report``: the
    one command line the builder and the grader share, so test ids and outcomes match."""
    return f"PYTHONPATH={ENV_DIR}${{PYTHONPATH:+:$PYTHONPATH}} ROCKROLL_REPORT={report} {PYTEST} {tests}"


def grading_command(task: SWETask, report: str) -> str:
    """The shell command that runs the graded tests of ``task`` with the reporting plugin."""
    files = " ".join(shlex.quote(f) for f in task.test_files)
    if task.test_cmd:
        env = f"PYTHONPATH={ENV_DIR}${{PYTHONPATH:+:$PYTHONPATH}} ROCKROLL_REPORT={report}"
        return f"{_CONDA}; {env} {task.test_cmd.replace('{tests}', files)}"
    return f"{_CONDA}; {pytest_command(files, report)}"


# ---- reports in a sandbox ----------------------------------------------------------------------
async def arm_report(sb: AsyncSandbox) -> tuple[str, str]:
    """Put the reporting plugin and a one-use key in ``sb``; return (report path, key): run
    :func:`pytest_command` with that path, then :func:`fetch_report`."""
    report, key = f"{ENV_DIR}/report-{secrets.token_hex(6)}.jsonl", secrets.token_hex(16)
    await sb.write_file(f"{ENV_DIR}/{PLUGIN}.py", REPORT_PLUGIN)
    await sb.write_file(f"{report}.key", key)
    return report, key


async def fetch_report(sb: AsyncSandbox, report: str, key: str) -> tuple[dict[str, str], dict[str, str]]:
    """:func:`read_report` of the report in ``sb`` (none written: no outcomes)."""
    raw = (await sb.read_file(report)).decode(errors="replace") if await sb.exists(report) else ""
    return read_report(raw, key)


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
        "your changes to the repository since the task's commit (committed or not) are then tested with hidden "
        "tests and the episode ends."
    )


# ---- the env ---------------------------------------------------------------------------------
#: Where the episode's first commit is kept for a task without a ``base_commit``.
BASE_REF = "refs/rockroll/base"
# The agent's work: everything since the task's commit, committed or not (exit 3: that commit
# is gone), in the format `git apply` reads whatever the agent's git config says.
_DIFF_SCRIPT = ("git rev-parse --git-dir >/dev/null 2>&1 || exit 2; "
                "git cat-file -e {base}^{{commit}} 2>/dev/null || exit 3; git add -A >/dev/null 2>&1; "
                "git diff --cached --binary --no-color --no-ext-diff --no-textconv --no-renames "
                "--src-prefix=a/ --dst-prefix=b/ {base}")
_NOT_RESOLVED = {"f2p_pass_fraction": 0.0, "p2p_pass_fraction": 0.0, "resolved": False}


class SWEEnv(SandboxToolEnv):
    """Repository repair graded by hidden tests; see the module docstring.

    Each task has its own warm pool (sandboxes waiting at its buggy state); ``max_warm_pools``
    (a :class:`~rockroll.gem.tools.SandboxToolEnv` argument, default 8) is how many tasks stay
    warm while unused, so a pass over a large task file keeps a bounded number of sandboxes.
    """

    #: ``agent=`` puts the tasks where that agent is installed (``rock/Agent-v0`` reads this).
    takes_agent = True

    def __init__(
        self,
        *,
        tasks: Sequence[SWETask] | None = None,
        tasks_file: str | os.PathLike | None = None,
        private_dir: str | os.PathLike | None = None,
        image: str | None = None,
        hub: str | None = None,
        task_ids: Sequence[str] | None = None,
        agent: str | None = None,
        test_timeout: float = 300.0,
        max_turns: int = 40,
        step_timeout: float = 120.0,
        **kwargs: Any,
    ):
        every_hub_task = tasks is None and tasks_file is None and private_dir is None and task_ids is None
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
        if agent is not None:
            tasks, missing = pull_agent_tasks(tasks, agent, hub)
            # Every hub task asked for: those whose env has the variant. Named tasks: all of them.
            if missing and (not tasks or not every_hub_task):
                raise ValueError(f"agent={agent!r}: the tasks' env with it installed is not on the hub "
                                 f"({', '.join(sorted(missing))}): build it with `{'`, `'.join(missing.values())}`")
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
        if not task.base_commit:  # then the episode's first commit is what the work is diffed against
            await self._env_run(sandbox, "base.sh", f"git update-ref {BASE_REF} HEAD")
        return _first_observation(task)

    def agent_instruction(self, task: SWETask) -> str:
        return (f"Resolve this issue in the repository of {task.repo or 'a Python project'} at {task.workdir} "
                f"(the working directory):\n\n{task.problem_statement}\n\n"
                "Change the code, not the tests: they are replaced by the originals when the work is graded.")

    def expert_commands(self, task: SWETask) -> list[str]:
        """The gold patch applied with ``git apply`` from a here-document (its marker never a
        line of the patch), in one turn."""
        marker = "ROCKROLL_GOLD_PATCH"
        while marker in task.patch.splitlines():
            marker += "_"
        body = task.patch if task.patch.endswith("\n") else task.patch + "\n"
        return [f"git apply <<'{marker}'\n{body}{marker}"]

    async def _evaluate(self, sandbox: AsyncSandbox, task: SWETask, action: Action, text: str) -> Evaluation:
        base = task.base_commit or BASE_REF
        diff_result = await self._env_run(sandbox, "diff.sh", _DIFF_SCRIPT.format(base=shlex.quote(base)), timeout=60)
        if diff_result.exit_code != 0:
            why = (f"the task's commit {base} is no longer in the repository (was its history rewritten and pruned?)"
                   if diff_result.exit_code == 3 else "is it still a git repository?")
            return Evaluation(0.0, f"Submitted, but your changes could not be read: {why}", dict(_NOT_RESOLVED))
        ignore = patch_paths(task.test_patch)
        patch, dropped = filter_patch(diff_result.stdout, ignore)
        grader = await self._lease.pool.acquire()
        try:
            return await self._grade(grader, task, patch, dropped, ignore)
        finally:
            await release_quietly(self._lease.pool, grader)

    async def _grade(self, sb: AsyncSandbox, task: SWETask, patch: str, dropped: list[str], ignore: set[str]
                     ) -> Evaluation:
        info: dict[str, Any] = {"ignored_files": dropped, "patch_chars": len(patch)}
        for name, body in (("model.diff", patch), ("test.diff", task.test_patch)):
            if not body.strip():
                continue
            path = f"{ENV_DIR}/{name}"
            await sb.write_file(path, body)
            # --numstat: the paths as git itself reads the diff, whatever its headers say.
            applied = await self._env_run(sb, f"apply-{name}.sh",
                                          f"git apply --numstat -z {path} && git apply --whitespace=nowarn {path}",
                                          timeout=60)
            if applied.exit_code != 0:
                why = truncate_observation(applied.stderr.strip(), 1500)
                what = "Your changes" if name == "model.diff" else "The task's test patch"
                return Evaluation(0.0, f"Submitted. {what} did not apply to a clean checkout:\n{why}",
                                  {**info, **_NOT_RESOLVED})
            hidden = [p for p in numstat_paths(applied.stdout) if not is_graded_path(p) or p in ignore]
            if name == "model.diff" and hidden:  # a diff crafted so that its headers hide what it changes
                return Evaluation(0.0, "Submitted. Your diff changes files that are not graded in a way that could "
                                  "not be separated: " + ", ".join(hidden[:10]),
                                  {**info, "ignored_files": dropped + hidden, **_NOT_RESOLVED})
        report, key = await arm_report(sb)
        result = await self._env_run(sb, "test.sh", grading_command(task, report), timeout=self.test_timeout)
        outcomes, messages = await fetch_report(sb, report, key)
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
            lines.append("Not graded (tests, test config, byproducts, startup hooks): " + ", ".join(dropped[:10]))
        still = [t for t in (*task.fail_to_pass, *task.pass_to_pass) if outcomes.get(t) != "passed"][:3]
        for t in still:
            lines.append(f"{t}: {outcomes.get(t, 'did not run')}\n" + truncate_observation(messages.get(t, ""), 600))
        # A run cut off by test_timeout is said so, not left to look like failing tests.
        info.update(f2p_pass_fraction=f2p_frac, p2p_pass_fraction=p2p_frac, resolved=resolved,
                    tests_timed_out=result.timed_out,
                    pass_fraction=(len(f2p) + len(p2p)) / max(1, len(task.fail_to_pass) + len(task.pass_to_pass)))
        return Evaluation(1.0 if resolved else 0.0, truncate_observation("\n".join(lines), 6000), info)


# ---- tasks in an env's variant with an agent installed (rockroll envs build-swe --agent) ----
def agent_variant(ref: str, agent: str) -> tuple[str, str]:
    name, _, version = ref.partition("@")
    return f"{name}-{agent}", version


def agent_tasks(tasks: Sequence[SWETask], agent: str) -> list[SWETask]:
    """``tasks`` (of hub SWE envs) in their env's variant with ``agent`` installed (a task
    already there stays as it is)."""
    out = []
    for t in tasks:
        if not (t.image.startswith("hub:") and t.snapshot == f"{t.image}#{t.id}"):
            raise ValueError(f"{t.id}: not a task of a hub SWE env (image {t.image!r})")
        if t.image.partition("@")[0].endswith(f"-{agent}"):  # already in the variant
            out.append(t)
            continue
        name, version = agent_variant(t.image[4:], agent)
        image = f"hub:{name}@{version}"
        out.append(replace(t, image=image, snapshot=f"{image}#{t.id}"))
    return out


def pull_agent_tasks(tasks: Sequence[SWETask], agent: str, hub: str | None = None
                     ) -> tuple[list[SWETask], dict[str, str]]:
    """``agent_tasks(tasks, agent)`` whose variants are on ``hub`` (default: the default hub),
    pulled from it (so a sandbox's bare ``hub:`` ref finds them), and, for the others, each
    missing variant's ref -> the command that builds it."""
    from rockroll.envhub import pull
    from rockroll.envhub.errors import EnvNotFound

    found: list[SWETask] = []
    missing: dict[str, str] = {}
    pulled: set[str] = set()
    for t in agent_tasks(tasks, agent):
        ref = t.image[4:]
        if ref not in pulled and ref not in missing:
            try:
                pull(ref, hub=hub)
                pulled.add(ref)
            except EnvNotFound:
                name, _, version = ref.partition("@")
                package = name.removeprefix("swe-").removesuffix(f"-{agent}")
                missing[ref] = (f"rockroll envs build-swe --package {package}=={version} --agent {agent}"
                                + (f" --hub {hub}" if hub else ""))
        if ref in pulled:
            found.append(t)
    return found, missing
