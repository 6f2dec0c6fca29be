"""``rock/WebShop-v0``: buy what an instruction asks for, in a web shop served inside the sandbox.

The third of ROLL's agentic envs (with Sokoban and FrozenLake), after WebShop (Yao et al.,
2022). The shop is a real web app, :mod:`rockroll.gem.webshop_site.server`, started in
the episode's sandbox and reached over the sandbox's loopback (the sandbox has no network):
the env is the browser. It GETs a page with a few lines of bash (``/dev/tcp``) through the
sandbox's exec, turns the HTML into WebShop's text observation (each clickable in
``[brackets]``) and follows the link the agent clicks.

Actions are WebShop's: ``search[keywords]`` on a page with a search box, ``click[text]`` on
any bracketed item (a product's asin, an option value, ``Back to Search``, ``Next >``,
``< Prev``, ``Description``, ``Features``, ``Reviews``, ``Buy Now``); case does not matter, and
the last ``search[...]``/``click[...]`` of a reply counts. Anything else is WebShop's invalid
action: the page stays, plus the GEM base's format penalty (``info["format_error"]``).
``Buy Now`` ends the episode with WebShop's reward (:mod:`rockroll.gem.webshop_site.reward`:
attribute, option and price terms times the type match); ``info["success"]`` is reward 1.0.

Tasks are integers (:mod:`rockroll.gem.webshop_site.catalog`): ids ``0..499`` are the
held-out test split, whose target products no training id ever targets; ``reset(seed=...)``
draws from ``split``'s ids. The catalogue (``num_products``, ``catalog_seed``) is built into
an SQLite database once per process in a sandbox, which is then snapshotted: every episode's
sandbox starts from that snapshot and only starts the server.
"""

from __future__ import annotations

import asyncio
import functools
import json
import numbers
import re
import shlex
from dataclasses import dataclass
from html.parser import HTMLParser
from importlib import resources
from typing import Any, ClassVar, Sequence
from urllib.parse import parse_qs, urlencode, urlsplit

from rockroll.sandbox import AsyncSandbox, SandboxSpec

from .core import InfraError
from .tools import ENV_SESSION, SandboxToolEnv
from .webshop_site.catalog import TEST_TASKS, generate_catalog, make_goal, task_split, words
from .webshop_site.reward import get_reward

__all__ = ["ACCEPTED_FORMATS", "Page", "WebShopEnv", "WebShopTask", "page_from_html", "parse_webshop_action"]

SITE_DIR = "/opt/webshop"  # the server's code and database in the sandbox
DB_PATH = f"{SITE_DIR}/shop.db"
PORT = 3000  # every sandbox has its own loopback, so one port for all
ACCEPTED_FORMATS = [
    "search[keywords]: search the shop (on a page with a search box)",
    "click[item]: click an item shown in [brackets], e.g. click[Buy Now] or click[Next >]",
]
_ACTION = re.compile(r"\b(search|click)\[([^\[\]\n]+)\]", re.IGNORECASE)

@dataclass(frozen=True)
class WebShopTask:
    """A task: its integer id (the goal is drawn from it, :func:`.catalog.make_goal`)."""

    id: int


class _TaskIds(Sequence):
    """A range of task ids as tasks, without making them all (training ids are many)."""

    def __init__(self, ids: Sequence[int]):
        self.ids = ids

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i):  # type: ignore[override]
        return WebShopTask(self.ids[i])


# ---- pages -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Page:
    """A page as WebShop's text mode sees it: its text with the clickables in brackets, and
    each clickable's lower-cased text -> the link it follows."""

    url: str
    text: str
    clickables: dict[str, str]
    search_url: str | None  # the search form's action, on a page with a search box

    @property
    def kind(self) -> str:
        """``start``, ``search``, ``item``, ``sub`` or ``done``."""
        parts = urlsplit(self.url).path.strip("/").split("/")
        return parts[1] if len(parts) > 1 else "start"


