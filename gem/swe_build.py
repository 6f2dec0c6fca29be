"""``rockroll envs build-swe``: SWE tasks from real packages, published as pre-warmed hub envs.

For each ``NAME==VERSION``:

1. download its sdist from the package index (``pip download --no-binary :all:``), which
   carries the test suite; nothing of it is committed to this repository;
2. put it in a sandbox on the ``swe-python`` hub env (Debian, python3, pytest, git),
   importable (a ``.pth`` file) and byte-compiled, and run its tests twice: tests that pass
   both times are the baseline;
3. propose bugs by AST mutation (:mod:`rockroll.gem.swe_mutate`), in a seeded order that
   alternates kinds and takes at most one bug per function, and run the tests on each in a
   restored copy of that sandbox (two at a time): a mutation becomes a task if it breaks
   some baseline tests (``FAIL_TO_PASS``) and leaves the others passing (``PASS_TO_PASS``,
   at least half of them), and a second run breaks exactly the same tests;
4. write the problem statement from the failing tests' assertion output;
5. build the hub env ``swe-<name>@<version>``: the clean repository in ``/workspace``
   (installed and compiled: pre-warmed), one named snapshot per task holding the buggy
   state as a fresh one-commit git repository, and the task records (SWE-bench fields plus
   ``snapshot``) as host-only private files: the agent can read neither the tests' ids nor
   the fix. Publish it.

A version already on the hub is left alone (versions are immutable): building is skipped.

Agents (``--agent NAME``, :mod:`rockroll.gem.agents`) go into *variants*, so the default
build stays as it is: ``swe-<name>-<agent>@<version>`` sits on ``swe-<name>@<version>``,
its setup is the agent's install steps, and it holds one snapshot per task at the same
buggy state (the reference fix reversed, then the same reproducible commit, checked
against the task's ``base_commit``). Its hidden task records are its base's, pointed at it
(:func:`agent_tasks`), so ``rock/swe-<name>-<agent>-v<major>`` makes them; ``rock/SWE-v0``
leaves variants out (it does not count a task twice).
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Callable, Sequence

from rockroll.sandbox import AsyncSandbox, SandboxSpec

from .agents import AgentSpec
from .swe import (TASKS_FILE, agent_tasks, agent_variant, arm_report, fetch_report, is_graded_path,
                  load_swe_tasks, pull_agent_tasks, pytest_command)
from .swe_mutate import KINDS, Mutation, find_mutations, unified_diff

__all__ = ["DEFAULT_PACKAGES", "DEMO_PACKAGE", "BuiltEnv", "agent_tasks", "build_agent_variant", "build_swe", "detect_layout", "ensure_base",
           "git_init_script", "pull_agent_tasks"]

#: The default task set: small, pure-Python, dependency-free packages whose sdists ship
#: fast pytest suites that run on Debian bookworm's pytest 7.
DEFAULT_PACKAGES = ("cachetools==5.3.3", "inflection==0.5.1", "toolz==0.12.1")
# What `make demo` builds (`build-swe --demo`): the one package whose task it plays, the quickest
# of the three to screen (inflection's suite runs in a second; cachetools' and toolz's take longer).
DEMO_PACKAGE = "inflection==0.5.1"
WORKDIR = "/workspace"
BASE_PACKAGE = "python"  # gem/data/swe/<this>: the swe-python env
_SKIP_DIRS = {"docs", "doc", "examples", "example", "benchmarks", "bench", "build", "dist", "tools", "scripts"}
_SKIP_FILES = {"setup.py", "versioneer.py", "_version.py", "conftest.py", "noxfile.py", "__main__.py"}
_FIXED_DATE = "2000-01-01T00:00:00+0000"  # git commits of the buggy states: same inputs, same hash


def git_init_script(workdir: str = WORKDIR) -> str:
    """Make ``workdir`` a one-commit git repository, reproducibly (fixed identity and date;
    the index rebuilt without stat data, so the layer's bytes do not depend on inodes)."""
    return (
        f"cd {workdir} && rm -rf .git && git init -q && "
        "printf '__pycache__/\\n*.py[co]\\n.pytest_cache/\\n*.egg-info/\\n' > .git/info/exclude && "
        f"git add -A && GIT_AUTHOR_DATE={_FIXED_DATE} GIT_COMMITTER_DATE={_FIXED_DATE} "
        "git -c user.name=rockroll -c user.email=swe@rockroll.invalid commit -q -m 'base' && "
        "rm -f .git/index && git read-tree HEAD && rm -rf .git/logs .git/COMMIT_EDITMSG .git/hooks"
    )


@dataclass(frozen=True)
class RepoLayout:
    root: Path
    pythonpath: str              # relative to the repo: "src" or "."
    sources: tuple[str, ...]     # files bugs may go in
    tests: tuple[str, ...]       # paths pytest runs

    def setup_commands(self, workdir: str = WORKDIR) -> list[str]:
        """Install (importable from anywhere) and byte-compile: the pre-warmed state.
        checked-hash pycs: layers zero mtimes, so timestamp pycs could mask an edit."""
        path = workdir if self.pythonpath == "." else f"{workdir}/{self.pythonpath}"
        site = "$(python3 -c 'import site; print(site.getsitepackages()[0])')"
        return [
            f'mkdir -p "{site}" && echo {path} > "{site}/rockroll-swe.pth"',
            f"python3 -m compileall -q --invalidation-mode checked-hash {workdir} >/dev/null",
        ]


def detect_layout(root: Path) -> RepoLayout:
    """Where a repository's importable code and its tests are."""
    pythonpath = "src" if (root / "src").is_dir() else "."
    sources, test_files = [], []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        parts = rel.split("/")
        if parts[0] in _SKIP_DIRS or any(p.startswith(".") or p.endswith(".egg-info") for p in parts):
            continue
        name = parts[-1]
        if re.fullmatch(r"test_.*\.py|.*_test\.py", name):
            test_files.append(rel)
        elif is_graded_path(rel) and name not in _SKIP_FILES and not name.startswith("_build") \
                and (path.parent / "__init__.py").exists():  # bugs go only where the grader takes a fix
            sources.append(rel)
    tests: list[str] = []
    for rel in test_files:
        parts = rel.split("/")
        where = "/".join(parts[: parts.index(next(p for p in parts if p in ("tests", "test"))) + 1]) \
            if any(p in ("tests", "test") for p in parts[:-1]) else rel
        if not any(where == t or where.startswith(t + "/") for t in tests):
            tests = [t for t in tests if not t.startswith(where + "/")] + [where]
    if not sources:
        raise BuildSWEError(f"{root.name}: no Python package sources found")
    if not tests:
        raise BuildSWEError(f"{root.name}: the sdist has no tests (test_*.py)")
    return RepoLayout(root, pythonpath, tuple(sources), tuple(sorted(tests)))


class BuildSWEError(RuntimeError):
    """A package cannot be made into SWE tasks (no sdist, no tests, too few bugs kept...)."""


# ---- download ---------------------------------------------------------------------------------
def parse_requirement(spec: str) -> tuple[str, str]:
    m = re.fullmatch(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([0-9][0-9A-Za-z.+!-]*)\s*", spec)
    if not m:
        raise BuildSWEError(f"{spec!r}: give an exact version, NAME==VERSION (e.g. cachetools==5.3.3)")
    return m.group(1), m.group(2)


def env_version(version: str) -> str:
    """The hub version of a package version: X.Y.Z (padded); anything else is refused."""
    m = re.fullmatch(r"(\d+)(?:\.(\d+))?(?:\.(\d+))?", version)
    if not m:
        raise BuildSWEError(f"version {version!r} is not X[.Y[.Z]]: pre/post/dev releases are not supported")
    return ".".join(str(int(x or 0)) for x in m.groups())


def env_name(name: str) -> str:
    return "swe-" + re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def download_sdist(name: str, version: str, dest: Path) -> Path:
    """Download and unpack the sdist of ``name==version``; return the unpacked root."""
    out = dest / "download"
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                           "--disable-pip-version-check", "-q", "-d", str(out), f"{name}=={version}"],
                          capture_output=True, text=True)
    archives = sorted(out.glob("*")) if out.is_dir() else []
    if proc.returncode or not archives:
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        raise BuildSWEError(f"pip download {name}=={version} failed:\n{tail}")
    unpacked = dest / "src"
    archive = archives[0]
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as z:
            for member in z.namelist():  # zip paths may not escape the target
                if member.startswith("/") or ".." in Path(member).parts:
                    raise BuildSWEError(f"{archive.name}: unsafe path {member!r}")
            z.extractall(unpacked)
    else:
        with tarfile.open(archive) as t:
            t.extractall(unpacked, filter="data")
    roots = [p for p in unpacked.iterdir() if p.is_dir()]
    if len(roots) != 1:
        raise BuildSWEError(f"{archive.name}: expected one top folder, found {len(roots)}")
    return roots[0]


