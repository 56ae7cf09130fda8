"""The one redaction of secrets in URLs: every URL (or text that may quote one) that
reaches an error message, a log line, stdout/stderr or Dagster metadata goes through
:func:`redact_url` first. ``upsert_core.persist.location.urls`` re-exports it.

What counts as a secret, and is replaced by :data:`REDACTED`:

- the password of a URL's userinfo: ``scheme://user:SECRET@host`` (PostgreSQL, and an
  ``s3://KEY_ID:SECRET@bucket`` someone tried). The user name is kept (it is not a
  secret, and it helps to see who connected);
- the value of a ``name=value`` parameter, in a query string (``?`` ``&`` ``;``
  separated) or in a libpq keyword/value string (``password=x host=h``, the value
  possibly single-quoted), whose name, percent-decoded and in any case, contains one of
  :data:`SECRET_NAME_PARTS`: ``password`` (libpq ``password``, ``sslpassword``),
  ``passwd``, ``pwd``, ``secret`` (``aws_secret_access_key``, ``client_secret``),
  ``token`` (``aws_session_token``, ``X-Amz-Security-Token``), ``signature``
  (``X-Amz-Signature`` of a presigned URL), ``credential`` and ``api_key``/``apikey``.

Not secrets, so shown: host, port, database, bucket, prefix, user names, and
parameters naming *files* that hold secrets (libpq ``passfile``, ``sslkey``,
``sslcert``, ``sslrootcert``): a path helps debugging and grants nothing by itself.

Erring on the side of hiding too much: a userinfo password runs to the last ``@``
before whitespace, so a password holding ``@``, ``/`` or quotes is hidden whole.
"""

from __future__ import annotations

import re
from urllib.parse import unquote_plus

REDACTED = "***"
SECRET_NAME_PARTS = (
    "password", "passwd", "pwd", "secret", "token", "signature", "credential", "api_key",
    "apikey",
)

_USERINFO_PASSWORD = re.compile(
    r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^:/@\s'\"]*):(?P<secret>\S*)@"
)
# ``name=value`` after a query separator, whitespace, a quote or the start of the text.
_PARAMETER = re.compile(
    r"(?P<head>(?:^|(?<=[?&;\s'\"(]))(?P<name>[^=?&;#\s'\"()]+)=)"
    r"(?P<value>'(?:\\.|[^'\\])*'|[^&\s]*)"
)


def is_secret_name(name: str) -> bool:
    """Whether a parameter called ``name`` (possibly percent-encoded) holds a secret."""
    decoded = unquote_plus(name).strip().lower().replace("-", "_")
    return any(part in decoded for part in SECRET_NAME_PARTS)


def redact_url(text: str) -> str:
    """``text`` with every secret of every URL in it replaced by ``***`` (see the
    module docstring). Works on a bare URL and on a message that quotes one."""
    text = _USERINFO_PASSWORD.sub(lambda m: f"{m['head']}:{REDACTED}@", text)

    def parameter(m: re.Match[str]) -> str:
        return f"{m['head']}{REDACTED}" if is_secret_name(m["name"]) else m[0]

    return _PARAMETER.sub(parameter, text)
