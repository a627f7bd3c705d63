"""Explaining the warehouse's state to people: why a partition waits (`why`), when it will be ready (`eta`), the
SLA warnings and the day's timeline (`forecast`), and the partitions' states over a range (`status`).

It reads what the dependency center keeps and changes nothing of it. Each name is imported from the module that
defines it; importing one module of the package imports none of the others (the CLI's ``why`` starts no Spark).
"""
