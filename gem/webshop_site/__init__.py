"""The WebShop site: a procedural catalogue, WebShop's reward and a small web server.

Standard library only: these modules run on the host (the env reads the catalogue and grades
a purchase) *and* inside the sandbox, where ``python3 -m webshop_site.server`` serves the shop
over the sandbox's loopback (docs/gem.md, ``rock/WebShop-v0``). Keep them free of rockroll,
numpy and any third-party import.
"""
