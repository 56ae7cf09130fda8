"""The dict model of CONTRACT.md's upsert semantics: the one reference every suite checks
the engines against (core drains, in-process ingest, Spark, ``upsertctl`` processes).

It imports nothing from the platform, so it can judge any of it.

Semantics, one batch (one landing file) at a time, each at the next timestamp ``upper``:

- Winner: per key, the row with the greatest order value; on equal order values the
  row that comes LATER in the batch wins (the greatest ``(order, row number)``). This is
  what the engines do: both ``tests.oracle.drain.operator.winners`` and
  ``upsert_core.columnar.drain.winners`` keep the greatest ``(order, position)``, and
  ``position`` is the row's 1-based row number in its file. A caller holding engine
  updates with explicit positions passes them sorted by position (= file order).
- A winner that is a delete removes the key; otherwise its row becomes the key's row.
- Scope ``batch``: nothing is remembered between batches; every winner is applied.
- Scope ``global``: each key remembers its order value, deletes included (a delete of a
  never-seen key leaves a tombstone); a winner whose order is not greater than the
  remembered one is ignored. Only the order VALUE is remembered: row numbers break ties
  within a batch only, so an equal order in a later batch is ignored.
- Changes at ``ts`` are ``snapshot(ts) - snapshot(ts - 1)``: setting a key to an
  identical row is no change.
- Late rows (scope ``global``): a row whose order is not greater than the order stored
  for its key BEFORE the batch (tombstones included) is late: it changes nothing (the
  winner rule above already ignores it) and is recorded in ``late`` with its row number,
  key, order and that stored order. A row that loses to another row of its batch but is
  past the stored order is not late; a key never seen has no late rows; scope ``batch``
  has none.
- An order of several columns (``order=("file", "pos")``): the order value is the tuple
  of the columns' values, compared as Python compares tuples (the first column, then the
  next; strings by code point, which is UTF-8 byte order); a null in ANY of them is a
  null order (an error row). Every rule above holds with tuples for order values.

- Missing values (``missing="keep"``, ``--missing keep``): a value column a row leaves
  out (a dict without the field) or holds the placeholder string in (``placeholder``,
  default ``__debezium_unavailable_value``) keeps the key's previous value; an explicit
  null (None) sets null. The rows of a key in one batch are applied one after the
  other in ``(order, row number)`` order, each taking its missing values from the result
  of the one before it, or from the key's live row before the batch, or null when it
  has none; a delete leaves no row to take values from. In the global scope, rows whose
  order is not greater than the key's stored order (before the batch) are skipped
  first. The key's change is the result of the last row. A key or order column holding
  the placeholder is an error row.

- Hidden columns (a Debezium shard's order fields: the shard's columns are ``after``'s,
  CONTRACT.md "Change data capture"): the state keeps the whole row, order included, but
  a read shows each row without them (:func:`visible_row`); changes are summed per
  visible row, so a retraction and an insertion that differ only in hidden columns
  cancel and are no change (``rows``/``row_changes`` with ``hidden``).

Two ways in: :meth:`UpsertModel.apply` takes a file's rows as dicts (key column(s),
order column, delete marker, value columns: a row becomes its :func:`canonical` form
without the marker, and rows with a null key or order are error rows, recorded and not
applied); :meth:`UpsertModel.apply_updates` takes ``(key, value or None for a delete,
order)`` triples in file order (the core engines' encoded keys and rows).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Hashable, Iterable, Mapping, Sequence
from typing import Any

Row = tuple[tuple[str, Any], ...]
"""A file row as sorted ``(column, value)`` pairs of its non-null columns (hashable)."""

Update = tuple[Hashable, Hashable | None, Any]
"""``(key, value or None for a delete, order value)``."""

Change = tuple[Hashable, Hashable, int]
"""``(key, value, diff)`` with diff +1 or -1."""


def canonical(row: Mapping[str, Any]) -> Row:
    """A row without its nulls, as sorted pairs: a missing column and a null are equal."""
    return tuple(sorted((c, v) for c, v in row.items() if v is not None))


def visible_row(row: Hashable, hidden: Collection[str]) -> Hashable:
    """A :func:`canonical` row without the columns ``hidden`` (as reads show it)."""
    if not hidden:
        return row
    return tuple(pair for pair in row if pair[0] not in hidden)  # type: ignore[attr-defined]


def is_deleted(marker: Any) -> bool:
    """CONTRACT.md's delete marker: a boolean or "true"/"false" in any case; null is false."""
    if isinstance(marker, str):
        return marker.lower() == "true"
    return bool(marker)