class _PageParser(HTMLParser):
    _BLOCKS = {"div", "p", "h1", "h2", "h3", "h4", "li", "ul", "form", "br", "tr"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.lines: list[str] = []
        self.line: list[str] = []
        self.href: str | None = None
        self.link_text: list[str] = []
        self.in_button = False
        self.clickables: dict[str, str] = {}
        self.search_url: str | None = None
        self.skip = 0

    def _flush(self) -> None:
        text = " ".join(self.line).strip()
        if text:
            self.lines.append(text)
        self.line = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag in ("head", "script", "style"):
            self.skip += 1
        elif tag == "a":
            self.href, self.link_text = a.get("href") or "", []
        elif tag == "form":
            self.search_url = a.get("action")
        elif tag == "button":
            self.in_button, self.link_text = True, []
        elif tag in self._BLOCKS:
            self._flush()

    def handle_endtag(self, tag: str) -> None:
        if tag in ("head", "script", "style"):
            self.skip -= 1
        elif tag == "a" and self.href is not None:
            text = " ".join("".join(self.link_text).split())
            self.clickables[text.lower()] = self.href
            self.line.append(f"[{text}]")
            self.href = None
        elif tag == "button":
            text = " ".join("".join(self.link_text).split())
            self.line.append(f"[{text}]")
            self.in_button = False
        elif tag in self._BLOCKS:
            self._flush()

    def handle_data(self, data: str) -> None:
        if self.skip:
            return
        if self.href is not None or self.in_button:
            self.link_text.append(data)
        elif data.strip():
            self.line.append(" ".join(data.split()))


def page_from_html(url: str, body: str) -> Page:
    """WebShop's text observation of an HTML page, and its clickables."""
    parser = _PageParser()
    parser.feed(body)
    parser.close()
    parser._flush()
    return Page(url, "\n".join(parser.lines), parser.clickables, parser.search_url)


def parse_webshop_action(text: str) -> tuple[str, str] | None:
    """``("search" | "click", argument)`` of the last such action in ``text``, or None."""
    found = _ACTION.findall(text)
    if not found:
        return None
    name, arg = found[-1]
    return name.lower(), arg.strip()


# ---- the catalogue on the host -----------------------------------------------------------------
@functools.lru_cache(maxsize=4)
def _catalog(seed: int, num_products: int) -> tuple[list[dict], dict[str, dict]]:
    products = generate_catalog(seed, num_products)
    return products, {p["asin"]: p for p in products}


# ---- the prepared snapshot: the shop's code and database, built once per process ---------------
_PREPARED: dict[str, str] = {}
_PREPARING: dict[str, asyncio.Lock] = {}


SITE_FILES = ("__init__.py", "catalog.py", "reward.py", "server.py", "start.sh", "get.sh")


def _site_files() -> dict[str, str]:
    pkg = resources.files(__package__) / "webshop_site"
    return {name: (pkg / name).read_text() for name in SITE_FILES}


def _server_args(seed: int, num_products: int) -> str:
    return f"--db {DB_PATH} --seed {seed} --products {num_products}"


async def prepared_snapshot(spec: SandboxSpec, seed: int, num_products: int) -> str:
    """The digest of a sandbox of ``spec`` holding the shop's code and database (made once per
    process and arguments, on the engine's loop)."""
    key = json.dumps([spec.to_dict(), seed, num_products], sort_keys=True)
    if key in _PREPARED:
        return _PREPARED[key]
    lock = _PREPARING.setdefault(key, asyncio.Lock())
    async with lock:
        if key not in _PREPARED:
            sandbox = await AsyncSandbox.create(spec)
            try:
                for name, text in _site_files().items():  # (a hub image of this env has them already)
                    await sandbox.write_file(f"{SITE_DIR}/webshop_site/{name}", text)
                result = await sandbox.run(
                    f"cd {SITE_DIR} && python3 -m webshop_site.server {_server_args(seed, num_products)} --build-only",
                    timeout=600)
                if not result.ok:
                    raise InfraError(f"building the shop failed (exit {result.exit_code}): {result.stderr[-2000:]}")
                _PREPARED[key] = (await sandbox.snapshot()).digest
            finally:
                await sandbox.close()
    return _PREPARED[key]


# ---- the env -----------------------------------------------------------------------------------
class WebShopEnv(SandboxToolEnv):
    """WebShop in a sandbox; see the module docstring.

    ``split``: ``"train"`` (ids ``500 .. 500 + num_train_tasks - 1``) or ``"test"`` (``0..499``,
    held out) is what ``reset(seed=...)`` draws from; ``task_ids=[...]`` narrows it to a list.
    ``reset(options={"task_id": i})`` plays any id ``i >= 0``. ``num_products`` and
    ``catalog_seed`` make the catalogue; ``image`` (or ``sandbox_spec``) the sandbox, whose
    ``python3`` must have sqlite3 with FTS5 (Debian's and the host image's do).
    """

    #: the replies a noisy expert draws from (``rockroll sft``): moves it can recover from
    action_words: ClassVar[tuple[str, ...]] = ("click[Back to Search]", "click[< Prev]", "click[Next >]",
                                                "click[Description]", "click[Features]", "click[Reviews]")

    def __init__(self, *, split: str = "train", task_ids: Sequence[int] | None = None, num_train_tasks: int = 10_000,
                 num_products: int = 3000, catalog_seed: int = 0, image: str | None = None,
                 sandbox_spec: SandboxSpec | None = None, max_turns: int = 15, max_obs_chars: int = 8192,
                 **kwargs: Any):
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        if task_ids is not None:
            if isinstance(task_ids, (str, int)):
                raise TypeError(f"task_ids must be a list of task ids (ints), got {task_ids!r}")
            ids: Sequence[int] = [self._check_id(t, "task_ids") for t in task_ids]
        else:
            ids = range(TEST_TASKS) if split == "test" else range(TEST_TASKS, TEST_TASKS + int(num_train_tasks))
        if sandbox_spec is None:
            sandbox_spec = SandboxSpec(image=image) if image else SandboxSpec()
        super().__init__(_TaskIds(ids), sandbox_spec=sandbox_spec, max_turns=max_turns, max_obs_chars=max_obs_chars,
                         **kwargs)
        self.split = split
        self.num_products, self.catalog_seed = int(num_products), int(catalog_seed)
        self.products, self.by_asin = _catalog(self.catalog_seed, self.num_products)
        self.goal: dict[str, Any] = {}
        self.page: Page | None = None
        self.searches = 0
        self._snapshot: str | None = None
        self._resumed_page: Page | None = None

    # ---- tasks ------------------------------------------------------------------------------
    @staticmethod
    def _check_id(task_id: Any, field: str = "task_id") -> int:
        """``task_id`` as an int: ``TypeError`` for a non-integer, ``ValueError`` for a negative one."""
        if isinstance(task_id, bool) or not isinstance(task_id, numbers.Integral):
            raise TypeError(f"{field}: a WebShop task id is an int >= 0 (ids 0..{TEST_TASKS - 1} are held out), "
                            f"got a {type(task_id).__name__}: {task_id!r}")
        if task_id < 0:
            raise ValueError(f"{field}: a WebShop task id is an int >= 0, got {task_id}")
        return int(task_id)

    @property
    def task_ids(self) -> list[int]:
        return list(self.tasks.ids)  # type: ignore[attr-defined]

    def _task_by_id(self, task_id: Any) -> WebShopTask:
        return WebShopTask(self._check_id(task_id))

    # ---- the sandbox's shop ------------------------------------------------------------------
    def _pool_for(self, task: Any) -> tuple[SandboxSpec, int, str | None]:
        return self.sandbox_spec, self.pool_size, self._snapshot

    async def _acquire(self, task: Any) -> AsyncSandbox:
        self._snapshot = await prepared_snapshot(self.sandbox_spec, self.catalog_seed, self.num_products)
        return await super()._acquire(task)

    async def _start_server(self, sandbox: AsyncSandbox) -> None:
        args = _server_args(self.catalog_seed, self.num_products)
        result = await self._run(sandbox, f"bash {SITE_DIR}/webshop_site/start.sh {PORT} {args}", timeout=180,
                                 session=ENV_SESSION)
        if not result.ok:
            raise InfraError(f"the shop did not start (exit {result.exit_code}): {result.stderr[-2000:]}")

    async def _get(self, url: str) -> Page:
        """GET ``url`` from the shop in the sandbox: a real HTTP request over its loopback."""
        result = await self._run(self._lease.sandbox, f"bash {SITE_DIR}/webshop_site/get.sh {PORT} {shlex.quote(url)}",
                                 timeout=self.step_timeout, session=ENV_SESSION)
        head, _, body = result.stdout.partition("\r\n\r\n")
        status = head.split(" ", 2)[1] if head.startswith("HTTP/") else ""
        if not result.ok or status != "200":
            raise InfraError(f"GET {url} from the shop failed (exit {result.exit_code}, status {status or 'none'}): "
                             f"{(result.stderr or head)[-500:]}")
        return page_from_html(url, body)

    def _intro(self) -> str:
        formats = "\n".join(f"- {f}" for f in ACCEPTED_FORMATS)
        return ("You are shopping in WebShop. Find and buy the product the instruction asks for: pick its "
                "options on the product page, then click[Buy Now].\nReply with one action a turn:\n"
                f"{formats}\n\n")

    async def _setup(self, sandbox: AsyncSandbox, task: WebShopTask) -> str:
        self.goal = make_goal(self.products, task.id, self.catalog_seed)
        self.searches = 0
        await self._start_server(sandbox)
        self.page = await self._get(f"/{task.id}")
        return self._intro() + self.page.text

    async def _resume(self, env_state: dict[str, Any]) -> bool:
        await super()._resume(env_state)
        await self._start_server(self._lease.sandbox)
        self._resumed_page = await self._get(env_state["url"])
        return True

    def agent_instruction(self, task: WebShopTask) -> str:
        return make_goal(self.products, task.id, self.catalog_seed)["instruction_text"]

    # ---- steps -------------------------------------------------------------------------------
    async def _act(self, text: str) -> tuple[str, float, bool, dict[str, Any]]:
        page = self.page
        action = parse_webshop_action(text)
        if action is None:
            return self._invalid("no search[...] or click[...] action in the reply")
        name, arg = action
        if name == "search":
            if page.search_url is None:
                return self._invalid("there is no search box on this page: click[Back to Search] first")
            if not words(arg):
                return self._invalid("search[...] needs keywords")
            self.searches += 1
            url = f"{page.search_url}?{urlencode({'q': arg.lower(), 'page': 1})}"
        else:
            url = page.clickables.get(arg.lower())
            if url is None:
                return self._invalid(f"{arg!r} is not a clickable item of this page")
        self.page = await self._get(url)
        if self.page.kind != "done":
            return self.page.text, 0.0, False, {"page": self.page.kind}
        reward, terms = self.grade(self.page.url)
        return self.page.text, reward, True, {"page": "done", "success": reward >= 1.0, "reward_terms": terms,
                                              "purchased": self._product_at(self.page.url)[0]["asin"]}

    def _invalid(self, why: str) -> tuple[str, float, bool, dict[str, Any]]:
        obs, reward, terminated, info = self._format_error(why, ACCEPTED_FORMATS)
        return f"{obs}\n\n{self.page.text}", reward, terminated, {**info, "page": self.page.kind}

    def _product_at(self, url: str) -> tuple[dict, dict[str, str]]:
        """The product of an item or done page's url, and the options it carries."""
        parts = urlsplit(url)
        asin = parts.path.rstrip("/").rsplit("/", 1)[-1]
        opt = parse_qs(parts.query).get("opt", ["{}"])[-1]
        return self.by_asin[asin], json.loads(opt)

    def grade(self, done_url: str) -> tuple[float, dict[str, Any]]:
        """WebShop's reward of the purchase a done page's url names, and its terms."""
        product, options = self._product_at(done_url)
        return get_reward(product, self.goal, product["price"], options)

    # ---- the expert -----------------------------------------------------------------------------
    def _fits(self, product: dict) -> bool:
        """Whether buying ``product`` (with the goal's options where it has them) scores 1."""
        opts = {k: v for k, v in self.goal["goal_options"].items() if v in product["options"].get(k, [])}
        return get_reward(product, self.goal, product["price"], opts)[0] >= 1.0

    def expert_action(self) -> str:
        """What an expert clicks here: search the instruction's key terms, open the target (or
        any product that fully fits), pick the goal's options, buy. ``ValueError`` when the
        episode is over."""
        page = self.page
        if page is None or self._done or page.kind == "done":
            raise ValueError("no expert action: the episode is over")
        goal = self.goal
        if page.kind == "start":
            terms = [goal["query"], *goal["attributes"]] if self.searches == 0 else [goal["query"]]
            return f"search[{' '.join(dict.fromkeys(w for t in terms for w in t.split()))}]"
        if page.kind == "sub":
            return "click[< Prev]"
        if page.kind == "search":
            shown = [self.by_asin[c.upper()] for c in page.clickables if c.upper() in self.by_asin]
            for product in shown:
                if product["asin"] == goal["asin"]:
                    return f"click[{product['asin']}]"
            for product in shown:
                if self._fits(product):
                    return f"click[{product['asin']}]"
            if "next >" in page.clickables:
                return "click[Next >]"
            return "click[Back to Search]"
        product, chosen = self._product_at(page.url)  # an item page: the product, the options chosen
        if product["asin"] != goal["asin"] and not self._fits(product):
            return "click[< Prev]"
        for name, value in goal["goal_options"].items():
            if chosen.get(name) != value and value in product["options"].get(name, []):
                return f"click[{value}]"
        return "click[Buy Now]"

    # ---- save / resume ---------------------------------------------------------------------------
    def _get_state(self) -> dict[str, Any]:
        return {**super()._get_state(), "url": self.page.url, "searches": self.searches}

    def _set_state(self, state: dict[str, Any]) -> None:
        super()._set_state(state)
        self.goal = make_goal(self.products, self.task.id, self.catalog_seed)
        self.page, self._resumed_page = self._resumed_page, None
        self.searches = int(state["searches"])

    def split_of(self, task_id: int) -> str:
        """``"test"`` (held out) or ``"train"``."""
        return task_split(self._check_id(task_id))
