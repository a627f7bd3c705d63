"""Dagster instance plugins, named in ``dagster_home/dagster.yaml``: the warm run launcher (each run forked from a
pre-imported process) and the run coordinator that launches a run in the call that submits it when it fits the
limits. Every Dagster process loads them, so they import none of the product.

Each name is imported from the module that defines it; importing one module of the package imports none of the
others (the CLI's ``why`` starts no Spark).
"""
