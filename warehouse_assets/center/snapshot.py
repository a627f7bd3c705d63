"""What one resolver call reads of the partition state store and the ledger, each row once: the gate's reader (the
partitions planned earlier in the call counted as built), the late-data rule's records, and the taints held until
the runs marking them land."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

from dagster import AssetKey

from warehouse_assets.catalog import Table
from warehouse_assets.center.ledger import Ledger, Rebuild, Stale
from warehouse_assets.center.state_store import PartitionState, PartitionStateStore, failed_blocking_checks
from warehouse_assets.materialize.validity import Taint


class ResolverSnapshot:
    """The store as the gate's reader, each partition's state read once per call; ``planned`` partitions (earlier
    in a run being planned) count as materialized, with no verdict yet, as the run guard counts what its run wrote."""

    def __init__(self, store: PartitionStateStore, ledger: Ledger):
        self.store, self._ledger = store, ledger
        self.planned: set[tuple[str, str]] = set()
        # late data: the partitions this call found stale, rebuilt (requested again), or no longer behind their inputs
        self.stale_marks: dict[tuple[str, str], Stale] = {}
        self.rebuilds: dict[tuple[str, str], Rebuild] = {}
        self.fresh: set[tuple[str, str]] = set()
        self._stale_rows: dict[tuple[str, str], Stale | None] = {}
        self._rebuilt_rows: dict[tuple[str, str], Rebuild | None] = {}
        self._seen: dict[str, dict[str, PartitionState]] = {}  # table → partition → state
        self._repairing: dict[str, bool] = {}
        self._newest: dict[str, str | None] = {}
        self._names: dict[str, str] = {}
        # taints planned after late failed verdicts, held here until their root is materialized again: the run
        # marking them is on its way, and nothing may be built on them meanwhile
        self._holds: dict[tuple[str, str, int], tuple[Taint, list[tuple[str, str, int]]]] = {}
        self._new_holds: list[tuple[tuple[str, str, int], Taint, list[tuple[str, str, int]]]] = []
        self._stale: list[tuple[str, str, int]] = []
        self._held: dict[tuple[str, str], tuple[Taint, int]] = {}  # partition → taint, on that materialization
        for fqn, partition, storage_id, taint_json, marked_json in ledger.holds():
            triples = [(t, k, i) for t, k, i in json.loads(marked_json)]
            self._holds[(fqn, partition, storage_id)] = (Taint.from_json(json.loads(taint_json)), triples)
        for key, (taint, marked) in self._holds.items():
            [root] = store.states(AssetKey(key[0].split(".")), [key[1]]).values()
            if root.storage_id != key[2]:
                self._stale.append(key)  # the root was materialized again: the marks (or the rebuild) took over
            else:
                self._held.update({(t, k): (taint, i) for t, k, i in marked})

    def pending_roots(self) -> set[tuple[str, str, int]]:
        return set(self._holds)

    def hold(self, key: tuple[str, str, int], taint: Taint, marked: list[tuple[str, str, int]]) -> None:
        self._holds[key] = (taint, marked)
        self._new_holds.append((key, taint, marked))
        self._held.update({(t, k): (taint, i) for t, k, i in marked})

    def persist_holds(self) -> None:
        """Record the new holds and forget the stale ones (inside the caller's transaction)."""
        self._ledger.set_holds(
            [(*key, json.dumps(taint.to_json()), json.dumps(marked)) for key, taint, marked in self._new_holds],
            self._stale,
        )

    def stale(self, fqn: str, partition: str) -> Stale | None:
        """The partition's stale record: as this call marked it, or as the ledger has it."""
        if (fqn, partition) in self.stale_marks:
            return self.stale_marks[(fqn, partition)]
        if (fqn, partition) in self.rebuilds:
            return None
        if (fqn, partition) not in self._stale_rows:
            self._stale_rows[(fqn, partition)] = self._ledger.stale(fqn, [partition]).get(partition)
        return self._stale_rows[(fqn, partition)]

    def stale_due(self, fqn: str, partition: str) -> float | None:
        """When the partition's rebuild for late data is due, if one is coming (not requested yet)."""
        entry = self.stale(fqn, partition)
        return None if entry is None else entry.due

    def mark_stale(self, entry: Stale) -> None:
        self.stale_marks[(entry.table, entry.partition)] = entry

    def read_stale(self, fqn: str, partitions: Iterable[str]) -> None:
        """Read the ledger's stale records of ``partitions`` not read yet, in one query: a late-data look at one
        partition asks about each of its upstream partitions, a query each otherwise."""
        unread = [p for p in dict.fromkeys(partitions) if (fqn, p) not in self._stale_rows]
        if unread:
            found = self._ledger.stale(fqn, unread)
            self._stale_rows.update(((fqn, p), found.get(p)) for p in unread)

    def read_rebuilds(self, fqn: str, partitions: Iterable[str]) -> None:
        """Read the ledger's rebuild records of ``partitions`` not read yet, in one query."""
        unread = [p for p in dict.fromkeys(partitions) if (fqn, p) not in self._rebuilt_rows]
        if unread:
            found = self._ledger.rebuilds(fqn, unread)
            self._rebuilt_rows.update(((fqn, p), found.get(p)) for p in unread)

    def rebuilt(self, fqn: str, partition: str) -> Rebuild | None:
        """The latest rebuild requested of the partition for late data: this call's, or the ledger's."""
        if (fqn, partition) in self.rebuilds:
            return self.rebuilds[(fqn, partition)]
        if (fqn, partition) not in self._rebuilt_rows:
            self._rebuilt_rows[(fqn, partition)] = self._ledger.rebuilds(fqn, [partition]).get(partition)
        return self._rebuilt_rows[(fqn, partition)]

    def persist_late(self, evaluated: Sequence[tuple[str, str]], now: float) -> None:
        """Record the stale partitions and the rebuilds (inside the caller's transaction)."""
        self._ledger.clear_stale([*self.fresh, *self.rebuilds])
        self._ledger.mark_stale(self.stale_marks.values())
        self._ledger.record_rebuilds([(fqn, partition, r) for (fqn, partition), r in self.rebuilds.items()])
        settled = {*self.fresh, *self.rebuilds, *self.stale_marks}
        self._ledger.park_stale([c for c in evaluated if c not in settled], now)

    def repairing(self, backfill_id: str) -> bool:
        """Whether the backfill ``backfill_id`` is still running (read from the instance once per call)."""
        if backfill_id not in self._repairing:
            backfill = self.store.instance.get_backfill(backfill_id)
            self._repairing[backfill_id] = backfill is not None and backfill.status.value == "REQUESTED"
        return self._repairing[backfill_id]

    repair_running = repairing  # the gate's name for it

    def newest_built(self, table: Table) -> str | None:
        """The table's latest partition that holds data, read once per call."""
        if table.fqn not in self._newest:
            self._newest[table.fqn] = self.store.newest_built(AssetKey(table.key))
        return self._newest[table.fqn]

    def states(self, table: Table, keys: Sequence[str]) -> dict[str, PartitionState]:
        fqn = table.fqn
        seen = self._seen.get(fqn)
        if seen is None:
            seen = self._seen[fqn] = {}
        missing = [k for k in keys if k not in seen]
        if missing:
            name = self._names.get(fqn)
            if name is None:  # an AssetKey costs microseconds to build: one per table and call
                name = self._names[fqn] = AssetKey(table.key).to_user_string()
            seen.update(self.store.states(name, missing))
        return {k: seen[k] for k in keys}

    def state(self, table: Table, key: str) -> PartitionState:
        return self.states(table, [key])[key]

    # the gate's PartitionStateReader

    def materialized(self, table: Table, keys: Sequence[str]) -> set[str]:
        return {k for k, s in self.states(table, keys).items() if s.materialized or (table.fqn, k) in self.planned}

    def in_progress(self, table: Table, keys: Sequence[str]) -> set[str]:
        return {k for k, s in self.states(table, keys).items() if s.in_progress and (table.fqn, k) not in self.planned}

    def failed_blocking_checks(self, table: Table, keys: Sequence[str]) -> dict[str, list[str]]:
        if not any(c.blocking for c in table.checks):
            return {}  # most tables: none of their partitions' states to look at
        return failed_blocking_checks(
            table, self.states(table, [k for k in keys if (table.fqn, k) not in self.planned])
        )

    def reached_states(self, table: Table, keys: Sequence[str]) -> dict[str, str | None]:
        # planned earlier in the run: in a state the run decides, taken as not accepted yet (a run never plans a
        # partition of a table with states together with its downstream)
        return {k: s.state for k, s in self.states(table, keys).items()}

    def tainted(self, table: Table, keys: Sequence[str]) -> dict[str, Taint]:
        fresh = [k for k in keys if (table.fqn, k) not in self.planned]  # rebuilt earlier in the run: new data
        found = self.states(table, fresh)
        taints = {k: s.taint for k, s in found.items() if s.taint is not None}
        for k, state in found.items():
            held = self._held.get((table.fqn, k))
            # a hold stands for the materialization it was planned on: a rebuild since is new data
            if held is not None and k not in taints and state.storage_id == held[1]:
                taints[k] = held[0]
        return taints
