"""Every code block of the README, docs/ (its subfolders too), bench/ and the examples' READMEs is
checked (issue #18): the docs cannot drift from the code. Per Markdown file, its python and shell
blocks run in order in one interpreter (``_docblocks.py``), in a fresh folder holding a copy of
``examples/``, as a user who ran ``make demo`` would run them: the default SWE tasks on their hub
(``ROCKROLL_HUB``), and an S3 server (moto's, on 127.0.0.1) behind every ``s3://`` bucket the
file names. They run outside ``make``'s environment (issue #53): the variables the Makefile
exports (``ROCKROLL_BUILD_NETWORK=host``, which conftest.py also sets for the suite's own builds)
are taken out, so a block that would need them fails here as it would for a user. Config blocks
must parse. A block not run says why, right above it (``<!-- doc-test: skip REASON -->``);
nothing is skipped silently, under CI=true or not."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from _docblocks import LANGS, PARSE, RUN, Block, blocks, to_json

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), ROOT / "bench" / "README.md",
               *(ROOT / "examples").rglob("README.md")])
# What `make` exports for its recipes (the Makefile's `export` lines): a user running a page's
# example by hand has none of it.
MAKE_EXPORTS = tuple(re.findall(r"^export (\w+)", (ROOT / "Makefile").read_text(), re.M))
ALL = [b for doc in DOCS for b in blocks(doc, ROOT)]
MAX_SKIPS = 17
RUNNER = Path(__file__).resolve().parent / "_docblocks.py"


def runnable(doc: Path) -> list[Block]:
    return [b for b in blocks(doc, ROOT) if b.lang in RUN and b.mark != "skip"]


def test_every_block_is_known_and_every_skip_says_why():
    assert "ROCKROLL_BUILD_NETWORK" in MAKE_EXPORTS  # the blocks run without what make sets
    assert len(ALL) >= 40 and any(b.file == "docs/env-contract.md" for b in ALL)
    for b in ALL:
        assert b.lang in LANGS, f"{b.where}: info string {b.lang!r}: use one of {', '.join(LANGS)} (say what it is)"
        assert b.mark in ("", "skip", "same-as"), f"{b.where}: unknown doc-test mark {b.mark!r}"
        if b.mark == "skip":
            assert len(b.arg) >= 10, f"{b.where}: a skipped block says why: <!-- doc-test: skip REASON -->"
            for named in re.findall(r"tests/[\w/.-]+\.py", b.arg):
                assert (ROOT / named).is_file(), f"{b.where}: the skip names {named}, which does not exist"
    skipped = [b for b in ALL if b.mark == "skip"]
    # A ratchet: the exceptions (installs, minutes of training, this suite itself, calls a test
    # elsewhere makes against a service) stay few; a new one raises this number on purpose.
    assert len(skipped) <= MAX_SKIPS, "\n".join(f"{b.where}: {b.arg}" for b in skipped)


@pytest.mark.parametrize("block", [b for b in ALL if b.mark == "same-as"], ids=lambda b: b.where)
def test_a_block_shown_as_a_file_is_that_file(block):
    assert block.code == (ROOT / block.arg).read_text(), f"{block.where} differs from {block.arg}: copy it again"


@pytest.mark.parametrize("block", [b for b in ALL if b.lang in PARSE and b.mark != "skip"], ids=lambda b: b.where)
def test_config_blocks_parse(block):
    load = {"toml": tomllib.loads, "yaml": yaml.safe_load, "json": json.loads}[block.lang]
    assert load(block.code) is not None, f"{block.where} is empty"


def test_the_env_contract_runs_whole():
    """docs/env-contract.md is how a newcomer publishes an env (#18): none of its blocks may be
    skipped, and they build, publish to a folder and to S3, and make and play the env."""
    doc = [b for b in ALL if b.file == "docs/env-contract.md"]
    assert not [b for b in doc if b.mark == "skip"]
    code = "".join(b.code for b in doc if b.lang in RUN)
    for step in ("rockroll hub build examples/envs/logquiz", "rockroll hub publish examples/envs/logquiz --hub ./my-hub",
                 "--hub s3://", 'register_hub("./my-hub")', 'register_hub("s3://', 'gymnasium.make("rock/logquiz-v1"',
                 "env.step("):
        assert step in code, step


def test_the_agent_page_builds_its_agent():
    """docs/agents.md's packaging example failed as written outside ``make test`` (#53): its
    pip step had no network. The spec with its network runs here; the build (a pip install
    from the index inside a sandbox) and the training run are skipped, each naming the tests
    that build and train such a package."""
    doc = [b for b in ALL if b.file == "docs/agents.md"]
    code = "".join(b.code for b in doc if b.lang in RUN and b.mark != "skip")
    for step in ("python3 -m pip install", 'network=("@pip",)', "agent_package(spec, \"mover-pkg\""):
        assert step in code, step
    assert [b.code for b in doc if b.mark == "skip"] == [
        "cp examples/agents/mover.py mover-pkg/\nrockroll hub publish mover-pkg --hub ./my-hub     "
        "# builds it, then publishes rock/agent-mover-v1\n", "rockroll train mover.yaml\n"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3_endpoint():
    """moto's S3 server on 127.0.0.1 (the envhub tests' server, started for this module)."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=_free_port(), verbose=False)
    server.start()
    yield f"http://127.0.0.1:{server._port}"
    server.stop()


@pytest.mark.parametrize("doc", [d for d in DOCS if runnable(d)], ids=lambda d: str(d.relative_to(ROOT)))
def test_the_blocks_of_a_doc_run_in_order(doc, tmp_path, swe_hub, s3_endpoint):
    chosen = runnable(doc)
    shutil.copytree(ROOT / "examples", tmp_path / "examples", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "blocks.json").write_text(to_json(chosen))
    creds = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    buckets = sorted({m for b in chosen for m in re.findall(r"s3://([a-z0-9.-]+)", b.code)})
    if buckets:
        import boto3

        s3 = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1", aws_access_key_id="testing",
                          aws_secret_access_key="testing")
        for bucket in buckets:
            if bucket not in [b["Name"] for b in s3.list_buckets()["Buckets"]]:
                s3.create_bucket(Bucket=bucket)
    env = {**{k: v for k, v in os.environ.items() if k not in MAKE_EXPORTS}, **creds, "ROCKROLL_HUB": swe_hub,
           "ROCKROLL_S3_ENDPOINT": s3_endpoint, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, "-P", str(RUNNER), str(tmp_path / "blocks.json")], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-6000:]}\nstderr:\n{proc.stderr[-6000:]}"
    ran = re.findall(r"^### (\S+) ", proc.stdout, re.M)
    assert ran == [b.where for b in chosen], "every block ran, in order"


def test_blocks_are_read_as_commonmark_fences(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("text\n\n<!-- doc-test: skip needs a GPU to run -->\n\n```bash\nnvidia-smi\n```\n\n"
                   "1. a step\n\n   ```python\n   env.step(\"```bash\\nls\\n```\")\n   x = 1\n   ```\n\n"
                   "````text\n```\nnot a fence end\n````\n")
    found = blocks(doc, tmp_path)
    assert [(b.line, b.lang, b.mark, b.arg) for b in found] == [
        (5, "bash", "skip", "needs a GPU to run"), (11, "python", "", ""), (16, "text", "", "")]
    assert found[1].code == 'env.step("```bash\\nls\\n```")\nx = 1\n'  # indent gone, inner ``` kept
    assert found[2].code == "```\nnot a fence end\n"
