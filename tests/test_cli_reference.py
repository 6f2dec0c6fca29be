"""docs/cli.md is the ``rockroll`` click group's own reference (issue #53): generated from it by
scripts/cli_reference.py, as docs/config.md is from the config dataclasses, so a command, an
option or a help text cannot change without the page."""

from __future__ import annotations

import difflib
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from rockroll.cli import main

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("cli_reference", ROOT / "scripts" / "cli_reference.py")
cli_reference = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cli_reference)


def test_docs_cli_md_is_the_generators_output():
    want, have = cli_reference.cli_reference(), (ROOT / cli_reference.DOC_PATH).read_text()
    diff = "".join(list(difflib.unified_diff(have.splitlines(True), want.splitlines(True), "docs/cli.md",
                                             "generated"))[:60])
    assert have == want, f"docs/cli.md is stale: run `python scripts/cli_reference.py`\n{diff}"


def test_every_command_is_on_the_page_as_its_help_prints_it():
    """Each section is what ``rockroll ... --help`` prints in a terminal, word for word (one
    command as a real process; the rest in-process at the width click gives a terminal of 80
    columns or more: CliRunner alone would force 80), and every command and group of the click
    tree has one."""
    page = (ROOT / cli_reference.DOC_PATH).read_text()
    sections = dict(re.findall(r"^#+ `(rockroll[^`]*)`\n\n```text\n(.*?)\n```$", page, re.M | re.S))
    paths = [" ".join(path) for path, _, _ in cli_reference.commands(main)]
    assert sorted(sections) == sorted(paths) and {"rockroll train", "rockroll hub publish",
                                                  "rockroll sandbox image build"} <= set(paths)
    rockroll = Path(sys.executable).parent / "rockroll"
    real = subprocess.run([str(rockroll), "hub", "gc", "--help"], capture_output=True, text=True, check=True,
                          env={**os.environ, "COLUMNS": "200"})
    assert real.stdout.rstrip() == sections["rockroll hub gc"]
    runner = CliRunner()
    for path in paths:
        result = runner.invoke(main, [*path.split()[1:], "--help"], prog_name="rockroll",
                               terminal_width=cli_reference.WIDTH)
        assert result.exit_code == 0, (path, result.output)
        assert result.output.rstrip() == sections[path], path