# ---- screening ----------------------------------------------------------------------------------
@dataclass
class _Run:
    outcomes: dict[str, str]
    messages: dict[str, str]
    timed_out: bool


@dataclass
class _Kept:
    mutation: Mutation
    fail_to_pass: list[str]
    pass_to_pass: list[str]
    messages: dict[str, str]
    base_commit: str = ""


class _Screen:
    """The sandboxes that run a package's tests, each reset to the installed clean state."""

    def __init__(self, layout: RepoLayout, image: str, timeout: float):
        self.layout, self.image, self.timeout = layout, image, timeout
        self.boxes: list[AsyncSandbox] = []
        self.clean = None

    async def start(self, workers: int) -> _Run:
        spec = SandboxSpec(image=self.image, workdir=WORKDIR, memory_mb=2048, pids=512)
        first = await AsyncSandbox.create(spec)
        self.boxes.append(first)
        await first.upload(self.layout.root, WORKDIR)
        for cmd in self.layout.setup_commands():
            r = await first.run(cmd, timeout=300)
            if not r.ok:
                raise BuildSWEError(f"installing the package failed ({cmd}): {r.stderr.strip()[-500:]}")
        self.clean = await first.snapshot()
        self.boxes += await first.fork(workers - 1) if workers > 1 else []
        return await self.run(first, {})

    async def run(self, sb: AsyncSandbox, files: dict[str, str]) -> _Run:
        await sb.restore(self.clean)
        for path, text in files.items():
            await sb.write_file(f"{WORKDIR}/{path}", text)
        report, key = await arm_report(sb)
        cmd = f"cd {WORKDIR} && {pytest_command(' '.join(self.layout.tests), report)} >/dev/null 2>&1; true"
        r = await sb.run(cmd, timeout=self.timeout)
        outcomes, messages = await fetch_report(sb, report, key)
        return _Run(outcomes, messages, r.timed_out)

    async def commit(self, sb: AsyncSandbox, files: dict[str, str]) -> str:
        """The hash the buggy state's reproducible commit gets (the task's base_commit)."""
        await sb.restore(self.clean)
        for path, text in files.items():
            await sb.write_file(f"{WORKDIR}/{path}", text)
        r = await sb.run(f"{git_init_script()} && git rev-parse HEAD", timeout=120)
        if not r.ok:
            raise BuildSWEError(f"git commit of the buggy state failed: {r.stderr.strip()[-300:]}")
        return r.stdout.strip().splitlines()[-1]

    async def close(self) -> None:
        for sb in self.boxes:
            await sb.close()


