"""Properties of rock/WebShop-v0's pure parts: the action grammar, the HTML-to-text reading
of a page (every link is a clickable, in brackets, found again by its text), and the fuzzy
match of WebShop's reward (bounded, symmetric, 100 on equal word sets)."""

from __future__ import annotations

import html

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rockroll.gem.webshop import page_from_html, parse_webshop_action
from rockroll.gem.webshop_site.reward import token_set_ratio

PROPS = settings(max_examples=200, deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.too_slow])

ARG = st.text(st.characters(blacklist_characters="[]\n\r", blacklist_categories=("Cs",)), min_size=1,
              max_size=30).filter(lambda s: s.strip())
PROSE = st.text(st.characters(blacklist_characters="[]", blacklist_categories=("Cs",)), max_size=40)


@PROPS
@given(name=st.sampled_from(["search", "click", "Click", "SEARCH"]), arg=ARG, before=PROSE)
def test_the_last_action_of_a_reply_is_read_whole(name, arg, before):
    text = f"click[first] {before} {name}[{arg}]"
    assert parse_webshop_action(text) == (name.lower(), arg.strip())


@PROPS
@given(text=PROSE)
def test_prose_without_brackets_is_no_action(text):
    assert parse_webshop_action(text) is None


LINK = st.text(st.characters(whitelist_categories=("L", "N"), whitelist_characters=" <>-.&'\""), min_size=1,
               max_size=20).filter(lambda s: s.strip())


@PROPS
@given(links=st.lists(LINK, min_size=1, max_size=6, unique_by=lambda s: " ".join(s.split()).lower()))
def test_every_link_is_a_bracketed_clickable(links):
    body = "".join(f'<div><a class="btn" href="/x/{i}">{html.escape(t)}</a></div>' for i, t in enumerate(links))
    page = page_from_html("/1/search?q=a", f"<html><head><title>T</title></head><body>{body}</body></html>")
    for i, text in enumerate(links):
        shown = " ".join(text.split())
        assert page.clickables[shown.lower()] == f"/x/{i}"
        assert f"[{shown}]" in page.text.splitlines()
    assert "T" not in page.text.splitlines()  # the head is not shown


WORDS = st.lists(st.sampled_from(["slip", "resistant", "memory", "foam", "black", "navy", "10", "x-large"]),
                 min_size=1, max_size=4)


@PROPS
@given(a=WORDS, b=WORDS)
def test_token_set_ratio_is_a_bounded_symmetric_similarity(a, b):
    x, y = " ".join(a), " ".join(b)
    assert 0 <= token_set_ratio(x, y) == token_set_ratio(y, x) <= 100
    assert token_set_ratio(x, " ".join(reversed(a)).upper()) == 100
