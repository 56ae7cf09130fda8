"""Names can never escape their place: shard names, blob keys, landing file names.

Hostile names (path traversal, absolute paths, ``..``, backslashes, NUL, control and
bidi characters, fullwidth dots and slashes, other odd Unicode) are either rejected with
the project's errors or, where they are harmless, kept verbatim *inside* the root:

- ``validate_shard_name`` admits only its ASCII alphabet and never ``..``, and every blob
  key derived from an admitted shard name stays under that shard's prefix;
- ``LocalBlob`` keys never resolve outside the blob root (property-tested on random
  names built from dangerous pieces, and checked on disk: nothing appears outside);
- ``S3Blob`` keys never name an object outside the prefix (moto server);
- ``check_name`` / ``list_landing`` / ``landing_file`` reject escaping names and
  symlinks (file or directory) that point outside the landing directory.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from upsert_core.errors import ConfigError, IngestError, InvalidUsage
from upsert_core.landing import check_name, landing_file, list_landing
from upsert_core.persist import keys
from upsert_core.persist.location.blob_local import LocalBlob
from upsert_core.persist.state.state import validate_shard_name

PIECES = [
    "..",
    ".",
    "/",
    "\\",
    "\x00",
    "a",
    "b.jsonl",
    "\uff0e\uff0e",  # fullwidth full stops
    "\uff0f",  # fullwidth solidus
    "\u2215",  # division slash
    "\u202e",  # right-to-left override
    "\u2066",  # left-to-right isolate
    "\u200b",  # zero-width space
    "%2e%2e%2f",
    "~",
    "\n",
    "\u0085",  # next line (a C1 control)
    "e\u0301",  # combining accent
    "\ud800",  # lone surrogate
    "C:",
    "//",
]
HOSTILE = st.lists(st.sampled_from(PIECES), min_size=1, max_size=6).map("".join)
FIXED_HOSTILE = [
    "../escape",
    "../../etc/passwd",
    "/etc/passwd",
    "a/../../b",
    "a/./b",
    "a//b",
    "a\\..\\b",
    "..\\escape",
    "nul\x00byte",
    ".",
    "..",
    "",
    "a/",
    "/",
]
ESCAPING_LANDING_NAMES = [
    *FIXED_HOSTILE,
    "a\u202eb.jsonl",  # displays as another name
    "a\u2066b.jsonl",
    "line\nbreak.jsonl",
    "tab\tname.jsonl",
]


# --- shard names -------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        *FIXED_HOSTILE,
        "a..b",
        "-dash",
        ".hidden",
        "a/b",
        "x'; DROP TABLE consensus; --",
        'a"b',
        "a b",
        "\uff0e\uff0e",
        "a\u202eb",
        "é",
        "a" * 129,
    ],
)
def test_hostile_shard_names_are_rejected(name: str) -> None:
    with pytest.raises(ConfigError, match="invalid shard name"):
        validate_shard_name(name)


@settings(max_examples=300)
@given(name=st.text(max_size=20))
def test_admitted_shard_names_keep_keys_under_their_prefix(name: str) -> None:
    try:
        validate_shard_name(name)
    except ConfigError:
        return
    prefix = keys.shard_prefix(name)
    for key in (
        keys.part_key(name),
        keys.error_part_key(name),
        keys.rollup_key(name, 7),
        keys.checkpoint_prefix(name) + "x",
    ):
        assert key.startswith(prefix)
        segments = key.split("/")
        assert ".." not in segments and "." not in segments and "" not in segments[:-1]


# --- local blob keys -----------------------------------------------------------------


def _outside_files(tmp_path: Path, root: Path) -> list[Path]:
    return [p for p in tmp_path.rglob("*") if p.is_file() and not p.is_relative_to(root)]


@pytest.mark.parametrize("key", FIXED_HOSTILE)
def test_local_blob_rejects_escaping_keys(tmp_path: Path, key: str) -> None:
    blob = LocalBlob(tmp_path / "root")
    for op in (
        lambda: blob.set(key, b"x"),
        lambda: blob.get(key),
        lambda: blob.delete(key),
        lambda: blob.open_reader(key),
    ):
        with pytest.raises((ConfigError, InvalidUsage)):
            op()
    assert _outside_files(tmp_path, blob.root) == []


@settings(max_examples=300)
@given(key=HOSTILE)
def test_local_blob_keys_never_leave_the_root(
    tmp_path_factory: pytest.TempPathFactory, key: str
) -> None:
    base = tmp_path_factory.mktemp("blob")
    blob = LocalBlob(base / "root")
    try:
        blob.set(key, b"payload")
    except (ConfigError, InvalidUsage):
        return
    written = [p for p in base.rglob("*") if p.is_file()]
    assert written and all(p.resolve().is_relative_to(blob.root) for p in written)
    assert blob.get(key) == b"payload"
    assert key in {m.key for m in blob.list_keys("")}


def test_local_blob_symlinked_directory_cannot_lead_out(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "root"
    blob = LocalBlob(root)
    (root / "link").symlink_to(outside, target_is_directory=True)
    (outside / "there").write_bytes(b"outside")
    for op in (
        lambda: blob.set("link/planted", b"x"),
        lambda: blob.get("link/there"),
        lambda: blob.delete("link/there"),
    ):
        with pytest.raises(ConfigError, match="resolves outside"):
            op()
    assert sorted(p.name for p in outside.iterdir()) == ["there"]


# --- S3 blob keys --------------------------------------------------------------------


@pytest.mark.s3
@pytest.mark.parametrize("key", ["../escape", "a/../../escape", "./x", "a//b", "/abs"])
def test_s3_blob_keys_stay_under_the_prefix(s3_endpoint: str, s3_bucket: str, key: str) -> None:
    from tests.services import AWS_TEST_CREDENTIALS
    from upsert_core.persist.location.blob_s3 import S3Blob

    os.environ.setdefault("AWS_ACCESS_KEY_ID", AWS_TEST_CREDENTIALS["aws_access_key_id"])
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", AWS_TEST_CREDENTIALS["aws_secret_access_key"])
    blob = S3Blob(s3_bucket, "tenant/a", s3_endpoint, region_name="us-east-1")
    with pytest.raises(ConfigError):
        blob.set(key, b"x")
    import boto3

    client = boto3.client("s3", endpoint_url=s3_endpoint, **AWS_TEST_CREDENTIALS)
    listed = [o["Key"] for o in client.list_objects_v2(Bucket=s3_bucket).get("Contents", [])]
    for name in listed:
        parts = name.split("/")
        assert name.startswith("tenant/a/") and ".." not in parts and "." not in parts, name


# --- landing names -------------------------------------------------------------------


@pytest.mark.parametrize("name", ESCAPING_LANDING_NAMES)
def test_landing_names_that_escape_are_rejected(tmp_path: Path, name: str) -> None:
    with pytest.raises(IngestError):
        check_name(name)
    with pytest.raises(IngestError):
        landing_file(str(tmp_path), name)


@pytest.mark.parametrize("name", ["\uff0e\uff0e\uff0fx.jsonl", "a\u2215b.jsonl", "é.jsonl"])
def test_odd_unicode_landing_names_stay_inside(tmp_path: Path, name: str) -> None:
    """Fullwidth dots/slashes are ordinary characters on POSIX: a file in the root."""
    (tmp_path / name).write_bytes(b"")
    f = landing_file(str(tmp_path), check_name(name))
    assert f.read_bytes() == b""
    assert [x.name for x in list_landing(str(tmp_path))] == [name]


@settings(max_examples=300)
@given(name=HOSTILE)
def test_accepted_landing_names_resolve_inside(name: str) -> None:
    root = "/srv/landing"
    try:
        check_name(name)
    except IngestError:
        return
    resolved = os.path.normpath(os.path.join(root, *name.split("/")))
    assert resolved.startswith(root + "/")
    assert "\\" not in name and "\x00" not in name and not name.startswith("/")


def test_symlinks_pointing_out_of_the_landing_are_rejected(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "passwd.jsonl").write_text('{"key": 1, "offset": 1}\n')
    landing = tmp_path / "landing"
    landing.mkdir()
    (landing / "ok.jsonl").write_text("")
    (landing / "evil.jsonl").symlink_to(secret / "passwd.jsonl")
    # Listed with its problem (one bad file must not fail the whole listing), and
    # refused when read: its bytes are never opened.
    evil, ok = list_landing(str(landing))
    assert evil.name == "evil.jsonl" and not ok.problem
    with pytest.raises(IngestError, match="evil.jsonl: symlink points outside"):
        evil.read_bytes()
    with pytest.raises(IngestError, match="outside the landing"):
        landing_file(str(landing), "evil.jsonl").read_bytes()

    (landing / "evil.jsonl").unlink()
    (landing / "dir").symlink_to(secret, target_is_directory=True)
    # os.walk does not follow directory links, so the outside file is never listed...
    assert [f.name for f in list_landing(str(landing))] == ["ok.jsonl"]
    # ...and naming it explicitly is refused.
    with pytest.raises(IngestError, match="outside the landing"):
        landing_file(str(landing), "dir/passwd.jsonl")


def test_a_symlink_inside_the_landing_is_fine(tmp_path: Path) -> None:
    (tmp_path / "real.jsonl").write_text("")
    (tmp_path / "alias.jsonl").symlink_to(tmp_path / "real.jsonl")
    assert [f.name for f in list_landing(str(tmp_path))] == ["alias.jsonl", "real.jsonl"]


@given(st.text(max_size=12))
def test_the_printable_fast_path_refuses_exactly_what_the_character_rules_do(name: str) -> None:
    """``check_name`` looks at characters one by one only for names that are not
    printable; it must refuse exactly the names the per-character rules refuse."""
    import unicodedata

    from upsert_core.landing.listing import _is_control, check_name

    def refused_by_rules(text: str) -> bool:
        bad_char = any(_is_control(ch) or unicodedata.category(ch) == "Cs" for ch in text)
        parts = text.split("/")
        return (not text or bad_char or "\\" in text or text.startswith("/")
                or any(p in ("", ".", "..") for p in parts))

    try:
        check_name(name)
        refused = False
    except IngestError:
        refused = True
    assert refused == refused_by_rules(name)
