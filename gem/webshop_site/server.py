"""The shop's web server: WebShop's pages over HTTP, search ranked by SQLite FTS5's BM25.

Run inside the sandbox (standard library only)::

    python3 -m webshop_site.server --db /opt/webshop/shop.db --port 3000 [--build-only]

The first run builds the database from the catalogue (:func:`build_db`): a ``products``
table and an FTS5 index over each product's title, features, description and options.
Search is ``MATCH`` over the query's words OR-ed, ordered by ``bm25()`` -- the ranking of
WebShop's Lucene (pyserini) index, from a library every Python's ``sqlite3`` carries
(``build_db`` refuses one compiled without FTS5, saying so).

Pages (the session is the task id, first in every path, as WebShop's session id is):

====================================  =======================================================
``/<task>``                           the search page: the instruction and a search box
``/<task>/search?q=&page=``           10 results a page out of the top 50 (``Next >``/``< Prev``)
``/<task>/item/<asin>?q=&page=&opt=`` a product: its options, price, rating, and the buttons
                                      ``Description``, ``Features``, ``Reviews``, ``Buy Now``
``/<task>/sub/<asin>/<name>?...``     a product's Description, Features or Reviews page
``/<task>/done/<asin>?opt=``          the purchase and its score (WebShop's done page)
``/healthz``                          ``ok`` once the shop is loaded
====================================  =======================================================

The server holds no session state: a page's links carry the keywords, the results page and
the chosen options (``opt``, JSON), as WebShop's URLs do. Every clickable is an ``<a>``:
class ``btn`` (buttons), ``product-link`` (a product's asin) or ``option`` (an option value,
with ``data-name``); the env reads them from the HTML as WebShop's text mode reads its page.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import re
import sqlite3
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
from urllib.parse import parse_qs, urlencode, urlsplit

from .catalog import generate_catalog, make_goal, search_text, words
from .reward import get_reward

__all__ = ["SEARCH_RETURN_N", "Shop", "ShopError", "build_db", "main", "route"]

SEARCH_RETURN_N = 50  # WebShop's engine.py
PRODUCT_WINDOW = 10
SUB_PAGES = ("Description", "Features", "Reviews")


class ShopError(Exception):
    """The shop cannot be built or opened (no FTS5, a database of other arguments)."""


def build_db(path: str, seed: int, num_products: int) -> None:
    """Write the catalogue and its FTS5 index to ``path`` (atomically: a finished file or none)."""
    tmp = f"{path}.tmp{os.getpid()}"
    db = sqlite3.connect(tmp)
    try:
        try:
            db.execute("CREATE VIRTUAL TABLE docs USING fts5(body)")
        except sqlite3.OperationalError as exc:
            raise ShopError(f"this Python's sqlite3 ({sqlite3.sqlite_version}) has no FTS5: {exc}") from None
        db.execute("CREATE TABLE products (idx INTEGER PRIMARY KEY, asin TEXT UNIQUE, data TEXT)")
        db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
        products = generate_catalog(seed, num_products)
        db.executemany("INSERT INTO products VALUES (?, ?, ?)",
                       ((i, p["asin"], json.dumps(p)) for i, p in enumerate(products)))
        db.executemany("INSERT INTO docs (rowid, body) VALUES (?, ?)",
                       ((i, search_text(p)) for i, p in enumerate(products)))
        db.executemany("INSERT INTO meta VALUES (?, ?)", [("seed", str(seed)), ("num_products", str(num_products))])
        db.commit()
    finally:
        db.close()
    os.replace(tmp, path)


class Shop:
    """The catalogue and its search index, read from a database :func:`build_db` wrote."""

    def __init__(self, path: str, seed: int, num_products: int):
        if not os.path.exists(path):
            build_db(path, seed, num_products)
        self.db = sqlite3.connect(path, check_same_thread=False)
        meta = dict(self.db.execute("SELECT key, value FROM meta"))
        if (int(meta["seed"]), int(meta["num_products"])) != (seed, num_products):
            raise ShopError(f"{path} holds the shop of seed {meta['seed']} with {meta['num_products']} products, "
                            f"not seed {seed} with {num_products}")
        self.seed = seed
        self.products = [json.loads(row[0]) for row in self.db.execute("SELECT data FROM products ORDER BY idx")]
        self.by_asin = {p["asin"]: p for p in self.products}
        self._goals: dict[int, dict] = {}

    def goal(self, task_id: int) -> dict:
        if task_id not in self._goals:
            self._goals[task_id] = make_goal(self.products, task_id, self.seed)
        return self._goals[task_id]

    def search(self, keywords: str) -> list[dict]:
        """The top :data:`SEARCH_RETURN_N` products for ``keywords``, best first (BM25)."""
        terms = words(keywords)
        if not terms:
            return []
        query = " OR ".join(f'"{t}"' for t in dict.fromkeys(terms))
        rows = self.db.execute("SELECT rowid FROM docs WHERE docs MATCH ? ORDER BY bm25(docs), rowid LIMIT ?",
                               (query, SEARCH_RETURN_N))
        return [self.products[r[0]] for r in rows]


# ---- pages ---------------------------------------------------------------------------------
def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _link(cls: str, href: str, text: str, extra: str = "") -> str:
    return f'<a class="{cls}" href="{_e(href)}"{extra}>{_e(text)}</a>'


def _page(task_id: int, goal: dict, body: str) -> str:
    return ("<!DOCTYPE html><html><head><title>WebShop</title></head><body>"
            f'<div id="instruction-text"><h4>Instruction:</h4><p>{_e(goal["instruction_text"])}</p></div>'
            f"{body}</body></html>")


def _query(**params: object) -> str:
    return urlencode({k: v for k, v in params.items() if v is not None})


def search_page(task_id: int, goal: dict) -> str:
    return _page(task_id, goal, f'<form action="/{task_id}/search"><input id="search_input" name="q">'
                                f'<button class="btn" type="submit">Search</button></form>')


def results_page(task_id: int, goal: dict, q: str, page: int, results: list[dict]) -> str:
    shown = results[(page - 1) * PRODUCT_WINDOW: page * PRODUCT_WINDOW]
    parts = [f"<div>{_link('btn', f'/{task_id}', 'Back to Search')}</div>",
             f"<div>Page {page} (Total results: {len(results)})</div>"]
    nav = []
    if page > 1:
        nav.append(_link("btn", f"/{task_id}/search?{_query(q=q, page=page - 1)}", "< Prev"))
    if page * PRODUCT_WINDOW < len(results):
        nav.append(_link("btn", f"/{task_id}/search?{_query(q=q, page=page + 1)}", "Next >"))
    if nav:
        parts.append(f"<div>{' '.join(nav)}</div>")
    for p in shown:
        href = f"/{task_id}/item/{p['asin']}?{_query(q=q, page=page, opt='{}')}"
        parts.append(f'<div class="result"><div>{_link("product-link", href, p["asin"])}</div>'
                     f"<div>{_e(p['Title'])}</div><div>{_e(p['Price'])}</div></div>")
    return _page(task_id, goal, "".join(parts))


def item_page(task_id: int, goal: dict, product: dict, q: str, page: int, options: dict[str, str]) -> str:
    asin = product["asin"]
    parts = [f"<div>{_link('btn', f'/{task_id}', 'Back to Search')}</div>",
             f"<div>{_link('btn', f'/{task_id}/search?{_query(q=q, page=page)}', '< Prev')}</div>"]
    for name, values in product["options"].items():
        links = []
        for value in values:
            chosen = {**options, name: value}
            href = f"/{task_id}/item/{asin}?{_query(q=q, page=page, opt=json.dumps(chosen, sort_keys=True))}"
            cls = "option selected" if options.get(name) == value else "option"
            links.append(_link(cls, href, value, f' data-name="{_e(name)}"'))
        parts.append(f'<div class="option-group">{_e(name)}: {" ".join(links)}</div>')
    for name, value in options.items():
        parts.append(f'<div class="clicked">You have clicked {_e(value)}.</div>')
    opt = json.dumps(options, sort_keys=True)
    parts += [f"<div><h2>{_e(product['Title'])}</h2></div>", f"<div>Price: {_e(product['Price'])}</div>",
              f"<div>Rating: {_e(product['Rating'])}</div>"]
    for name in SUB_PAGES:
        parts.append(f"<div>{_link('btn', f'/{task_id}/sub/{asin}/{name}?{_query(q=q, page=page, opt=opt)}', name)}</div>")
    parts.append(f"<div>{_link('btn', f'/{task_id}/done/{asin}?{_query(opt=opt)}', 'Buy Now')}</div>")
    return _page(task_id, goal, "".join(parts))


def sub_page(task_id: int, goal: dict, product: dict, name: str, q: str, page: int, options: dict) -> str:
    back = f"/{task_id}/item/{product['asin']}?{_query(q=q, page=page, opt=json.dumps(options, sort_keys=True))}"
    parts = [f"<div>{_link('btn', f'/{task_id}', 'Back to Search')}</div>", f"<div>{_link('btn', back, '< Prev')}</div>"]
    if name == "Description":
        parts.append(f"<div><p>{_e(product['Description'])}</p></div>")
    elif name == "Features":
        parts.append("<ul>" + "".join(f"<li>{_e(b)}</li>" for b in product["BulletPoints"]) + "</ul>")
    else:
        parts += [f"<div>{_e(r['title'])} ({r['score']} stars): {_e(r['body'])}</div>" for r in product["Reviews"]]
    return _page(task_id, goal, "".join(parts))


def done_page(task_id: int, goal: dict, product: dict, options: dict, reward: float) -> str:
    chosen = ", ".join(f"{k}: {v}" for k, v in options.items()) or "none"
    return _page(task_id, goal, "<div><h1>Thank you for shopping with us!</h1></div>"
                                f"<div>Purchased: {_e(product['asin'])} ({_e(product['Title'])}), options: {_e(chosen)}</div>"
                                f"<div>Your score (min 0.0, max 1.0): {reward:.4f}</div>")


_PATH = re.compile(r"^/(\d+)(?:/(search|item|sub|done)(?:/([A-Z0-9]+))?(?:/(\w+))?)?/?$")


def route(shop: Shop, url: str) -> tuple[int, str]:
    """``(status, html)`` of the page at ``url`` (path and query)."""
    parts = urlsplit(url)
    match = _PATH.match(parts.path)
    if not match:
        return 404, "<html><body>Not found</body></html>"
    task_id, kind, asin, sub = int(match[1]), match[2], match[3], match[4]
    params = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    try:
        goal = shop.goal(task_id)
        page = int(params.get("page", 1))
        options = json.loads(params.get("opt", "{}"))
    except ValueError:
        return 400, "<html><body>Bad request</body></html>"
    q = params.get("q", "")
    if kind is None:
        return 200, search_page(task_id, goal)
    if kind == "search":
        return 200, results_page(task_id, goal, q, max(1, page), shop.search(q))
    product = shop.by_asin.get(asin or "")
    if product is None or not isinstance(options, dict):
        return 404, "<html><body>No such product</body></html>"
    if kind == "item" and sub is None:
        return 200, item_page(task_id, goal, product, q, page, options)
    if kind == "sub" and sub in SUB_PAGES:
        return 200, sub_page(task_id, goal, product, sub, q, page, options)
    if kind == "done" and sub is None:
        reward, _ = get_reward(product, goal, product["price"], options)
        return 200, done_page(task_id, goal, product, options, reward)
    return 404, "<html><body>Not found</body></html>"


class _Handler(BaseHTTPRequestHandler):
    shop: Shop

    def do_GET(self) -> None:  # noqa: N802  (http.server's name)
        if self.path == "/healthz":
            status, body = 200, "ok"
        else:
            status, body = route(self.shop, self.path)
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:  # quiet: one line a click adds up
        pass


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="The WebShop site (rock/WebShop-v0)")
    ap.add_argument("--db", required=True)
    ap.add_argument("--port", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--products", type=int, default=3000)
    ap.add_argument("--build-only", action="store_true", help="build the database and exit")
    args = ap.parse_args(argv)
    try:
        shop = Shop(args.db, args.seed, args.products)
    except ShopError as exc:
        print(f"webshop: {exc}", file=sys.stderr)
        return 2
    if args.build_only:
        return 0
    _Handler.shop = shop
    server = HTTPServer(("127.0.0.1", args.port), _Handler)
    print(f"webshop: serving {len(shop.products)} products on 127.0.0.1:{args.port}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())

