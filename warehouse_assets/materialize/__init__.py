"""Building partitions: the compiler (catalog → Dagster assets and checks), the run guard and partition writes, the
data-quality checks and freshness SLAs, and the gate every part of the product asks "may this partition run now".

Each name is imported from the module that defines it; importing one module of the package imports none of the
others (the CLI's ``why`` starts no Spark).
"""