def _order(mutations: list[Mutation], seed: str) -> list[Mutation]:
    """Seeded shuffle, then round-robin over kinds: every kind gets its turn early."""
    rng = random.Random(seed)
    by_kind = {k: [m for m in mutations if m.kind == k] for k in KINDS}
    for ms in by_kind.values():
        rng.shuffle(ms)
    out = []
    while any(by_kind.values()):
        for k in KINDS:
            if by_kind[k]:
                out.append(by_kind[k].pop())
    return out


async def _screen(layout: RepoLayout, image: str, want: int, *, seed: str, workers: int, max_candidates: int,
                  timeout: float, say: Callable[[str], None]) -> tuple[list[_Kept], int]:
    screen = _Screen(layout, image, timeout)
    try:
        first = await screen.start(workers)
        second = await screen.run(screen.boxes[0], {})
        baseline = sorted(t for t, o in first.outcomes.items() if o == "passed" and second.outcomes.get(t) == "passed")
        if len(baseline) < 10:
            raise BuildSWEError(f"only {len(baseline)} tests pass on the clean package; need at least 10")
        say(f"baseline: {len(baseline)} tests pass (twice)")
        sources = {rel: (layout.root / rel).read_text() for rel in layout.sources}
        candidates = _order([m for rel, text in sources.items() for m in find_mutations(rel, text)], seed)
        kept: list[_Kept] = []
        used: set[str] = set()  # file:function of the bugs kept: one bug per function
        pending, tried = list(candidates), 0

        def where(m: Mutation) -> str:
            return f"{m.file}:{m.function}"

        async def check(sb: AsyncSandbox, m: Mutation) -> _Kept | None:
            mutated = {m.file: m.apply(sources[m.file])}
            run = await screen.run(sb, mutated)
            broken = [t for t in baseline if run.outcomes.get(t) != "passed"]
            if run.timed_out or not broken or len(broken) * 2 > len(baseline):
                return None
            again = await screen.run(sb, mutated)
            if [t for t in baseline if again.outcomes.get(t) != "passed"] != broken:
                return None  # flaky: the same bug must break the same tests every time
            return _Kept(m, broken, [t for t in baseline if t not in broken], run.messages)

        # Rounds of one candidate per sandbox, decided in candidate order: the tasks depend
        # on the seed and the test outcomes only, never on which sandbox finished first.
        while len(kept) < want and tried < max_candidates:
            batch: list[Mutation] = []
            for m in pending:
                if len(batch) == len(screen.boxes):
                    break
                if where(m) not in used and all(where(b) != where(m) for b in batch):
                    batch.append(m)
            if not batch:
                break
            pending = [m for m in pending if m not in batch]
            tried += len(batch)
            for m, k in zip(batch, await asyncio.gather(*(check(sb, m) for sb, m in zip(screen.boxes, batch)))):
                if k is not None and len(kept) < want and where(m) not in used:
                    used.add(where(m))
                    kept.append(k)
                    say(f"  kept {len(kept)}/{want}: {m.kind} in {m.file}:{m.line} ({m.function or 'module'}) "
                        f"breaks {len(k.fail_to_pass)} test(s)")
        for k in kept:
            k.base_commit = await screen.commit(screen.boxes[0], {k.mutation.file: k.mutation.apply(sources[k.mutation.file])})
        return kept, tried
    finally:
        await screen.close()


