"""The fenced code blocks of the README and docs/, and the runner that plays one file's blocks
in order (``python -P _docblocks.py BLOCKS.json``, started by ``test_docs_blocks.py``).

A block's info string says what it is: ``python`` blocks run, all of one file in one
interpreter and one namespace (a later block may use what an earlier one defined);
``bash``/``sh``/``shell`` blocks run with ``bash -euo pipefail`` between them, in the same
order; ``toml``/``yaml``/``json`` blocks must parse; ``text`` is output or a drawing. The
line before a block (blank lines aside) may say how to check it instead:

- ``<!-- doc-test: skip REASON -->``: not run; the reason is required (and, when it names a
  ``tests/...`` file, that file must exist: the commands are run there instead).
- ``<!-- doc-test: same-as PATH -->``: the block is the file PATH of the checkout, verbatim.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

RUN = {"python": "python", "bash": "shell", "sh": "shell", "shell": "shell"}
PARSE = ("toml", "yaml", "json")
LANGS = (*RUN, *PARSE, "text")
_OPEN = re.compile(r"^( *)(`{3,}|~{3,})\s*([^\s`]*)")
_MARK = re.compile(r"^<!--\s*doc-test:\s*(\S+)\s*(.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    file: str  # relative to the checkout
    line: int  # of the opening fence (1-based)
    lang: str
    code: str
    mark: str = ""  # "", "skip" or "same-as"
    arg: str = ""  # the skip's reason, the same-as path

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


def blocks(path: Path, root: Path) -> list[Block]:
    """The fenced blocks of one Markdown file (CommonMark fences: a block closes at a line of
    only the fence character, at least as long as the opening one, so a ```` ``` ```` inside
    a line of code does not close it)."""
    lines = path.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        m = _OPEN.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = len(m.group(1)), m.group(2), m.group(3)
        close = re.compile(rf"^ *{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        j = i + 1
        while j < len(lines) and not close.match(lines[j]):
            j += 1
        body = "\n".join(l[indent:] if l[:indent].strip() == "" else l for l in lines[i + 1:j])
        k = i - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        mark = _MARK.match(lines[k].strip()) if k >= 0 else None
        out.append(Block(str(path.relative_to(root)), i + 1, lang, body + "\n",
                         *((mark.group(1), mark.group(2)) if mark else ("", ""))))
        i = j + 1
    return out


def run(blocks_json: str) -> int:
    """Play the runnable blocks of one file in order; 1 at the first that fails."""
    namespace: dict = {"__name__": "__main__"}
    for b in (Block(**d) for d in json.loads(Path(blocks_json).read_text())):
        print(f"### {b.where} ({b.lang})", flush=True)
        if RUN[b.lang] == "python":
            try:  # padded, so a traceback names the line of the Markdown file
                exec(compile("\n" * b.line + b.code, b.file, "exec"), namespace)
            except BaseException:  # noqa: BLE001 - a SystemExit of a block fails it too
                traceback.print_exc()
                print(f"FAILED: the python block at {b.where}", file=sys.stderr)
                return 1
        else:
            sys.stdout.flush()
            sys.stderr.flush()
            rc = subprocess.run(["bash", "-euo", "pipefail", "-c", b.code]).returncode
            if rc:
                print(f"FAILED: the shell block at {b.where} exited {rc}", file=sys.stderr)
                return 1
    return 0


def to_json(chosen: list[Block]) -> str:
    return json.dumps([asdict(b) for b in chosen])


if __name__ == "__main__":
    sys.exit(run(sys.argv[1]))
