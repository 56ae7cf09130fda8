"""Listing local landing directories: order, suffixes, pending, names that escape."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from upsert_core.errors import ConfigError, IngestError, LandingFileChanged
from upsert_core.landing import check_name, landing_file, list_landing, pending
from upsert_core.landing.listing import is_hidden

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
        if not name.startswith((".", "_")):  # hidden: never listed
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


@pytest.mark.parametrize("bad", ["bad\x07.jsonl", "b\nad.jsonl", "b\x01.jsonl"])
def test_a_bad_name_is_listed_and_fails_only_when_read(tmp_path: Path, bad: str) -> None:
    (tmp_path / "a.jsonl").write_bytes(b"")
    (tmp_path / bad).write_bytes(b"")
    (tmp_path / "c.jsonl").write_bytes(b"")

    files = list_landing(str(tmp_path))  # one bad name does not fail the listing

    assert [f.name for f in files] == sorted(["a.jsonl", bad, "c.jsonl"])
    assert [bool(f.problem) for f in files] == [f.name == bad for f in files]
    [flagged] = [f for f in files if f.problem]
    with pytest.raises(IngestError, match="control character") as info:
        flagged.read_bytes()
    assert str(info.value).startswith(repr(bad)) and "\n" not in str(info.value)


def test_a_name_that_is_not_utf8_is_a_bad_name(tmp_path: Path) -> None:
    (tmp_path / "ok.jsonl").write_bytes(b"")
    os.close(os.open(os.fsencode(tmp_path) + b"/b\xff.jsonl", os.O_CREAT | os.O_WRONLY))
    files = list_landing(str(tmp_path))
    assert [bool(f.problem) for f in files] == [True, False]
    with pytest.raises(IngestError, match="not valid UTF-8"):
        files[0].read_bytes()


def test_hidden_files_and_directories_are_never_listed(tmp_path: Path) -> None:
    names = ["a.jsonl", ".hidden.jsonl", "_SUCCESS.jsonl", "_temporary/0/part-0.jsonl",
             "sub/.part-0.jsonl", "sub/ok.jsonl", "sub/_tmp/x.csv", ".git/x.parquet",
             "..a.jsonl", "b_c/.d/e.jsonl", "b_c/f.jsonl"]
    for name in names:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    listed = [f.name for f in list_landing(str(tmp_path))]
    assert listed == ["a.jsonl", "b_c/f.jsonl", "sub/ok.jsonl"]
    assert is_hidden("x/_temporary/0/p.jsonl") and not is_hidden("a_b/c.jsonl")


def test_a_file_that_changes_after_the_listing_is_not_read_half_written(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'{"key": 1}\n')
    [listed] = list_landing(str(tmp_path))
    with path.open("ab") as fh:  # the writer is not done yet
        fh.write(b'{"key": 2}\n')
    with pytest.raises(LandingFileChanged, match="^a.jsonl: changed while being ingested"):
        listed.read_bytes()
    # Replaced by a file of the same size (an atomic rename): a new version too.
    [listed] = list_landing(str(tmp_path))
    other = tmp_path / "other"
    other.write_bytes(path.read_bytes().replace(b"1", b"3"))
    os.replace(other, path)
    with pytest.raises(LandingFileChanged):
        listed.read_bytes()
    [listed] = list_landing(str(tmp_path))
    assert listed.read_bytes() == b'{"key": 3}\n{"key": 2}\n'
    # A file named, not listed, is read as it is.
    assert landing_file(str(tmp_path), "a.jsonl").read_bytes() == listed.read_bytes()


def test_symlink_out_of_the_landing_location_is_rejected(tmp_path: Path) -> None:
    outside = tmp_path / "secret.jsonl"
    outside.write_bytes(b'{"key": 1}\n')
    land = tmp_path / "land"
    land.mkdir()
    os.symlink(outside, land / "a.jsonl")

    [listed] = list_landing(str(land))
    with pytest.raises(IngestError, match="a.jsonl.*outside"):
        listed.read_bytes()
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
