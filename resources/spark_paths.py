"""Which path of the Spark engine a run's pending files take, chosen here and only here
(from the listing: no session, no read, no pyspark import):

- **group** (``resources/spark_group.py``): several pending files, from the run's next
  one on, as ONE Spark job (``ingest.group``): :func:`group_size` files while each would
  take the one-stage path on its own, at most ``UPSERT_SPARK_GROUP_FILES`` (default
  256; ``1`` turns grouping off) and ``UPSERT_SPARK_GROUP_BYTES`` (default 256 MiB) of
  them. Below two files there is no group.
- **split** (``resources/spark_split.py``): one file read once by several read tasks
  and shuffled by bucket (:func:`split_plan`: ``UPSERT_SPARK_SPLIT`` auto|on|off,
  ``UPSERT_SPARK_SPLIT_BYTES``).
- **one stage** (``resources/spark_ingest.py``): any other file on its own.

Why groups take only files of the one-stage path: a group's tasks read every file of
the group themselves, as the one-stage path's do (cheap for small files, and what makes
one job of them without a shuffle); a file worth splitting is worth its own job. Why a
bound: a group's job holds its files' result lines and, on a failure, loses their work;
its tasks hold one file's rows at a time and their buckets' states, as a worker's state
cache does, whatever the bound.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from upsert_core.errors import ConfigError
from upsert_core.ingest.tasks import FileTask
from upsert_core.landing import LandingFile
from upsert_core.landing.splits import Split, plan_splits, splittable

SPLIT_ENV = "UPSERT_SPARK_SPLIT"
"""``auto`` (default), ``on`` or ``off``: whether a file is read by the split path."""
SPLIT_BYTES_ENV = "UPSERT_SPARK_SPLIT_BYTES"
"""Bytes per read task of the split path; ``auto`` splits files larger than this."""
DEFAULT_SPLIT_BYTES = 32 << 20

GROUP_FILES_ENV = "UPSERT_SPARK_GROUP_FILES"
"""At most this many files run as one job (``1``: every file its own job)."""
DEFAULT_GROUP_FILES = 256
GROUP_BYTES_ENV = "UPSERT_SPARK_GROUP_BYTES"
"""At most this many bytes of files run as one job (a larger first file runs alone)."""
DEFAULT_GROUP_BYTES = 256 << 20


def _whole_number(name: str, default: int) -> int:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise ConfigError(f"{name} must be a whole number >= 1, got {text!r}")
    return int(text)


def split_mode() -> str:
    """``UPSERT_SPARK_SPLIT``: ``auto`` (default), ``on`` or ``off``."""
    text = os.environ.get(SPLIT_ENV, "").strip().lower() or "auto"
    if text not in ("auto", "on", "off"):
        raise ConfigError(f"{SPLIT_ENV} must be auto, on or off, got {text!r}")
    return text


def split_bytes() -> int:
    """``UPSERT_SPARK_SPLIT_BYTES`` (default 32 MiB): bytes per read task."""
    text = os.environ.get(SPLIT_BYTES_ENV, "").strip()
    if not text:
        return DEFAULT_SPLIT_BYTES
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise ConfigError(f"{SPLIT_BYTES_ENV} must be a whole number of bytes >= 1, got {text!r}")
    return int(text)


def _may_split(file: LandingFile, envelope: str) -> bool:
    """Whether the split path may read ``file`` (with enough slices, in ``auto``)."""
    mode = split_mode()
    if mode == "off" or envelope != "plain" or not splittable(file):
        return False
    return mode == "on" or file.size > split_bytes()


def split_plan(task: FileTask, slices: int) -> list[Split] | None:
    """The splits ``task``'s file is read as, or None for the one-stage path: ``off``
    never splits; ``on`` splits every file that can be split (Parquet, JSON Lines; plain
    envelope); ``auto`` those larger than ``UPSERT_SPARK_SPLIT_BYTES`` when more than
    one slice would read the file on the one-stage path (one slice reads it once too)."""
    if not _may_split(task.file, task.envelope):
        return None
    if split_mode() == "auto" and slices < 2:
        return None
    return plan_splits(task.file, split_bytes())


def group_files() -> int:
    """``UPSERT_SPARK_GROUP_FILES`` (default 256; 1: no groups)."""
    return _whole_number(GROUP_FILES_ENV, DEFAULT_GROUP_FILES)


def group_bytes() -> int:
    """``UPSERT_SPARK_GROUP_BYTES`` (default 256 MiB)."""
    return _whole_number(GROUP_BYTES_ENV, DEFAULT_GROUP_BYTES)


def group_size(files: Sequence[LandingFile], envelope: str) -> int:
    """How many of ``files`` (a run's pending files in name order), from the first on,
    run as one group: those before the first the split path may read, within the
    bounds; 0 when that is fewer than two (see the module docstring)."""
    most, budget = group_files(), group_bytes()
    count = total = 0
    for file in files:
        size = max(0, file.size)
        if count >= most or _may_split(file, envelope) or (count and total + size > budget):
            break
        count, total = count + 1, total + size
    return count if count >= 2 else 0
