"""The dependency center: the partition state store kept from Dagster's event log, the reverse index of the exact
mappings, the resolver that turns each change into the runs that became possible, the engine process that submits
them, and `why` a partition waits.

Each name is imported from the module that defines it; importing one module of the package imports none of the
others (the CLI's ``why`` starts no Spark).
"""
