"""Every benchmark of bench/ runs to its end in its smallest settings and writes its JSON with
every row it promises (issue #39: bench/hub.py stopped at its build for weeks and nothing
said so). Each runs as the README tells a user to run it, ``rockroll bench run NAME --quick``
(a real subprocess), with its JSON sent to ``tmp_path`` (``ROCKROLL_BENCH_RESULTS``) so a test
never overwrites a real run's results.

What a script promises is its ``PROMISED`` constant (a literal, read here without running the
script): ``{path: names}``, where ``path`` is a dotted key into the JSON (``""``: the top
level) and ``names`` are, for a list of rows, the rows' first columns in order (a label starts
with its name: ``"file bridge"`` matches ``"file bridge, poll 10.0 ms"``), for a dict, keys
that each hold a measurement (not None, not a string saying why nothing was measured).

No timing is asserted: the numbers are the benchmarks' business; that they exist is this
file's. The services a script needs are the suite's: the Docker engine (``scripts/services.sh``;
under CI a missing one fails, as tests/sandbox/conftest.py's ``client`` does), the default SWE
set (the ``swe_hub`` fixture), moto's server and Ray from the test extra (the scripts start
their own, on 127.0.0.1, and stop them).
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
CLI = [sys.executable, "-m", "rockroll.cli"]

# NAME -> what follows ``--quick``: the smallest settings of each (sizes where --quick alone
# is more than CI should pay). A benchmark missing here fails test_every_benchmark_has_a_smoke_run.
SMOKE: dict[str, list[str]] = {
    "hub": ["--mb", "2", "--starts", "2"],
    "rollout": ["--steps", "1", "--groups", "1"],
    "modelservice": ["--agents", "2"],
    "envs": ["--envs", "2"],
    "sandbox": ["--smoke"],
    "network": ["--connects", "5", "--mib", "2"],
    "terminal": ["--n", "3"],
    "lora": [],  # --quick: a tiny Llama (the real run loads SmolLM2-135M)
    "trl_grpo": [],  # --quick: a tiny Llama with SmolLM2's tokenizer, 2 steps an arm
    "generation": ["--episodes", "4"],  # --quick: the tiny Llama, the Transformers arms
    "runtimes": [],  # --quick: 5 boxes an arm
    "gpu": [],  # --quick: a tiny model on the CPU (the real run needs a GPU: scripts/gpu_check.sh)
    "cluster": ["--n", "4,8"],  # a two-node Ray cluster behind the service; the real bursts are 1,000 and 4,000
}
NEEDS_DOCKER = {"envs", "sandbox", "terminal"}
_RENDEZVOUS = {"MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE"}


def listed() -> list[str]:
    out = subprocess.run([*CLI, "bench", "list"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [line.split()[0] for line in out.stdout.splitlines()]


def promised(name: str) -> dict[str, tuple[str, ...]]:
    """The script's ``PROMISED`` literal, read from its source."""
    tree = ast.parse((BENCH / f"{name}.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["PROMISED"]:
            return ast.literal_eval(node.value)
    raise AssertionError(f"bench/{name}.py has no PROMISED = {{...}} literal: say which rows its JSON holds")


def at(payload: dict, path: str):
    value = payload
    for key in filter(None, path.split(".")):
        if not (isinstance(value, dict) and key in value):
            raise LookupError(f"no {path!r} in the JSON")
        value = value[key]
    return value


def broken_promises(payload: dict, promises: dict[str, tuple[str, ...]]) -> list[str]:
    """What of ``promises`` the JSON ``payload`` lacks (empty: all kept)."""
    broken = []
    for path, names in promises.items():
        try:
            value = at(payload, path)
        except LookupError as e:
            broken.append(str(e))
            continue
        if isinstance(value, list):
            labels = [str(next(iter(row.values()))) if isinstance(row, dict) and row else repr(row) for row in value]
            if len(labels) != len(names) or not all(l.startswith(n) for l, n in zip(labels, names)):
                broken.append(f"{path!r}: rows {labels}, promised {list(names)}")
        elif isinstance(value, dict):
            for n in names:
                if value.get(n) is None or isinstance(value[n], str):
                    broken.append(f"{path or 'top level'}[{n!r}] not measured: {value.get(n)!r}")
        else:
            broken.append(f"{path!r} is {value!r}, not rows or a dict")
    return broken


def test_promises_are_checked_row_by_row():
    """The checker itself: a dropped, renamed, reordered or unmeasured row is each caught."""
    rows = {"t": [{"what": "a, 1 x"}, {"what": "b"}], "d": {"k": 1.0, "why": "no engine"}}
    assert broken_promises(rows, {"t": ("a", "b"), "d": ("k",), "": ("t",)}) == []
    assert broken_promises(rows, {"t": ("a",)})                       # a row more than promised
    assert broken_promises(rows, {"t": ("a", "b", "c")})              # a row dropped
    assert broken_promises(rows, {"t": ("b", "a")})                   # reordered
    assert broken_promises(rows, {"d": ("why",)})                     # a reason, not a number
    assert broken_promises(rows, {"d": ("gone",)}) and broken_promises(rows, {"x.y": ("a",)})


def test_every_benchmark_has_a_smoke_run():
    """`rockroll bench list` (the scripts of bench/) is exactly what this file runs, and each
    says what its JSON holds."""
    names = listed()
    assert sorted(names) == sorted(SMOKE)
    for name in names:
        assert promised(name)


def test_bench_run_passes_everything_after_name_to_the_script():
    """`rockroll bench run NAME --help` is the script's help (its --quick among its options),
    not the CLI's: everything after NAME is the script's."""
    for name in SMOKE:
        out = subprocess.run([*CLI, "bench", "run", name, "--help"], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, (name, out.stderr[-2000:])
        assert out.stdout.startswith(f"usage: {name}.py") and "--quick" in out.stdout, (name, out.stdout)


def _docker_usable() -> None:
    why = None
    if shutil.which("docker") is None:
        why = "no docker CLI"
    elif subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode:
        why = "the Docker engine does not answer"
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the docker benchmarks, but {why} (scripts/services.sh starts it)")
        pytest.skip(why)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", sorted(SMOKE))
def test_benchmark_runs_and_keeps_its_promises(name, tmp_path, request):
    args = ["--quick", *SMOKE[name]]
    if name in NEEDS_DOCKER:
        _docker_usable()
    if name == "envs":
        args += ["--hub", request.getfixturevalue("swe_hub")]
    # the environment a user runs it in: without the torch.distributed rendezvous a DeepSpeed engine
    # of an earlier test set in this process (its MASTER_PORT is still bound here)
    env = {k: v for k, v in os.environ.items() if k not in _RENDEZVOUS}
    env.update(ROCKROLL_BENCH_RESULTS=str(tmp_path / "results"), PYTHONUNBUFFERED="1")
    out = subprocess.run([*CLI, "bench", "run", name, *args], capture_output=True, text=True, env=env,
                         timeout=840)
    assert out.returncode == 0, f"rockroll bench run {name} {' '.join(args)}: exit {out.returncode}\n" \
                                f"{out.stdout[-3000:]}\n{out.stderr[-5000:]}"
    path = tmp_path / "results" / f"{name}.json"
    assert path.is_file(), f"no {path.name} written; wrote {sorted(p.name for p in path.parent.glob('*'))}"
    payload = json.loads(path.read_text())
    assert payload["host"]["cpu_count"] and payload["host"]["timestamp"]
    assert broken_promises(payload, promised(name)) == []
    if name == "sandbox":  # it closes everything it made
        assert payload["cleanup"]["leftover_runs"] == [] and payload["cleanup"]["leftover_containers"] == []
