"""MkDocs hooks of the docs site (mkdocs.yml ``hooks:``; ``make docs``, tests/test_docs_site.py).

1. The API pages: mkdocstrings finds modules by their folder, and ``rockroll.sandbox`` lives in
   ``sandbox/`` (pyproject's package-dir), so a tree of links shaped like the package
   (``build/docs-api/rockroll/sandbox -> sandbox/``) is what it reads, statically: no import.
2. Links out of docs/: the guides link the repository's files (``../bench/README.md#lora``,
   ``../examples/envs/logquiz``), right on a repository browser. The site carries each such file
   under ``repo/`` (a Markdown file as a page outside the nav, a folder as its README or a list
   of its files, anything else as is) and the link is pointed there, so mkdocs checks it like
   any other: a missing file or anchor fails the strict build. Followed from page to page.
"""

from __future__ import annotations

import os
import posixpath
import re
from pathlib import Path

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files, InclusionLevel

ROOT = Path(__file__).resolve().parent.parent
API_TREE = ROOT / "build" / "docs-api"
PREFIX = "repo/"
_LINK = re.compile(r"(!?\[[^\]]*\]\()(<[^>]*>|[^)\s]+)")
_FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
_SKIP_DIRS = {"__pycache__", ".pytest_cache"}


@event_priority(100)  # before mkdocstrings reads its paths
def on_config(config):
    pkg = API_TREE / "rockroll"
    pkg.mkdir(parents=True, exist_ok=True)
    mapping = {p.name: p for p in (ROOT / "rockroll").iterdir() if p.name not in _SKIP_DIRS}
    mapping.update({name: ROOT / name for name in ("sandbox", "envhub", "gem", "registry", "trainer")})
    for name, target in mapping.items():
        link = pkg / name
        if link.is_symlink() and Path(os.readlink(link)) == target:
            continue
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target)
    return config


def _outside(text: str):
    """(start, end, url) of each link target outside fenced code blocks."""
    pos, fence = 0, None
    for line in text.splitlines(keepends=True):
        m = _FENCE.match(line)
        if fence:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not line.strip()[len(m.group(1)):]:
                fence = None
        elif m:
            fence = m.group(1)
        else:
            for lm in _LINK.finditer(line):
                url = lm.group(2).strip("<>")
                yield pos + lm.start(2), pos + lm.end(2), url
        pos += len(line)


def _real(src_uri: str, docs_dir: Path) -> Path:
    """The checkout's file behind a site path."""
    return ROOT / src_uri[len(PREFIX):] if src_uri.startswith(PREFIX) else docs_dir / src_uri


def _site_uri(target: Path, docs_dir: Path) -> str | None:
    """The site path of a checkout file or folder (None: not in the checkout or not there)."""
    if not target.exists():
        return None
    if target.is_relative_to(docs_dir):
        return target.relative_to(docs_dir).as_posix()
    if not target.is_relative_to(ROOT):
        return None
    rel = target.relative_to(ROOT).as_posix()
    if target.is_dir():
        return PREFIX + rel + ("/README.md" if (target / "README.md").is_file() else "/index.md")
    return PREFIX + rel


def _retarget(url: str, page_uri: str, docs_dir: Path) -> str | None:
    """The link rewritten to the site's copy, or None when mkdocs should judge it as it is."""
    if re.match(r"^[a-z][a-z0-9+.-]*:|^/|^#", url, re.I) or not url:
        return None
    path, _, anchor = url.partition("#")
    target = Path(os.path.normpath(_real(page_uri, docs_dir).parent / path))
    uri = _site_uri(target, docs_dir)
    if uri is None:
        return None
    new = posixpath.relpath(uri, posixpath.dirname(page_uri) or ".")
    return new + (f"#{anchor}" if anchor else "")


def _listing(folder: Path) -> tuple[str, list[Path]]:
    files = sorted(p for p in folder.rglob("*") if p.is_file() and not _SKIP_DIRS & set(p.parts))
    rel = folder.relative_to(ROOT).as_posix()
    lines = [f"# `{rel}/`", "", "The files of this folder of the repository:", ""]
    lines += [f"- [`{p.relative_to(folder).as_posix()}`]({p.relative_to(folder).as_posix()})" for p in files]
    return "\n".join(lines) + "\n", files


def on_files(files: Files, config) -> Files:
    docs_dir = Path(config["docs_dir"]).resolve()
    todo = [f.src_uri for f in files.documentation_pages()]
    seen = set(todo)

    def add(uri: str, **kw) -> None:
        f = File.generated(config, uri, **kw)
        f.inclusion = InclusionLevel.NOT_IN_NAV
        files.append(f)
        seen.add(uri)
        if uri.endswith(".md"):
            todo.append(uri)

    while todo:
        uri = todo.pop()
        real = _real(uri, docs_dir)
        text = real.read_text() if real.is_file() else next(
            f.content_string for f in files if f.src_uri == uri)
        for _, _, url in _outside(text):
            new = _retarget(url, uri, docs_dir)
            if new is None:
                continue
            target_uri = posixpath.normpath(posixpath.join(posixpath.dirname(uri), new.partition("#")[0]))
            if target_uri in seen or not target_uri.startswith(PREFIX):
                continue
            real_target = _real(target_uri, docs_dir)
            if real_target.is_file():
                add(target_uri, abs_src_path=str(real_target))
            else:  # a folder without a README: a page listing its files
                content, listed = _listing(real_target.parent)
                add(target_uri, content=content)
                for p in listed:
                    u = PREFIX + p.relative_to(ROOT).as_posix()
                    if u not in seen:
                        add(u, abs_src_path=str(p))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    docs_dir = Path(config["docs_dir"]).resolve()
    out, last = [], 0
    for start, end, url in _outside(markdown):
        new = _retarget(url, page.file.src_uri, docs_dir)
        if new is not None and new != url:
            out += [markdown[last:start], new]
            last = end
    return "".join(out) + markdown[last:]
