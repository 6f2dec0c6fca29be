"""The procedural catalogue and instructions of ``rock/WebShop-v0``.

WebShop's own data (1.18 M scraped Amazon products, 12 k human instructions) is downloaded
from a file host at setup; here both are drawn from seeded generators with the same shape:

- a product has WebShop's fields: ``asin``, ``Title`` (= ``name``), ``query`` and
  ``category`` (the search that found it), ``product_category`` (the breadcrumb, ``›``
  separated), ``Attributes`` (what the product *is*: "slip resistant", "memory foam"),
  ``BulletPoints`` (the Features page), ``Description``, ``options`` (``{"size": [...],
  "color": [...]}``), ``Price`` and ``Rating``; plus ``nouns``, the words of its title a
  tagger would call nouns (the type reward reads them; WebShop runs spaCy for that);
- a goal (one per task id) names a target product's ``query``, ``product_category``,
  ``name``, a few of its ``attributes``, one value of each of its options (``goal_options``)
  and a ``price_upper`` drawn as WebShop's ``get_synthetic_goals`` draws it; its
  ``instruction_text`` reads like WebShop's synthetic ones ("... with color: black, and
  size: 9, and price lower than 60.00 dollars").

Everything is a pure function of ``(seed, num_products)`` and the task id, through
:class:`random.Random` seeded with strings (stable across processes and Python versions),
so the host and the server in the sandbox build the same shop from the same numbers.

Held-out tasks: ids ``0 .. TEST_TASKS - 1`` are the test split (WebShop's first 500 goals
are its test set) and their targets are the products whose index is a multiple of
``TEST_PRODUCT_EVERY``, which no training task (id >= ``TEST_TASKS``) ever targets.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

__all__ = [
    "COLOR_SET",
    "TEST_PRODUCT_EVERY",
    "TEST_TASKS",
    "generate_catalog",
    "make_goal",
    "search_text",
    "task_split",
]

TEST_TASKS = 500  # ids 0..499: held-out (WebShop's test goals are its first 500)
TEST_PRODUCT_EVERY = 10  # product i is a test target iff i % 10 == 0
PRICE_RANGE = [10.0 * i for i in range(1, 100)]  # WebShop's goal.py PRICE_RANGE


@dataclass(frozen=True)
class _Category:
    noun: str  # the type word in titles ("sneakers")
    query: str  # WebShop's `query`: the search that found the product
    path: str  # WebShop's `product_category` breadcrumb
    attributes: tuple[str, ...]
    options: tuple[tuple[str, tuple[str, ...]], ...]
    price: tuple[float, float]
    uses: tuple[str, ...]  # what it is for (descriptions)
    extra_noun: str = ""  # a second noun some titles carry ("running shoes")


_SHOE_SIZES = ("6", "6.5", "7", "7.5", "8", "8.5", "9", "9.5", "10", "10.5", "11", "12", "13")
_CLOTH_SIZES = ("x-small", "small", "medium", "large", "x-large", "xx-large", "3x-large")
_COLORS = ("black", "white", "grey", "navy", "red", "green", "beige", "brown", "pink", "purple",
           "khaki", "olive", "burgundy", "teal", "yellow", "orange", "silver", "gold", "ivory", "charcoal")
#: WebShop's normalize_color reads the first of these found in an option value (its list is
#: alphabetical too, so "navy blue" normalises to "blue").
COLOR_SET = tuple(sorted(set(_COLORS) | {"blue", "light", "dark", "rose"}))

_CATEGORIES: tuple[_Category, ...] = (
    _Category("sneakers", "men's sneakers", "clothing, shoes & jewelry › men › shoes › fashion sneakers",
              ("slip resistant", "rubber sole", "lace up", "memory foam", "breathable mesh", "arch support",
               "lightweight", "machine washable", "wide toe box"),
              (("size", _SHOE_SIZES), ("color", _COLORS)), (25, 130), ("walking", "the gym", "everyday wear"), "shoes"),
    _Category("sandals", "women's sandals", "clothing, shoes & jewelry › women › shoes › sandals",
              ("open toe", "ankle strap", "arch support", "non slip", "soft footbed", "waterproof", "flat heel",
               "adjustable buckle"),
              (("size", _SHOE_SIZES), ("color", _COLORS)), (15, 90), ("the beach", "summer days", "travel")),
    _Category("hoodie", "men's hoodies", "clothing, shoes & jewelry › men › clothing › hoodies",
              ("long sleeve", "fleece lined", "machine washable", "drawstring closure", "kangaroo pocket",
               "relaxed fit", "cotton blend", "zip up"),
              (("size", _CLOTH_SIZES), ("color", _COLORS)), (20, 80), ("cold mornings", "the gym", "lounging")),
    _Category("dress", "women's dresses", "clothing, shoes & jewelry › women › clothing › dresses",
              ("short sleeve", "v neck", "high waist", "machine washable", "floral print", "a line",
               "pockets", "stretch fabric"),
              (("size", _CLOTH_SIZES), ("color", _COLORS)), (20, 110), ("parties", "the office", "summer days")),
    _Category("headphones", "wireless headphones", "electronics › headphones, earbuds & accessories › headphones",
              ("noise cancelling", "bluetooth 5.0", "over ear", "long battery life", "built in microphone",
               "foldable design", "hands free calling", "fast charging"),
              (("color", _COLORS),), (30, 250), ("travel", "work calls", "music at home"), "earphones"),
    _Category("phone case", "iphone case", "cell phones & accessories › cases, holsters & sleeves › basic cases",
              ("shockproof", "wireless charging compatible", "slim fit", "raised edges", "clear back",
               "kickstand", "scratch resistant", "card holder"),
              (("color", _COLORS), ("model", ("iphone 12", "iphone 13", "iphone 14", "iphone 15", "iphone 15 pro"))),
              (8, 45), ("daily protection", "drops", "travel")),
    _Category("coffee", "ground coffee", "grocery & gourmet food › beverages › coffee, tea & cocoa › coffee",
              ("dark roast", "medium roast", "organic", "fair trade", "low acid", "decaf", "single origin",
               "kosher"),
              (("flavor name", ("original", "vanilla", "hazelnut", "caramel", "mocha", "french roast")),
               ("size", ("12 ounce (pack of 1)", "12 ounce (pack of 2)", "2 pound (pack of 1)", "32 ounce (pack of 1)"))),
              (8, 60), ("the morning", "espresso", "cold brew")),
    _Category("shampoo", "sulfate free shampoo", "beauty & personal care › hair care › shampoo & conditioner › shampoos",
              ("sulfate free", "paraben free", "natural ingredients", "for dry hair", "color safe", "tea tree",
               "cruelty free", "argan oil"),
              (("scent", ("unscented", "lavender", "coconut", "mint", "citrus", "rosemary")),
               ("size", ("8 fl oz (pack of 1)", "16 fl oz (pack of 1)", "16 fl oz (pack of 2)", "33.8 fl oz (pack of 1)"))),
              (6, 45), ("daily washing", "dry scalp", "curly hair")),
    _Category("desk lamp", "led desk lamp", "tools & home improvement › lighting & ceiling fans › lamps & shades › desk lamps",
              ("dimmable", "usb charging port", "eye caring", "touch control", "adjustable arm", "energy efficient",
               "memory function", "clamp mount"),
              (("color", _COLORS),), (15, 90), ("reading", "the office", "late night study")),
    _Category("backpack", "laptop backpack", "luggage & travel gear › backpacks › laptop backpacks",
              ("water resistant", "anti theft", "usb charging port", "padded laptop sleeve", "lightweight",
               "large capacity", "luggage strap", "adjustable straps"),
              (("color", _COLORS), ("size", ("15.6 inch", "17 inch", "14 inch"))), (20, 120),
              ("business travel", "college", "hiking")),
    _Category("yoga mat", "non slip yoga mat", "sports & outdoors › exercise & fitness › yoga › yoga mats",
              ("non slip", "extra thick", "eco friendly", "carrying strap", "tear resistant", "alignment lines",
               "lightweight", "sweat resistant"),
              (("color", _COLORS), ("size", ("6mm", "8mm", "10mm"))), (15, 80), ("pilates", "home workouts", "stretching")),
    _Category("dog bed", "orthopedic dog bed", "pet supplies › dogs › beds & furniture › beds",
              ("orthopedic", "machine washable", "removable cover", "waterproof", "non slip bottom",
               "memory foam", "chew resistant", "raised rim"),
              (("size", ("small", "medium", "large", "x-large", "jumbo")), ("color", _COLORS)), (20, 140),
              ("senior dogs", "crates", "the living room")),
)

_BRAND_A = ("Nor", "Vel", "Ar", "Quin", "Bel", "Zen", "Lum", "Cor", "Tal", "Hex", "Mira", "Ost", "Pel", "Sor", "Vant", "Kel")
_BRAND_B = ("vox", "ora", "ex", "ly", "ton", "ique", "wood", "field", "mark", "era", "ix", "well")
_STYLE = ("classic", "premium", "modern", "essential", "everyday", "deluxe", "sport", "urban", "signature", "ultra")
_FILLER = (
    "Designed and tested by our team to last.",
    "Backed by a one year warranty and friendly support.",
    "Easy to care for and built for daily use.",
    "A thoughtful gift for family and friends.",
    "Ships in recyclable packaging.",
)
_ASIN_CHARS = "ABCDEFGHJKLMNPQRSTUVWXYZ0123456789"


def _brands(rng: random.Random, n: int = 60) -> list[str]:
    names = sorted({a + b for a in _BRAND_A for b in _BRAND_B})
    rng.shuffle(names)
    return names[:n]


def generate_catalog(seed: int = 0, num_products: int = 3000) -> list[dict]:
    """``num_products`` products (WebShop's fields, see the module docstring), the same list
    for the same arguments in any process."""
    if num_products < len(_CATEGORIES) * TEST_PRODUCT_EVERY:
        raise ValueError(f"num_products must be >= {len(_CATEGORIES) * TEST_PRODUCT_EVERY}, got {num_products}")
    rng = random.Random(f"webshop-catalog:{seed}")
    brands = _brands(rng)
    products, asins = [], set()
    for i in range(num_products):
        cat = _CATEGORIES[i % len(_CATEGORIES)]
        while True:
            asin = "B0" + "".join(rng.choice(_ASIN_CHARS) for _ in range(8))
            if asin not in asins:
                asins.add(asin)
                break
        brand = rng.choice(brands)
        attributes = rng.sample(cat.attributes, rng.randint(3, 4))
        style = rng.choice(_STYLE)
        noun = cat.noun if not cat.extra_noun or rng.random() < 0.6 else f"{cat.noun} {cat.extra_noun}"
        in_title = attributes[: rng.randint(1, 2)]
        title = f"{brand} {style.capitalize()} {' '.join(a.title() for a in in_title)} {noun.title()}"
        if len(attributes) > len(in_title) and rng.random() < 0.5:
            title += f" with {attributes[len(in_title)].title()}"
        options = {}
        for name, values in cat.options:
            k = min(len(values), rng.randint(2, 6))
            options[name] = sorted(rng.sample(values, k), key=values.index)
        price = round(rng.uniform(*cat.price), 2)
        use = rng.choice(cat.uses)
        bullets = [f"{a.capitalize()}: {rng.choice(('built in', 'made to be', 'crafted to be'))} {a} for {use}."
                   for a in attributes] + [rng.choice(_FILLER)]
        description = (f"The {brand} {style} {cat.noun} is made for {use}. "
                       f"{rng.choice(_FILLER)} {rng.choice(_FILLER)}")
        products.append({
            "asin": asin,
            "name": title,
            "Title": title,
            "query": cat.query,
            "category": cat.noun,
            "product_category": cat.path,
            "Attributes": attributes,
            "BulletPoints": bullets,
            "Description": description,
            "options": options,
            "price": price,
            "Price": f"${price:.2f}",
            "Rating": round(rng.uniform(3.0, 5.0), 1),
            "Reviews": [{"score": rng.randint(3, 5), "title": f"{rng.choice(('Great', 'Good', 'Solid'))} {cat.noun}",
                         "body": f"Bought it for {rng.choice(cat.uses)}. {rng.choice(_FILLER)}"}],
            # what a tagger calls the title's nouns: the brand (a proper noun) and the type words
            "nouns": [brand.lower(), *noun.split()],
        })
    return products


def task_split(task_id: int) -> str:
    """``"test"`` for the held-out ids (``0 .. TEST_TASKS - 1``), else ``"train"``."""
    return "test" if 0 <= task_id < TEST_TASKS else "train"


def _price_upper(rng: random.Random, price: float) -> float:
    """WebShop's draw: two of the four round prices above the product's, the larger one."""
    above = [p for p in PRICE_RANGE if p > price][:4]
    if len(above) < 2:
        return 1_000_000.0
    return sorted(rng.sample(above, 2))[1]


def make_goal(products: list[dict], task_id: int, seed: int = 0) -> dict:
    """The goal of task ``task_id`` (any int >= 0): a target product of its split, some of its
    attributes, one value per option and a price bound, with WebShop's goal fields."""
    if not isinstance(task_id, int) or isinstance(task_id, bool) or task_id < 0:
        raise ValueError(f"a WebShop task id is an int >= 0, got {task_id!r}")
    rng = random.Random(f"webshop-goal:{seed}:{task_id}")
    if task_split(task_id) == "test":
        index = TEST_PRODUCT_EVERY * rng.randrange((len(products) + TEST_PRODUCT_EVERY - 1) // TEST_PRODUCT_EVERY)
    else:
        while (index := rng.randrange(len(products))) % TEST_PRODUCT_EVERY == 0:
            pass
    product = products[index]
    attributes = rng.sample(product["Attributes"], rng.randint(1, min(3, len(product["Attributes"]))))
    goal_options = {name: rng.choice(values) for name, values in sorted(product["options"].items())}
    price_upper = _price_upper(rng, product["price"])
    noun = product["category"]
    template = rng.randrange(4)
    attrs = " and ".join(attributes)
    if template == 0:
        text = f"i need {attrs} {noun}"
    elif template == 1:
        text = f"i am looking for {product['query']} that are {attrs}"
    elif template == 2:
        text = f"find me {attrs} {product['query']}"
    else:
        text = f"i want {noun} with {attrs}"
    option_text = ", and ".join(f"{k}: {v}" for k, v in goal_options.items())
    text += f" with {option_text}" if option_text else ""
    if price_upper < 1_000_000:
        text += f", and price lower than {price_upper:.2f} dollars"
    return {
        "task_id": task_id,
        "asin": product["asin"],
        "category": product["category"],
        "query": product["query"],
        "name": product["name"],
        "nouns": list(product["nouns"]),
        "product_category": product["product_category"],
        "instruction_text": text,
        "attributes": attributes,
        "price_upper": price_upper,
        "goal_options": goal_options,
    }


_WORD = re.compile(r"[a-z0-9]+")


def search_text(product: dict) -> str:
    """What the search engine indexes for a product (WebShop's Lucene index holds the title,
    the bullet points, the description and the options)."""
    options = " ".join(v for values in product["options"].values() for v in values)
    return " ".join([product["Title"], *product["BulletPoints"], product["Description"], options]).lower()


def words(text: str) -> list[str]:
    """The lower-case alphanumeric words of ``text`` (search keywords)."""
    return _WORD.findall(text.lower())