# ---- statements and records ---------------------------------------------------------------------------
def problem_statement(name: str, version: str, kept: _Kept) -> str:
    """An issue written from what the failing tests print (assertion lines, no locations)."""
    shown = kept.fail_to_pass[:3]
    parts = [f"After a recent change, {len(kept.fail_to_pass)} test(s) of {name} {version} fail.", ""]
    for test in shown:
        msg = kept.messages.get(test, "")
        lines = [l for l in msg.splitlines() if l.startswith("E ")][:8] or msg.strip().splitlines()[-3:]
        parts += [f"{test} fails:", "```", *[l.rstrip() for l in lines], "```", ""]
    if len(kept.fail_to_pass) > len(shown):
        parts.append(f"({len(kept.fail_to_pass) - len(shown)} more failing test(s) not shown.)")
    parts.append("Find the bug in the library code and fix it, so that these tests pass and the rest of the "
                 "test suite keeps passing.")
    return "\n".join(parts)


def task_id(name: str, version: str, m: Mutation) -> str:
    return f"{re.sub(r'[^A-Za-z0-9]+', '-', name)}-{version}__{m.kind}-{m.id}"


def _toml(value) -> str:
    # JSON strings, lists and tables of them are valid TOML values.
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + " }"
    return json.dumps(value)


