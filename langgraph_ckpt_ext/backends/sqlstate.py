"""What PostgreSQL's SQLSTATE of an error says: a request the server answered and refused, as
it would refuse it again (not an outage).

Driver-free (asyncpg's and psycopg's errors both carry `exc.sqlstate`), and outside the
`postgres` package, which needs asyncpg: the PostgreSQL backend's store classifies its errors
with it, and so does a wrapper for a LangGraph `PostgresSaver` (psycopg) it wraps.
"""

from __future__ import annotations

REFUSED_CLASSES = ("22", "23", "54")
"""SQLSTATE classes of a refused request: data exception (e.g. a NUL byte in a thread id),
integrity constraint violation, program limit exceeded."""


def refused(exc: BaseException) -> bool:
    """Whether `exc` carries a SQLSTATE of a refused request."""
    sqlstate = getattr(exc, "sqlstate", None)  # an error attribute, not a saver's ability
    return isinstance(sqlstate, str) and sqlstate[:2] in REFUSED_CLASSES
