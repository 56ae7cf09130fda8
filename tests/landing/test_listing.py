"""Listing local landing directories: order, suffixes, pending, names that escape."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from upsert_core.errors import ConfigError, IngestError
from upsert_core.landing import check_name, landing_file, list_landing, pending

NAME_CHARS = st.characters(
    codec="utf-8",
    exclude_categories=("Cs", "Cc", "Zl", "Zp"),
    exclude_characters="/\\\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069",
)


def test_lists_batch_suffixes_sorted_by_name_and_ignores_the_rest(tmp_path: Path) -> None:
    for name in ["b.jsonl", "a.parquet", "c.csv", "notes.txt", "d.json", "B.jsonl", "e.JSONL"]:
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "x.jsonl").write_bytes(b"{}\n")
    (tmp_path / "dir.jsonl").mkdir()  # a directory named like a batch is not a file

    names = [f.name for f in list_landing(str(tmp_path))]

    assert names == ["B.jsonl", "a.parquet", "b.jsonl", "c.csv", "e.JSONL", "sub/x.jsonl"]


@given(st.lists(st.text(NAME_CHARS, min_size=1, max_size=12), min_size=1, max_size=8, unique=True))
def test_order_is_lexicographic_by_name(
    tmp_path_factory: pytest.TempPathFactory, stems: list[str]
) -> None:
    root = tmp_path_factory.mktemp("landing")
    expected = []
    for stem in stems:
        name = f"{stem}.jsonl"
        try:
            (root / name).write_bytes(b"")
        except OSError:  # names the file system refuses (too long in bytes, ...)
            continue
        expected.append(name)

    files = list_landing(str(root))

    assert [f.name for f in files] == sorted(expected)
    assert all(f.size == 0 and f.read_bytes() == b"" for f in files)


def test_url_forms_name_the_same_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "land").mkdir()
    (tmp_path / "land" / "1.jsonl").write_bytes(b'{"key": 1}\n')
    monkeypatch.chdir(tmp_path)
    for url in ["land", "land/", str(tmp_path / "land"), f"file://{tmp_path / 'land'}"]:
        [f] = list_landing(url)
        assert f.root == str(tmp_path / "land")
        assert f.read_bytes() == b'{"key": 1}\n'


def test_bad_locations(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unsupported"):
        list_landing("http://example.com/x")
    with pytest.raises(ConfigError):
        list_landing("")
    with pytest.raises(IngestError, match="does not exist"):
        list_landing(str(tmp_path / "missing"))


def test_pending_filters_ingested_names_and_keeps_late_early_names(tmp_path: Path) -> None:
    for name in ["002.jsonl", "003.jsonl", "001.jsonl"]:
        (tmp_path / name).write_bytes(b"")
    files = list_landing(str(tmp_path))

    todo = pending(files, {"002.jsonl", "gone.jsonl"})

    # 001 arrived after 002 was ingested: it is simply pending, still in name order.
    assert [f.name for f in todo] == ["001.jsonl", "003.jsonl"]
    assert pending(files, [f.name for f in files]) == []


@pytest.mark.parametrize(
    "name",
    [
        "../x.jsonl",
        "a/../../x.jsonl",
        "a/./x.jsonl",
        "/etc/x.jsonl",
        "a//x.jsonl",
        "x\x00.jsonl",
        "x\n.jsonl",
        "x\x1b[2J.jsonl",
        "x\u202e.jsonl",
        "a\\..\\x.jsonl",
        "",
        "..",
    ],
)
def test_names_that_escape_or_hide_are_rejected(tmp_path: Path, name: str) -> None:
    with pytest.raises(IngestError) as info:
        check_name(name)
    assert repr(name) in str(info.value)
    with pytest.raises(IngestError):
        landing_file(str(tmp_path), name)


def test_safe_names_are_accepted(tmp_path: Path) -> None:
    for name in ["a.jsonl", "2024/01/02/part-0.parquet", "ünïcode ok.csv", "..a.jsonl"]:
        assert check_name(name) == name
        assert landing_file(str(tmp_path), name).name == name


def test_listing_rejects_a_control_character_in_a_file_name(tmp_path: Path) -> None:
    (tmp_path / "ok.jsonl").write_bytes(b"")
    (tmp_path / "bad\x07.jsonl").write_bytes(b"")
    with pytest.raises(IngestError, match="control character"):
        list_landing(str(tmp_path))


def test_symlink_out_of_the_landing_location_is_rejected(tmp_path: Path) -> None:
    outside = tmp_path / "secret.jsonl"
    outside.write_bytes(b'{"key": 1}\n')
    land = tmp_path / "land"
    land.mkdir()
    os.symlink(outside, land / "a.jsonl")

    with pytest.raises(IngestError, match="a.jsonl.*outside"):
        list_landing(str(land))
    with pytest.raises(IngestError, match="outside"):
        landing_file(str(land), "a.jsonl").read_bytes()


def test_reading_a_vanished_file_names_it(tmp_path: Path) -> None:
    (tmp_path / "gone.jsonl").write_bytes(b"")
    [f] = list_landing(str(tmp_path))
    (tmp_path / "gone.jsonl").unlink()
    with pytest.raises(IngestError, match="^gone.jsonl: cannot read"):
        f.read_bytes()


def test_landing_files_pickle_for_spark_tasks(tmp_path: Path) -> None:
    import pickle

    (tmp_path / "a.jsonl").write_bytes(b'{"key": 1}\n')
    [f] = list_landing(str(tmp_path))
    clone = pickle.loads(pickle.dumps(f))
    assert clone == f and clone.read_bytes() == b'{"key": 1}\n'
    assert clone.url == f"{tmp_path}/a.jsonl" and clone.suffix == ".jsonl"
