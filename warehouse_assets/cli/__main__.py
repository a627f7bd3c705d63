"""``python -m warehouse_assets.cli``: the ``warehouse`` command (how ``warehouse dev`` starts its engine)."""

from warehouse_assets.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
