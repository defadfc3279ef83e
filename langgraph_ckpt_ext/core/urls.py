"""Checkpointer URLs: the one parser (`parse_url`) that `connect`, `from_conn_string`, the CLI
and replica URLs share, and the one redactor (`redact`) every message that quotes a URL uses.

No I/O: a URL is read, its options checked and typed, and nothing is opened. The query options
each scheme takes are ours (`OPTIONS`); the others go to the driver where it understands them.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast
from urllib.parse import quote, unquote, unquote_plus, urlsplit

from .errors import InvalidConfigError

BACKENDS = {"memory": "memory", "sqlite": "sqlite", "postgres": "postgres",
            "postgresql": "postgres", "redis": "redis", "rediss": "redis",
            "redis+sentinel": "redis"}
"""URL scheme -> backend."""

FORMS = ("memory://, sqlite:///relative/path.db, sqlite:////absolute/path.db, "
         "postgresql://user@host:5432/db, redis://host:6379/0 or "
         "redis+sentinel://host:26379,host:26380/service/0")

SENTINEL = "redis+sentinel"
SENTINEL_PORT = 26379
SENTINEL_OPTIONS = ("sentinel_username", "sentinel_password")
"""Query options of a `redis+sentinel://` URL for the sentinels themselves (left in the
target: the driver side reads them with `parse_sentinel`)."""

ENCODE = ("percent-encode '#', '/', '?' and '@' in the password (%23, %2F, %3F, %40)")

_SYNC_LEVELS = ("OFF", "NORMAL", "FULL", "EXTRA")
_MODES = ("ro", "rw", "rwc")


def _seconds(name: str, value: str, *, zero: bool = True) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not (seconds >= 0 if zero else seconds > 0) or seconds == float("inf"):
        raise ValueError(f"{name} must be a {'' if zero else 'positive '}number of seconds, "
                         f"got {value!r}")
    return seconds


def _count(name: str, value: str) -> int:
    if not value.isdigit():
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    return int(value)


def _one_of(name: str, value: str, allowed: tuple[str, ...], case: Callable[[str], str]
            ) -> str:
    if case(value) not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
    return case(value)


def _text(name: str, value: str) -> str:
    if not value:
        raise ValueError(f"{name} is empty")
    return value


_Convert = Callable[[str, str], Any]

_WRITERS = ("single", "last_wins")


def _hosts(name: str, value: str) -> list[str]:
    hosts = [h.strip() for h in value.split(",") if h.strip()]
    if not hosts:
        raise ValueError(f"{name} needs host:port,...")
    return hosts


def _tombstone_ttl(name: str, value: str) -> float | None:
    return None if value.lower() in ("none", "off") else _seconds(name, value, zero=False)


def _redact_metadata(name: str, value: str) -> bool | list[str]:
    """true / false, or comma-separated key names added to the default list."""
    if value.lower() in ("true", "1", "yes", "on"):
        return True
    if value.lower() in ("false", "0", "no", "off"):
        return False
    names = [n.strip() for n in value.split(",") if n.strip()]
    if not names:
        raise ValueError(f"{name} must be true, false or key names separated by commas, "
                         f"got {value!r}")
    return names


def _compression(name: str, value: str) -> bool:
    return _one_of(name, value, ("zstd", "none"), str.lower) == "zstd"


def _encryption(name: str, value: str) -> Any:
    """`env`: keys from $LGCKPT_KEYS (`EnvKeys`), read when the URL is."""
    _one_of(name, value, ("env",), str.lower)
    from .keys import EnvKeys
    from .sealing import Encryption

    return Encryption(EnvKeys())


# Options of every backend (the one-writer rule, `core.guard`; secrets, compression and
# encryption at rest, `core.redact` and `core.sealing`).
_COMMON: dict[str, tuple[_Convert, str]] = {
    "redact_metadata": (_redact_metadata, "true (drop secrets such as api_key from checkpoint "
                        "metadata), false, or more key names, comma-separated"),
    "compression": (_compression, "zstd (compress stored values) or none"),
    "encryption": (_encryption, "env: encrypt stored values with the keys in $LGCKPT_KEYS "
                   "(id:base64key,...; the current one $LGCKPT_KEY_CURRENT, else the last)"),
    "writers": (lambda n, v: _one_of(n, v, _WRITERS, str.lower),
                "single (refuse a run's write when another run wrote since it read) or "
                "last_wins"),
    "tombstone_ttl": (_tombstone_ttl, "seconds a deleted thread refuses late writes "
                      "(none: no tombstones)"),
}

OPTIONS: dict[str, dict[str, tuple[_Convert, str]]] = {
    "memory": {},
    "sqlite": {
        "busy_timeout": (_seconds, "seconds to wait for another writer"),
        "synchronous": (lambda n, v: _one_of(n, v, _SYNC_LEVELS, str.upper),
                        "PRAGMA synchronous: " + ", ".join(_SYNC_LEVELS)),
        "mode": (lambda n, v: _one_of(n, v, _MODES, str.lower),
                 "ro (read-only), rw (the file must exist) or rwc"),
    },
    "postgres": {
        "schema": (_text, "the PostgreSQL schema of the tables"),
        "min_size": (_count, "connections the pool keeps open"),
        "max_size": (_count, "connections the pool opens at most"),
        "read_replicas": (_hosts, "read replicas, host:port,... (the rest as in this URL)"),
    },
    "redis": {
        "key_prefix": (_text, "the first part of every key"),
        "ttl": (lambda n, v: _seconds(n, v, zero=False), "seconds a thread lives"),
        "wait_replicas": (_count, "replicas that must acknowledge each write (WAIT)"),
        "wait_timeout": (lambda n, v: _seconds(n, v, zero=False),
                         "seconds a write waits for those replicas"),
    },
}
"""Per backend: the query options that are ours (taken out of the URL and given to the
checkpointer's constructor as keyword arguments), with their conversion and meaning."""
for _options in OPTIONS.values():
    _options.update(_COMMON)


@dataclass(frozen=True)
class ParsedURL:
    """A checkpointer URL, read.

    Attributes:
        scheme: as written (`postgresql`, `rediss`, ...).
        backend: `memory`, `sqlite`, `postgres` or `redis`.
        target: what the backend opens: the SQLite file (`":memory:"`), or the URL the driver
            gets, without our options (it may hold a password: print `redacted` instead).
        options: our query options, typed, for the checkpointer's constructor.
        redacted: the URL as given, its password shown as `***`.
    """

    scheme: str
    backend: str
    target: str = field(repr=False)
    options: Mapping[str, Any]
    redacted: str

    def __str__(self) -> str:
        return self.redacted

    def arguments(self, given: Mapping[str, Any] | None = None, *, backend: str | None = None
                  ) -> tuple[str, dict[str, Any]]:
        """`(conn, keyword arguments)` for the backend's constructor: our options from the URL
        with `given` (keyword options) added. Raises `InvalidConfigError` for an option given
        both ways, or a URL of another backend than `backend`."""
        if backend is not None and backend != self.backend:
            raise InvalidConfigError(
                f"{self.redacted!r} is a {self.backend} URL: this checkpointer takes a "
                f"{backend} one")
        kwargs = dict(given or {})
        for name, value in self.options.items():
            if name in kwargs:
                raise InvalidConfigError(
                    f"{name} is given twice (in the URL and as an option): keep one")
            kwargs[name] = value
        conn = self.target
        mode = kwargs.pop("mode", None) if self.backend == "sqlite" else None
        if mode is not None and conn != ":memory:":
            conn = f"file:{quote(os.path.abspath(conn))}?mode={mode}"
            if mode == "ro":
                kwargs.setdefault("setup", False)  # creating tables would write
        return conn, kwargs


def parse_url(url: str) -> ParsedURL:
    """Read a checkpointer URL: `memory://`, `sqlite:///relative.db`,
    `sqlite:////absolute/path.db` (`sqlite://` alone: in memory), `postgresql://...`,
    `redis://...` or `rediss://...`, each with the query options of `OPTIONS`.

    Raises `InvalidConfigError`, its message showing the URL without its password, for an
    unknown scheme, a `sqlite://` URL with a host (it names the right form), an unknown or
    misplaced option (by name), a bad option value, or a password that parsers would cut
    differently (holding an unencoded '#', '/', '?' or '@').

    Example:
        >>> parse_url("sqlite:///agent.db?busy_timeout=5").options
        {'busy_timeout': 5.0}
    """
    if not isinstance(url, str):
        raise InvalidConfigError(f"a checkpointer URL is a string, got {type(url).__name__}")
    shown = redact(url)
    scheme, sep, rest = url.partition("://")
    backend = BACKENDS.get(scheme.lower()) if sep else None
    if not sep and url.lower().startswith("sqlite:"):
        raise InvalidConfigError(
            f"{shown!r} is no SQLite URL: write sqlite:///{url[7:]} (three slashes and a "
            "relative path, as sqlite:///agent.db; four for an absolute one, as "
            "sqlite:////var/lib/agent.db)")
    if backend is None:
        what = f"URL scheme {scheme!r}" if sep and scheme else "URL without a scheme"
        raise InvalidConfigError(f"unsupported {what} in {shown!r}: use {FORMS}")
    if ambiguous_url(url):
        raise InvalidConfigError(f"cannot tell the password from the host in {shown!r}: "
                                 f"{ENCODE}")
    if backend == "sqlite":
        return _sqlite(scheme, rest, shown)
    base, _, query = url.partition("?")
    query, _, fragment = query.partition("#")
    pairs = _query(query, shown)
    options = _ours(backend, pairs, shown)
    if backend == "memory":
        if base.rstrip("/") != "memory:":
            raise InvalidConfigError(f"{shown!r}: an in-memory checkpointer is memory://")
        return ParsedURL(scheme, backend, "", options, shown)
    if scheme.lower() == SENTINEL:
        parse_sentinel(url)
    else:
        _check_netloc(url, shown, multi_host=backend == "postgres")
    if backend == "redis":
        _check_redis_options(pairs, shown, sentinel=scheme.lower() == SENTINEL)
    kept = [raw for name, _, raw in pairs if name not in options]
    target = base + ("?" + "&".join(kept) if kept else "") + ("#" + fragment if fragment else "")
    return ParsedURL(scheme, backend, target, options, shown)


def _sqlite(scheme: str, rest: str, shown: str) -> ParsedURL:
    where, _, query = rest.partition("?")
    options = _ours("sqlite", _query(query, shown), shown)
    if where in ("", "/", ":memory:", "/:memory:"):
        return ParsedURL(scheme, "sqlite", ":memory:", options, shown)
    if not where.startswith("/"):
        host = where.split("/", 1)[0]
        raise InvalidConfigError(
            f"{shown!r} names a host ({host!r}), and a SQLite URL has none: write "
            f"sqlite:///{rest} for a path relative to the current directory, or "
            f"sqlite:////absolute/path.db (four slashes) for an absolute one")
    return ParsedURL(scheme, "sqlite", unquote(where[1:]), options, shown)


def _query(query: str, shown: str) -> list[tuple[str, str, str]]:
    """`(name, value, as written)` of each query parameter; a name given twice is refused."""
    pairs = []
    for raw in query.split("&"):
        if not raw:
            continue
        name, _, value = raw.partition("=")
        pairs.append((unquote_plus(name), unquote_plus(value), raw))
    names = [n for n, _, _ in pairs]
    for name in names:
        if names.count(name) > 1:
            raise InvalidConfigError(f"option {name!r} is given twice in {shown!r}: keep one")
    return pairs


def _ours(backend: str, pairs: list[tuple[str, str, str]], shown: str) -> dict[str, Any]:
    """Our options among `pairs`, converted; an option of another backend is refused, and for
    SQLite and memory (which have no driver options) any option not ours."""
    own = OPTIONS[backend]
    options: dict[str, Any] = {}
    for name, value, _ in pairs:
        if name in own:
            try:
                options[name] = own[name][0](name, value)
            except ValueError as exc:
                raise InvalidConfigError(f"{exc} in {shown!r}") from None
            continue
        other = [b for b, opts in OPTIONS.items() if name in opts]
        if other or backend in ("sqlite", "memory"):
            why = f"an option of {other[0]} URLs" if other else "unknown"
            raise InvalidConfigError(f"option {name!r} in {shown!r} is {why}: "
                                     f"{_takes(backend)}")
    return options


def _takes(backend: str) -> str:
    own = OPTIONS[backend]
    if not own:
        return f"a {backend} URL takes no options"
    listed = "; ".join(f"{name} ({what})" for name, (_, what) in own.items())
    tail = {"postgres": "; and asyncpg's DSN parameters (sslmode, application_name, ...)",
            "redis": "; and redis-py's URL options (socket_timeout, ...)"}.get(backend, "")
    return f"a {backend} URL takes {listed}{tail}"


def _check_netloc(url: str, shown: str, *, multi_host: bool = False) -> None:
    """Refuse a port that is no number; `multi_host`: each of `h1:5432,h2:5433` checked (as
    libpq and asyncpg take a list of hosts)."""
    try:
        parts = urlsplit(url)
        hosts = parts.netloc.rpartition("@")[2].split(",") if multi_host else [""]
        for host in hosts:
            (urlsplit(f"{parts.scheme}://{host}") if host else parts).port  # noqa: B018
    except ValueError as exc:
        raise InvalidConfigError(f"malformed URL {shown!r}: {mask(str(exc), url_secrets(url))}"
                                 ) from None


def _check_redis_options(pairs: list[tuple[str, str, str]], shown: str, *, sentinel: bool
                         ) -> None:
    """Refuse a query option redis-py would refuse only once it opens a connection."""
    known = _redis_driver_options()
    if known is None:  # redis-py not installed: `connect` says which pip install fixes it
        return
    if sentinel:
        known |= set(SENTINEL_OPTIONS)
    for name, _, _ in pairs:
        if name not in known and name not in OPTIONS["redis"]:
            raise InvalidConfigError(f"option {name!r} in {shown!r} is unknown: "
                                     f"{_takes('redis')}")


def _redis_driver_options() -> frozenset[str] | None:
    try:
        from redis.asyncio import connection
        from redis.connection import URL_QUERY_ARGUMENT_PARSERS
    except ImportError:
        return None
    names = set(URL_QUERY_ARGUMENT_PARSERS)
    for cls in (connection.AbstractConnection, connection.Connection,
                connection.SSLConnection, connection.UnixDomainSocketConnection):
        names |= set(inspect.signature(cls.__init__).parameters)
    return frozenset(names - {"self", "args", "kwargs"})


@dataclass(frozen=True)
class SentinelURL:
    """A `redis+sentinel://` URL, read (`parse_sentinel`).

    Attributes:
        sentinels: `(host, port)` of each sentinel, in the URL's order.
        service: the name the sentinels monitor the master under.
        db: the database number on the master.
        username, password: the master's credentials (None: none).
        query: the remaining query options, decoded (redis-py's, and `SENTINEL_OPTIONS`).
    """

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int
    username: str | None = field(repr=False)
    password: str | None = field(repr=False)
    query: tuple[tuple[str, str], ...] = field(repr=False)


def parse_sentinel(url: str) -> SentinelURL:
    """Read `redis+sentinel://[user[:password]@]host[:port][,host[:port]...]/service[/db]`
    (port 26379 by default, db 0). Raises `InvalidConfigError` for a URL of another form."""
    shown = redact(url)
    base, _, query = url.partition("?")
    query = query.partition("#")[0]
    rest = base.partition("://")[2]
    parts = _credentials(base)
    user = password = None
    if parts is not None:
        rest = parts[2][1:]
        name, colon, secret = parts[1].partition(":")
        user, password = unquote(name) or None, unquote(secret) if colon else None
    hosts, _, path = rest.partition("/")
    service, _, db = path.strip("/").partition("/")
    if not hosts or not service:
        raise InvalidConfigError(f"{shown!r} names no sentinel or no service: write "
                                 "redis+sentinel://host:26379,host:26380/service/0")
    if not (db or "0").isdigit():
        raise InvalidConfigError(f"the database of {shown!r} is no number: {db!r}")
    return SentinelURL(tuple(_sentinel(h, shown) for h in hosts.split(",")), unquote(service),
                       int(db or 0), user, password,
                       tuple((n, v) for n, v, _ in _query(query, shown)))


def _sentinel(where: str, shown: str) -> tuple[str, int]:
    if where.startswith("["):  # an IPv6 address
        host, _, port = where[1:].partition("]")
        port = port.removeprefix(":")
    else:
        host, _, port = where.partition(":")
    port = port or str(SENTINEL_PORT)
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidConfigError(f"sentinel {where!r} in {shown!r} is no host:port")
    return host, int(port)


# -- redaction ----------------------------------------------------------------------------------

# A password is hidden as every parser may read it: urlsplit's (the host ends at the first
# '#', '/' or '?'), and all from "://" to the URL's *last* '@' (what one holding those, or an
# '@', unencoded, really is), with the pieces a driver may cut it into. Hiding too much in
# an odd URL beats printing a piece of a password.
_QUERY_SECRET = re.compile(r"([?&;][^=&#]*(?:pass|pwd|secret|token)[^=&#]*=)([^&]*)", re.I)


def redact(url: str) -> str:
    """`url` fit for a message, a log or a `repr`: its password, and query parameters that
    hold one (`?password=`), shown as `***`, whatever the URL looks like."""
    return mask(url, url_secrets(url))


_URL_IN_TEXT = re.compile(r"\b[a-z][a-z0-9+.-]*://\S+", re.I)


def redact_text(text: str) -> str:
    """`text` (an error's message, say) with the password of every URL it quotes, and query
    parameters that hold one, shown as `***`."""
    secrets = [s for url in _URL_IN_TEXT.findall(text) for s in url_secrets(url)]
    return mask(text, secrets) if secrets else text


def url_secrets(url: str) -> list[str]:
    """What in `url` must never be printed: the password (as written, decoded, and each piece
    a parser may cut it into) and the values of query parameters that hold one."""
    found = [m.group(2) for m in _QUERY_SECRET.finditer(url)]
    parts = _credentials(url)
    if parts is not None and ":" in parts[1]:
        found += _pieces(parts[1].split(":", 1)[1])
    with contextlib.suppress(ValueError):
        found.append(urlsplit(url).password or "")
    return sorted({v for s in found for v in (s, unquote(s), unquote_plus(s)) if v})


def ambiguous_url(url: str) -> bool:
    """Whether parsers may cut `url` into different user, password and host: a password
    holding an unencoded '#', '/', '?' or '@' (a driver's message may then quote a piece of
    it that no rule can tell from the rest)."""
    parts = _credentials(url)
    if parts is None or ":" not in parts[1]:
        return False  # no password
    try:
        netloc = urlsplit(url).netloc
    except ValueError:
        return True
    return "@" in parts[1] or netloc.rpartition("@")[0] != parts[1]


def _credentials(url: str) -> tuple[str, str, str] | None:
    """(up to the user, user[:password], from the last '@') of `url`; None without a '@', or
    for a file (a SQLite path may hold both ':' and '@')."""
    start = url.find("://")
    start = 0 if start < 0 else start + 3
    at = url.rfind("@")
    if at < start or url[:start].lower().endswith("sqlite://"):
        return None
    return url[:start], url[start:at], url[at:]


def _pieces(password: str) -> list[str]:
    """`password`, and each part of it from its start or a '#', '/', '?', '@' or ':' to its
    end or another (3 characters or more): what a parser that cuts the URL there may quote."""
    cuts = [i for i, ch in enumerate(password) if ch in "#/?@:"]
    starts, ends = [0, *(i + 1 for i in cuts)], [*cuts, len(password)]
    return [password, *(password[a:b] for a in starts for b in ends if b - a >= 3)]


def mask(text: str, secrets: Iterable[str]) -> str:
    """`text` with each occurrence of each secret shown as `***`; secrets that overlap (two
    readings of one password) hidden as one run, so that no piece of either shows."""
    spans = sorted(
        (at, at + len(secret)) for secret in secrets if secret
        for at in _occurrences(text, secret)
    )
    runs: list[list[int]] = []
    for start, end in spans:
        if runs and start <= runs[-1][1]:
            runs[-1][1] = max(runs[-1][1], end)
        else:
            runs.append([start, end])
    parts, pos = [], 0
    for start, end in runs:
        parts += [text[pos:start], "***"]
        pos = end
    return "".join(parts) + text[pos:]


def _occurrences(text: str, part: str) -> Iterator[int]:
    at = text.find(part)
    while at >= 0:
        yield at
        at = text.find(part, at + 1)


def url_backend(conn: object) -> str | None:
    """The backend a URL string names by its scheme (`sqlite:` too), else None: a path, a DSN
    of keywords, a client."""
    if not isinstance(conn, str):
        return None
    scheme, sep, _ = conn.partition("://")
    if sep:
        return BACKENDS.get(scheme.lower())
    return "sqlite" if conn.lower().startswith("sqlite:") else None


InitT = TypeVar("InitT", bound=Callable[..., None])


def reads_url(backend: str) -> Callable[[InitT], InitT]:
    """A constructor that, given a URL of its backend, reads the URL's options exactly as
    `connect` does (`ParsedURL.arguments`: an option given both in the URL and as an argument
    is refused); any other `conn` goes through as it is."""

    def decorate(init: InitT) -> InitT:
        @functools.wraps(init)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            conn = args[0] if args else kwargs.get("conn")
            if url_backend(conn) is None:
                init(self, *args, **kwargs)
                return
            options = {k: v for k, v in kwargs.items() if k != "conn"}
            target, merged = parse_url(str(conn)).arguments(options, backend=backend)
            if target == conn and merged == options:  # nothing of ours in it (idempotent)
                init(self, *args, **kwargs)
                return
            init(self, target, *args[1:], **merged)

        return cast(InitT, __init__)

    return decorate
