"""docs/config.md is the config dataclasses' own reference (issue #36): generated from them,
every key with a meaning, and the comment reader tested on the shapes the source uses."""

from __future__ import annotations

import difflib
import importlib.util
import re
import sys
from pathlib import Path

from rockroll.trainer.config import TrainConfig, config_to_dict
from rockroll.trainer.config_doc import DOC_PATH, config_reference, sections

ROOT = Path(__file__).resolve().parents[2]


def test_docs_config_md_is_the_generators_output():
    want, have = config_reference(), (ROOT / DOC_PATH).read_text()
    diff = "".join(list(difflib.unified_diff(have.splitlines(True), want.splitlines(True), DOC_PATH, "generated"))[:60])
    assert have == want, f"{DOC_PATH} is stale: run `python -m rockroll.trainer.config_doc`\n{diff}"


def test_every_key_has_a_meaning():
    missing = [f"{s.prefix}.{r.key}".lstrip(".") for s in sections() for r in s.rows if not r.meaning]
    assert not missing, ("config keys without a meaning: write a `# comment` beside each in trainer/config.py "
                         f"(what it is, its unit, when it is read): {', '.join(missing)}")


def test_every_key_the_loader_accepts_is_a_row():
    """Each leaf of a default config is a row of its section, and each link points at a heading."""
    rows = {f"{s.prefix}.{r.key}".lstrip(".") for s in sections() for r in s.rows}

    def leaves(d, prefix=""):
        for k, v in d.items():
            key = f"{prefix}.{k}".lstrip(".")
            if isinstance(v, dict) and key not in ("ray.roles",) and not key.endswith("kwargs"):
                yield from leaves(v, key)
            else:
                yield key

    cfg = config_to_dict(TrainConfig())
    cfg.pop("envs")
    assert set(leaves(cfg)) <= rows
    assert {"envs[].id", "envs[].task_ids", "ray.roles.<name>.colocate", "reward.verifiers[].fn",
            "tokenizer.add_tokens", "hubs"} <= rows
    doc = config_reference()
    anchors = {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in re.findall(r"^## (.+)$", doc, re.M)}
    links = set(re.findall(r"\]\(#([^)]+)\)", doc))
    assert links and links <= anchors, links - anchors


SOURCE = '''
from dataclasses import dataclass, field


@dataclass
class Inner:
    """An inner section, over
    two lines.

    Second ``paragraph``: :mod:`x.y`."""

    a: int = 1  # trailing
    #             and its continuation | with a pipe
    # a block above b,
    # two lines
    b: str = "x y"
    c: list[str] = field(default_factory=lambda: ["p", "q"])  # c's own <dir>, `<kept>`
    d: float | None = None


@dataclass
class Outer:
    inner: Inner = field(default_factory=Inner)  # the inner one
    items: list[Inner] = field(default_factory=list)  # entries
    named: dict[str, Inner] = field(default_factory=dict)  # by name
'''


def test_the_comment_reader_on_each_shape(tmp_path):
    path = tmp_path / "shapes_cfg.py"
    path.write_text(SOURCE)
    spec = importlib.util.spec_from_file_location("shapes_cfg", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["shapes_cfg"] = mod
    try:
        spec.loader.exec_module(mod)
        secs = {s.prefix: s for s in sections(mod.Outer)}
    finally:
        del sys.modules["shapes_cfg"]
    assert list(secs) == ["", "inner", "items[]", "named.<name>"]
    inner = {r.key: r for r in secs["inner"].rows}
    assert inner["a"].meaning == "trailing and its continuation | with a pipe"
    assert inner["b"].meaning == "a block above b, two lines" and inner["b"].default == "`'x y'`"
    assert inner["c"].meaning == "c's own \\<dir>, `<kept>`" and inner["c"].default == "`[p, q]`"
    assert inner["d"].meaning == "" and inner["d"].type == "float | None" and inner["d"].default == "`null`"
    assert secs["inner"].intro == "An inner section, over two lines.\n\nSecond `paragraph`: `x.y`."
    assert secs[""].intro == ""  # a dataclass without a docstring: not its generated signature
    outer = {r.key: r.default for r in secs[""].rows}
    assert outer == {"inner": "section [`inner`](#inner)", "items": "`[]`, entries: [`items[]`](#items)",
                     "named": "`{}`, entries: [`named.<name>`](#namedname)"}