def write_package(folder: Path, *, name: str, version: str, layout: RepoLayout, base_ref: str,
                  kept: list[_Kept], license: str) -> list[dict]:
    """The hub env package of ``kept`` tasks; returns the task records."""
    ename, ever = env_name(name), env_version(version)
    image, major = f"hub:{ename}@{ever}", ever.split(".")[0]
    shutil.copytree(layout.root, folder / "repo", symlinks=True)
    (folder / "private").mkdir(parents=True)
    records, snapshot_tables = [], []
    for k in kept:
        tid = task_id(name, version, k.mutation)
        clean = (layout.root / k.mutation.file).read_text()
        buggy = k.mutation.apply(clean)
        bug = unified_diff(k.mutation.file, clean, buggy)
        apply_bug = f"cd {WORKDIR} && git apply --whitespace=nowarn <<'ROCKROLL_BUG'\n{bug}ROCKROLL_BUG"
        snapshot_tables.append(f"[snapshots.{json.dumps(tid)}]\ncommands = {_toml([apply_bug, git_init_script()])}\n")
        records.append({
            "instance_id": tid, "repo": name, "version": version, "base_commit": k.base_commit,
            "patch": unified_diff(k.mutation.file, buggy, clean), "test_patch": "",
            "FAIL_TO_PASS": k.fail_to_pass, "PASS_TO_PASS": k.pass_to_pass,
            "problem_statement": problem_statement(name, version, k),
            "image": image, "snapshot": f"{image}#{tid}", "workdir": WORKDIR,
            "mutation": {"file": k.mutation.file, "line": k.mutation.line, "kind": k.mutation.kind,
                         "function": k.mutation.function},
            "created_by": "rockroll envs build-swe",
        })
    (folder / "private" / TASKS_FILE).write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
    manifest = [
        f"name = {_toml(ename)}", f"version = {_toml(ever)}",
        f"description = {_toml(f'{len(records)} repair tasks: bugs injected into {name} {version} (sdist), its tests grade')}",
        f"license = {_toml(license)}", f"base = {_toml('hub:' + base_ref)}",
        f"gym_id = {_toml(f'rock/{ename}-v{major}')}",
        f"setup = {_toml(layout.setup_commands())}", "setup_timeout_s = 600", 'private = "private"', "",
        "[files]", f'"repo" = {_toml(WORKDIR)}', "",
        "[env]", f"entry_point = {_toml('rockroll.gem.swe:SWEEnv')}", "", *snapshot_tables,
    ]
    (folder / "rockenv.toml").write_text("\n".join(manifest))
    return records


def _license(root: Path) -> str:
    try:
        for line in (root / "PKG-INFO").read_text(errors="replace").splitlines():
            if line.startswith("License:") and line[8:].strip() and len(line) < 100:
                return line[8:].strip()
    except OSError:
        pass
    return ""


# ---- the whole build --------------------------------------------------------------------------------
@dataclass
class BuiltEnv:
    package: str
    ref: str                         # hub env name@version
    created: bool                    # False: it was already on the hub
    tasks: int
    tried: int = 0                   # candidate mutations screened
    records: list[dict] = field(default_factory=list)


def ensure_base(hub: str, say: Callable[[str], None]) -> str:
    """Build and publish the ``swe-python`` base env if the hub lacks it; return its ref."""
    from rockroll.envhub import build, publish
    from rockroll.envhub.package import load_package
    from rockroll.envhub.store import HubStore

    with resources.as_file(resources.files(__package__) / "data" / "swe" / BASE_PACKAGE) as folder:
        pkg = load_package(folder)
        store = HubStore(hub)
        if store.read(store.manifest_path(pkg.name, pkg.version)) is None:
            say(f"building the base env {pkg.name}@{pkg.version} (Debian + python3-pytest + git)")
            publish(build(folder, hub=hub, log=say).manifest, store)
        return f"{pkg.name}@{pkg.version}"


def build_swe(packages: Sequence[str], *, tasks: int = 10, hub: str | None = None, workers: int = 2,
              max_candidates: int = 150, timeout: float = 120.0, log: Callable[[str], None] | None = None
              ) -> list[BuiltEnv]:
    """Build and publish one SWE hub env per ``NAME==VERSION``; see the module docstring."""
    from rockroll.envhub import build, publish
    from rockroll.envhub.store import HubStore, default_hub_url, normalize_url

    say = log or (lambda msg: None)
    hub = normalize_url(hub or default_hub_url())
    specs = [parse_requirement(p) for p in packages]  # all checked before any work
    for name, version in specs:
        env_version(version)
    if tasks < 1:
        raise BuildSWEError("tasks must be at least 1")
    base_ref = None  # built when an env needs building: a hub holding them all needs no base
    store = HubStore(hub)
    out = []
    for name, version in specs:
        ref = f"{env_name(name)}@{env_version(version)}"
        if store.read(store.manifest_path(env_name(name), env_version(version))) is not None:
            say(f"{ref} is already on {hub}: skipped")
            out.append(BuiltEnv(f"{name}=={version}", ref, False, -1))
            continue
        with tempfile.TemporaryDirectory(prefix="rockroll-swe-") as tmp:
            base_ref = base_ref or ensure_base(hub, say)
            say(f"{name}=={version}: downloading the sdist")
            root = download_sdist(name, version, Path(tmp))
            layout = detect_layout(root)
            say(f"{name}=={version}: {len(layout.sources)} source file(s), tests in {', '.join(layout.tests)}")
            kept, tried = asyncio.run(_screen(layout, f"hub:{base_ref}", tasks, seed=f"{name}=={version}",
                                              workers=workers, max_candidates=max_candidates,
                                              timeout=timeout, say=say))
            if len(kept) < tasks:
                raise BuildSWEError(f"{name}=={version}: only {len(kept)} of {tasks} bugs kept after "
                                    f"{tried} candidates (try fewer --tasks or another package)")
            kept.sort(key=lambda k: (k.mutation.file, k.mutation.start))
            folder = Path(tmp) / "package"
            records = write_package(folder, name=name, version=version, layout=layout, base_ref=base_ref,
                                    kept=kept, license=_license(root))
            say(f"{name}=={version}: building {ref} ({len(records)} tasks)")
            manifest = build(folder, hub=hub, log=say).manifest
            created = publish(manifest, store).created
            say(f"{ref}: published on {hub}")
            out.append(BuiltEnv(f"{name}=={version}", ref, created, len(records), tried, records))
    return out


