"""Getting data in: CDC capture into the landing area, batch preparation, the merge into ODS Delta tables with its
ops tables, when an ODS hour is complete, external producers' deliveries, and the jobs that run them.

Each name is imported from the module that defines it; importing one module of the package imports none of the
others (the CLI's ``why`` starts no Spark).
"""
