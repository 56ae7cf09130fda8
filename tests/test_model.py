"""The reference model itself (``tests/model.py``): its rules, stated as examples, so a
change to the model that every suite trusts is a visible change here."""

from __future__ import annotations

from tests.model import UpsertModel, canonical


def _row(k: int, o: int, v: str) -> dict[str, object]:
    return {"key": k, "offset": o, "v": v}


def test_greatest_order_wins_and_on_equal_orders_the_later_row_of_the_file() -> None:
    for scope in ("batch", "global"):
        model = UpsertModel(scope)
        model.apply([_row(1, 5, "late"), _row(1, 3, "early"),  # greatest order, not last
                     _row(2, 4, "first"), _row(2, 4, "second")])  # tie: the later row
        assert model.snapshot(0) == {(1,): canonical(_row(1, 5, "late")),
                                     (2,): canonical(_row(2, 4, "second"))}


def test_batch_scope_later_batches_always_override() -> None:
    model = UpsertModel("batch")
    model.apply([_row(1, 9, "a")])
    model.apply([_row(1, 1, "b")])
    model.apply([{"key": 1, "offset": 0, "__deleted": True}])
    model.apply([_row(1, 0, "c")])
    assert [model.rows(ts) for ts in range(4)] == [
        {canonical(_row(1, 9, "a")): 1}, {canonical(_row(1, 1, "b")): 1}, {},
        {canonical(_row(1, 0, "c")): 1}]
    assert model.tombstones == {}


def test_global_scope_ignores_orders_not_greater_than_the_stored_one_tombstones_included() -> None:
    model = UpsertModel("global")
    model.apply([_row(1, 5, "a")])
    assert model.apply([_row(1, 5, "equal")]) == []  # ties break within a batch only
    assert model.apply([_row(1, 4, "older")]) == []
    model.apply([{"key": 2, "offset": 7, "__deleted": "TRUE"}])  # a never-seen key
    assert model.tombstones == {(2,): 7}
    assert model.apply([_row(2, 7, "resurrect?")]) == []
    assert model.apply([_row(2, 8, "newer")]) == [((2,), canonical(_row(2, 8, "newer")), 1)]
    assert model.tombstones == {}


def test_changes_are_consolidated_and_identical_rows_are_no_change() -> None:
    model = UpsertModel("batch")
    model.apply([_row(1, 1, "a"), _row(2, 1, "b")])
    model.apply([_row(1, 1, "a"), _row(2, 2, "b"), {"key": 3, "offset": 1, "__deleted": "false"}])
    assert model.row_changes(1) == {canonical(_row(2, 1, "b")): -1,
                                    canonical(_row(2, 2, "b")): 1,
                                    canonical({"key": 3, "offset": 1}): 1}
    assert model.records(1, ["key", "v"]) == [{"key": 1, "v": "a"}, {"key": 2, "v": "b"},
                                              {"key": 3, "v": None}]


def test_null_keys_and_orders_are_error_rows() -> None:
    model = UpsertModel("batch", key=("a", "b"))
    model.apply([{"a": 1, "b": None, "offset": 1}, {"a": 1, "b": 2, "offset": None},
                 {"a": 1, "b": 2, "offset": 3}])
    assert model.errors == [(0, 1, "null key"), (0, 2, "null order")]
    assert list(model.snapshot(0)) == [(1, 2)]


def test_engine_updates_with_bytes() -> None:
    model = UpsertModel("global")
    assert model.apply_updates([(b"k", b"x", 2), (b"k", None, 2)]) == []  # the delete wins
    assert model.tombstones == {b"k": 2} and model.snapshot() == {}


def test_several_order_columns_compare_as_tuples_and_a_null_in_any_is_a_null_order() -> None:
    def row(k: int, f: str | None, p: int | None, v: str) -> dict[str, object]:
        return {"key": k, "file": f, "pos": p, "v": v}

    model = UpsertModel("global", order=("file", "pos"))
    model.apply([row(1, "bin.2", 1, "newer file"), row(1, "bin.1", 900, "older file"),
                 row(2, "bin.1", 7, "first"), row(2, "bin.1", 7, "tie: later row"),
                 row(3, None, 7, "null file"), row(3, "bin.1", None, "null pos")])
    assert model.snapshot(0) == {(1,): canonical(row(1, "bin.2", 1, "newer file")),
                                 (2,): canonical(row(2, "bin.1", 7, "tie: later row"))}
    assert model.errors == [(0, 5, "null order"), (0, 6, "null order")]
    assert model.stored_order((1,)) == ("bin.2", 1)
    assert model.apply([row(1, "bin.1", 10**6, "late")]) == []  # not greater: ignored
    assert model.apply([row(2, "bin.1", 8, "later")]) == [
        ((2,), canonical(row(2, "bin.1", 7, "tie: later row")), -1),
        ((2,), canonical(row(2, "bin.1", 8, "later")), 1)]


def test_missing_keep_folds_a_keys_rows_in_order() -> None:
    ph = "__debezium_unavailable_value"
    for scope in ("batch", "global"):
        model = UpsertModel(scope, missing="keep")
        model.apply([{"key": 1, "offset": 1, "a": 1, "b": "x", "c": True}])
        changes = model.apply([
            {"key": 1, "offset": 3, "c": None},  # explicit null: set
            {"key": 1, "offset": 2, "a": ph, "b": "y"},  # applied first (order 2 < 3)
            {"key": 2, "offset": 1, "b": "new"},  # no row before: left out is null
        ])
        assert model.snapshot(1) == {
            (1,): canonical({"key": 1, "offset": 3, "a": 1, "b": "y"}),
            (2,): canonical({"key": 2, "offset": 1, "b": "new"}),
        }
        # the retraction is the old full row, the insertion the folded one
        assert (((1,), canonical({"key": 1, "offset": 1, "a": 1, "b": "x", "c": True}), -1)
                in changes)


def test_missing_keep_a_delete_leaves_nothing_and_late_rows_are_skipped_first() -> None:
    model = UpsertModel("global", missing="keep")
    model.apply([{"key": 1, "offset": 5, "a": 1, "b": "x"}])
    model.apply([
        {"key": 1, "offset": 9, "b": "z"},
        {"key": 1, "offset": 7, "__deleted": True},
        {"key": 1, "offset": 4, "a": 99},  # late: neither takes nor gives
    ])
    assert model.snapshot(1) == {(1,): canonical({"key": 1, "offset": 9, "b": "z"})}
    batch = UpsertModel("batch", missing="keep")
    batch.apply([{"key": 1, "offset": 5, "a": 1}])
    batch.apply([{"key": 1, "offset": 0, "b": "y"}])  # batch scope: never late
    assert batch.snapshot(1) == {(1,): canonical({"key": 1, "offset": 0, "a": 1, "b": "y"})}


def test_missing_keep_placeholder_in_key_or_order_is_an_error_row() -> None:
    model = UpsertModel("batch", missing="keep", placeholder="?")
    model.apply([{"key": "?", "offset": 1}, {"key": 1, "offset": "?"},
                 {"key": 1, "offset": 1, "v": "?"}])
    assert [e[1] for e in model.errors] == [1, 2]
    assert model.snapshot(0) == {(1,): canonical({"key": 1, "offset": 1})}
