"""The ``warehouse`` command: argument parsing in :mod:`.main`, the headless path in :mod:`.headless`, the
long-running processes (``dev``, ``engine``, ``spark-server``, ``capture``) in :mod:`.dev`."""

from warehouse_assets.cli.main import main

__all__ = ["main"]
