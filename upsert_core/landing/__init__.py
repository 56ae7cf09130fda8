"""Landing files: listing, reading, validation and row encoding (one file at a time).

The first stage of an ingest. Pure Python + pyarrow, so it runs inside Spark tasks:
``list_landing`` -> ``pending`` -> ``validate_file`` (per file, in name order, each
against the schema the previous file left) -> ``ValidatedBatch`` for the upsert
operator and ``RowError``\\ s for the error collection; per-source value checks
(``value_checks``, pandera) run inside ``validate_file`` on the rows that passed.
"""

from upsert_core.landing.batch import RawBatch, RowError, SourceKind
from upsert_core.landing.listing import (
    SUFFIXES,
    LandingFile,
    check_name,
    landing_file,
    list_landing,
    normalise_root,
    pending,
)
from upsert_core.landing.readers import read_batch, read_csv, read_jsonl, read_parquet
from upsert_core.landing.rows import decode_row, decode_rows_to_table, encode_key, encode_row
from upsert_core.landing.schema import ARROW_TYPES, LogicalType, SourceSchema
from upsert_core.landing.validate import (
    ARROW_SCHEMA,
    ERRORS_ARROW_SCHEMA,
    ValidatedBatch,
    validate_batch,
    validate_chunks,
    validate_file,
)
from upsert_core.landing.value_checks import (
    CheckKind,
    ValueCheck,
    failed_checks,
    parse_value_checks,
)

__all__ = [
    "ARROW_SCHEMA",
    "ARROW_TYPES",
    "CheckKind",
    "ERRORS_ARROW_SCHEMA",
    "SUFFIXES",
    "LandingFile",
    "LogicalType",
    "RawBatch",
    "RowError",
    "SourceKind",
    "SourceSchema",
    "ValidatedBatch",
    "ValueCheck",
    "check_name",
    "decode_row",
    "decode_rows_to_table",
    "encode_key",
    "encode_row",
    "failed_checks",
    "landing_file",
    "list_landing",
    "normalise_root",
    "parse_value_checks",
    "pending",
    "read_batch",
    "read_csv",
    "read_jsonl",
    "read_parquet",
    "validate_batch",
    "validate_chunks",
    "validate_file",
]
