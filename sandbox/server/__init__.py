"""The HTTP service (``rockroll serve``): ``app.py`` builds it from module-level routers."""