class UpsertModel:
    """Per key the live value and its order (``live``), tombstones' orders (``tombstones``,
    global scope only), and the snapshot after every applied batch.

    ``scope`` is ``"batch"``/``"global"`` (or an enum whose ``value`` is one of them);
    ``key``, ``order`` and ``deleted`` name the columns :meth:`apply` reads.
    """

    def __init__(self, scope: Any, *, key: str | Sequence[str] = "key",
                 order: str | Sequence[str] = "offset", deleted: str = "__deleted",
                 missing: str = "null",
                 placeholder: str = "__debezium_unavailable_value") -> None:
        self.scope = str(getattr(scope, "value", scope))
        assert self.scope in ("batch", "global"), scope
        self.key = (key,) if isinstance(key, str) else tuple(key)
        self.order = order if isinstance(order, str) else tuple(order)
        """One order column's name, or a tuple of several (order values are tuples)."""
        self.deleted = deleted
        assert missing in ("null", "keep"), missing
        self.missing = missing
        self.placeholder = placeholder
        self.live: dict[Hashable, tuple[Hashable, Any]] = {}
        self.tombstones: dict[Hashable, Any] = {}
        self.errors: list[tuple[int, int, str]] = []
        """Error rows of :meth:`apply`: ``(ts, row number from 1, reason)``."""
        self.late: list[tuple[int, int, Hashable, Any, Any]] = []
        """Late rows: ``(ts, row number from 1, key, order, stored order)``, in ts and
        file order (:meth:`apply_updates` numbers rows 1, 2, ... unless given numbers)."""
        self._history: list[dict[Hashable, Hashable]] = []
        self._changes: list[list[Change]] = []

    @property
    def upper(self) -> int:
        """The next timestamp: the number of batches applied."""
        return len(self._history)

    # --- applying batches -----------------------------------------------------------------

    def apply(self, rows: Sequence[Mapping[str, Any]]) -> list[Change]:
        """Apply one file's rows (dicts, in file order) at the next timestamp; returns its
        changes. The key is the tuple of the key columns, the value the row's
        :func:`canonical` form without the delete marker (the order column included)."""
        if self.missing == "keep":
            return self._apply_keep(rows)
        ts = self.upper
        updates: list[Update] = []
        numbers: list[int] = []
        for number, r in enumerate(rows, start=1):
            if any(r.get(c) is None for c in self.key):
                self.errors.append((ts, number, "null key"))
                continue
            order = self.order_of(r)
            if order is None:
                self.errors.append((ts, number, "null order"))
                continue
            k = tuple(r[c] for c in self.key)
            value = None if is_deleted(r.get(self.deleted)) else canonical(
                {c: v for c, v in r.items() if c != self.deleted})
            updates.append((k, value, order))
            numbers.append(number)
        return self.apply_updates(updates, numbers)

    def _apply_keep(self, rows: Sequence[Mapping[str, Any]]) -> list[Change]:
        """:meth:`apply` with ``missing="keep"`` (module docstring): each key's rows
        folded into one update, then applied as usual."""
        ts = self.upper
        by_key: dict[Hashable, list[tuple[Any, int, dict[str, Any] | None]]] = {}
        for number, r in enumerate(rows, start=1):
            if any(r.get(c) is None for c in self.key):
                self.errors.append((ts, number, "null key"))
                continue
            order_columns = (self.order,) if isinstance(self.order, str) else self.order
            if any(r.get(c) == self.placeholder for c in (*self.key, *order_columns)):
                self.errors.append((ts, number, "placeholder in a key or order column"))
                continue
            order = self.order_of(r)
            if order is None:
                self.errors.append((ts, number, "null order"))
                continue
            k = tuple(r[c] for c in self.key)
            given = None if is_deleted(r.get(self.deleted)) else {
                c: v for c, v in r.items() if c != self.deleted and v != self.placeholder}
            by_key.setdefault(k, []).append((order, number, given))
        updates: list[Update] = []
        late: list[tuple[int, int, Hashable, Any, Any]] = []
        for key, entries in by_key.items():
            stored = self.stored_order(key) if self.scope == "global" else None
            live: Any = self.live[key][0] if key in self.live else None
            current: dict[str, Any] | None = None if live is None else dict(live)
            last: Update | None = None
            for order, number, given in sorted(entries, key=lambda e: (e[0], e[1])):
                if stored is not None and order <= stored:
                    late.append((ts, number, key, order, stored))
                    continue  # late: skipped first
                if given is None:
                    current = None
                else:
                    merged = {**(current or {}), **given}
                    current = {c: v for c, v in merged.items() if v is not None}
                last = (key, None if current is None else canonical(current), order)
            if last is not None:
                updates.append(last)
        self.late.extend(sorted(late, key=lambda entry: entry[1]))  # in file order
        return self.apply_updates(updates)  # none of them late

    def order_of(self, row: Mapping[str, Any]) -> Any:
        """A row's order value (a tuple for several order columns), None when null."""
        if isinstance(self.order, str):
            return row.get(self.order)
        values = tuple(row.get(c) for c in self.order)
        return None if any(v is None for v in values) else values

    def apply_updates(
        self, updates: Iterable[Update], numbers: Sequence[int] | None = None
    ) -> list[Change]:
        """Apply one batch of ``(key, value or None, order)`` in file order at the next
        timestamp; returns its changes ``(key, value, diff)``. ``numbers`` are the
        updates' row numbers in their file (default 1, 2, ...), for :attr:`late`."""
        updates = list(updates)
        if self.scope == "global":
            for i, (k, _value, order) in enumerate(updates):
                stored = self.stored_order(k)  # as before the batch: nothing applied yet
                if stored is not None and order <= stored:
                    number = numbers[i] if numbers is not None else i + 1
                    self.late.append((self.upper, number, k, order, stored))
        winners: dict[Hashable, tuple[Any, Hashable | None]] = {}
        for k, value, order in updates:
            # >=: on equal order values the later row of the batch wins.
            if k not in winners or order >= winners[k][0]:
                winners[k] = (order, value)
        changes: list[Change] = []
        for k, (order, value) in winners.items():
            if self.scope == "global":
                stored = self.stored_order(k)
                if stored is not None and order <= stored:
                    continue
            old = self.live[k][0] if k in self.live else None
            if value is None:
                self.live.pop(k, None)
                if self.scope == "global":
                    self.tombstones[k] = order
            else:
                self.live[k] = (value, order)
                self.tombstones.pop(k, None)
            if old != value:
                if old is not None:
                    changes.append((k, old, -1))
                if value is not None:
                    changes.append((k, value, 1))
        self._history.append({k: v for k, (v, _o) in self.live.items()})
        self._changes.append(changes)
        return changes

    def stored_order(self, k: Hashable) -> Any:
        """The order the state remembers for ``k`` (global scope), None if none."""
        if k in self.live:
            return self.live[k][1]
        return self.tombstones.get(k)

    # --- reading ------------------------------------------------------------------------

    def snapshot(self, ts: int | None = None) -> dict[Hashable, Hashable]:
        """Key -> live value as of ``ts`` (default: now, empty before any batch)."""
        if ts is None:
            return {k: v for k, (v, _o) in self.live.items()}
        assert 0 <= ts < self.upper, f"ts {ts} not applied (upper {self.upper})"
        return dict(self._history[ts])

    def changes(self, ts: int) -> list[Change]:
        """The consolidated changes at ``ts``: ``(key, value, diff)``, each key's
        retraction before its insertion."""
        assert 0 <= ts < self.upper, f"ts {ts} not applied (upper {self.upper})"
        return list(self._changes[ts])

    def rows(self, ts: int | None = None, hidden: Collection[str] = ()) -> Counter[Hashable]:
        """The snapshot's values as a bag (a shard's snapshot read without keys), each
        without the columns ``hidden``."""
        return Counter(visible_row(value, hidden) for value in self.snapshot(ts).values())

    def row_changes(self, ts: int, hidden: Collection[str] = ()) -> Counter[Hashable]:
        """The changes at ``ts`` as value -> diff (values hold their key columns, so no
        two keys share a value). With ``hidden``, values without those columns, diffs
        summed per value and the ones that cancel dropped (the changes a read shows)."""
        out: Counter[Hashable] = Counter()
        for _k, value, diff in self.changes(ts):
            assert value not in out, "a value shared by two keys"
            out[value] = diff
        if not hidden:
            return out
        shown: Counter[Hashable] = Counter()
        for value, diff in out.items():
            shown[visible_row(value, hidden)] += diff
        return Counter({value: diff for value, diff in shown.items() if diff})

    def records(self, ts: int | None, columns: Sequence[str]) -> list[dict[str, Any]]:
        """The snapshot as output rows of :meth:`apply`'s dict rows: every one of
        ``columns``, null where absent (as ``upsertctl snapshot`` prints them)."""
        return [{c: dict(row).get(c) for c in columns}  # type: ignore[arg-type]
                for row in self.snapshot(ts).values()]
