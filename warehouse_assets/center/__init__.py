"""The dependency center: the partition state store kept from Dagster's event log, the reverse index of the exact
mappings, the resolver that turns each change into the runs that became possible, and the engine process that submits
them. What explains that state to people (why, eta, status, the SLA forecast) is :mod:`warehouse_assets.explain`.

Each name is imported from the module that defines it; importing one module of the package imports none of the
others.
"""
