"""Clients that talk to one sandbox: ``agent.py`` (our agent, local and docker),
``remote.py`` (the HTTP SDK), ``ray.py`` (a sandbox on a Ray node). ``_agent.py`` is the
in-sandbox agent itself (standard library only)."""
