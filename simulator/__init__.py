"""The embedded default's simulated sources: a dev tool, not part of the product.

- :mod:`simulator.cdc` writes a sharded MySQL source's binlog as Canal flat messages into the landing area;
- :mod:`simulator.external` plays the external producers (the ad partner's files, the finance system's Delta table);
- :mod:`simulator.sensor` is the clock that extends both as wall-clock time passes, registered only when
  ``warehouse dev`` simulates the sources (``WAREHOUSE_SIMULATE_LIVE=1``).

Real deployments replace all three with real sources writing the same landing layout.
"""