# ---- agent variants ---------------------------------------------------------------------------------
def build_agent_variant(ref: str, agent: AgentSpec, *, hub: str | None = None,
                        log: Callable[[str], None] | None = None) -> BuiltEnv:
    """Build and publish the variant of the SWE env ``ref`` (``name@version``) with ``agent``
    installed (see the module docstring); skipped when the hub has it."""
    from rockroll.envhub import build, publish, pull
    from rockroll.envhub.store import HubStore, default_hub_url, normalize_url

    say = log or (lambda msg: None)
    hub = normalize_url(hub or default_hub_url())
    store = HubStore(hub)
    name, version = agent_variant(ref, agent.name)
    out = f"{name}@{version}"
    if store.read(store.manifest_path(name, version)) is not None:
        say(f"{out} is already on {hub}: skipped")
        return BuiltEnv(agent.name, out, False, -1)
    env = pull(ref, hub=store)
    if env.private_dir is None or not (env.private_dir / TASKS_FILE).is_file():
        raise BuildSWEError(f"{ref} is not a SWE env built by build-swe (no task records)")
    tasks = load_swe_tasks(env.private_dir / TASKS_FILE)
    lines = (env.private_dir / TASKS_FILE).read_text().splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    for rec, t in zip(records, agent_tasks(tasks, agent.name)):  # its tasks, in this image
        rec.update(image=t.image, snapshot=t.snapshot, created_by=f"rockroll envs build-swe --agent {agent.name}")
    snapshots = []
    for t in tasks:
        unfix = f"cd {WORKDIR} && git apply -R --whitespace=nowarn <<'ROCKROLL_FIX'\n{t.patch}ROCKROLL_FIX"
        same = f'test "$(git -C {WORKDIR} rev-parse HEAD)" = {t.base_commit}'  # the task's commit, exactly
        snapshots.append(f"[snapshots.{json.dumps(t.id)}]\ncommands = {_toml([unfix, git_init_script(), same])}\n")
    manifest = [
        f"name = {_toml(name)}", f"version = {_toml(version)}",
        f"description = {_toml(f'{ref} with {agent.name} installed: its {len(tasks)} tasks, for agents to run in')}",
        f"license = {_toml(env.manifest.license)}", f"base = {_toml('hub:' + ref)}",
        f"setup = {_toml(list(agent.install))}", f"network = {_toml(list(agent.network))}",
        "setup_timeout_s = 1800", 'private = "private"', "",
        "[env]", f"entry_point = {_toml('rockroll.gem.swe:SWEEnv')}", "", *snapshots,
    ]
    with tempfile.TemporaryDirectory(prefix="rockroll-swe-agent-") as tmp:
        (Path(tmp) / "rockenv.toml").write_text("\n".join(manifest))
        (Path(tmp) / "private").mkdir()
        (Path(tmp) / "private" / TASKS_FILE).write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
        say(f"building {out}: {ref} + {agent.name} ({len(tasks)} task snapshots)")
        created = publish(build(tmp, hub=hub, log=say).manifest, store).created
    say(f"{out}: published on {hub}")
    return BuiltEnv(agent.name, out, created, len(tasks))
