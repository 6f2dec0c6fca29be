"""The package indexes a build may name by role instead of by host: ``"@pip"`` and ``"@apt"``
in a package's ``network = [...]`` stand for the hosts this machine's pip and apt install
from, read at build time. A package then ships no mirror's name, and a build behind a
company mirror allows that mirror, not the public index.

- ``@pip``: the http(s) hosts of pip's ``index-url`` and ``extra-index-url`` (its config
  files and ``PIP_*`` variables, as ``pip config list`` shows them); where no ``index-url``
  is set, pip's own default index and the host its files are served from (read from pip).
- ``@apt``: the http(s) hosts of the apt sources (one-line and deb822 files).
"""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Iterable, Sequence
from urllib.parse import urlsplit

from ..sandbox.deployment.images import APT_SOURCE_FILES, apt_source_entries, read_apt_sources

ROLES = ("@pip", "@apt")
_URL = re.compile(r"\bhttps?://[^\s'\"]+")


def url_hosts(text: str) -> list[str]:
    """The host names of every http(s) URL in ``text``, in order, once each. Pure function."""
    out: list[str] = []
    for url in _URL.findall(text):
        host = (urlsplit(url).hostname or "").lower()
        if host and host not in out:
            out.append(host)
    return out


def pip_config_hosts(config_list: str) -> tuple[list[str], bool]:
    """From ``pip config list`` output: the hosts of its index URLs, and whether an
    ``index-url`` (which replaces pip's default index) is set. Pure function."""
    hosts: list[str] = []
    replaced = False
    for line in config_list.splitlines():
        key, _, value = line.partition("=")
        option = key.rsplit(".", 1)[-1]
        if option not in ("index-url", "extra-index-url"):
            continue
        replaced |= option == "index-url"
        hosts += [h for h in url_hosts(value) if h not in hosts]
    return hosts, replaced


def pip_hosts() -> list[str]:
    """The hosts this machine's pip installs from (see the module's docstring)."""
    proc = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True)
    hosts, replaced = pip_config_hosts(proc.stdout if proc.returncode == 0 else "")
    if not replaced:
        hosts = [h for h in pip_default_hosts() if h not in hosts] + hosts
    return hosts


def pip_default_hosts() -> list[str]:
    """pip's default index: its page's host and its files' host, read from pip itself — in a
    child process: importing pip's internals here imports the stdlib's distutils, and a later
    ``import setuptools`` (DeepSpeed's op builder) then fails its distutils check."""
    code = "from pip._internal.models.index import PyPI; print(PyPI.netloc, PyPI.file_storage_domain)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return proc.stdout.split() if proc.returncode == 0 else []


def apt_hosts(patterns: Sequence[str] = APT_SOURCE_FILES) -> list[str]:
    """The hosts of this machine's apt sources (their ``deb`` entries, either format)."""
    hosts: list[str] = []
    for uri, _ in apt_source_entries(read_apt_sources(patterns)[0]):
        hosts += [h for h in url_hosts(uri) if h not in hosts]
    return hosts


def expand(names: Iterable[str]) -> tuple[str, ...]:
    """``names`` with each role replaced by its hosts (in order, once each)."""
    out: list[str] = []
    for name in names:
        for host in (pip_hosts() if name == "@pip" else apt_hosts() if name == "@apt" else [name]):
            if host not in out:
                out.append(host)
    return tuple(out)
