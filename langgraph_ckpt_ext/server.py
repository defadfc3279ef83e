"""Our checkpointers under LangGraph's own server (`langgraph dev`, `langgraph up`, LangGraph
Platform), named in `langgraph.json`:

    {"checkpointer": {"path": "langgraph_ckpt_ext.server:checkpointer",
                      "ttl": {"strategy": "delete", "default_ttl": 1440}}}

`checkpointer` is the ready factory: it reads `ServerSettings.from_env()` (the URL from
`LGCKPT_URL`, the `ttl` and `serde` of the `checkpointer` object the server hands over as
`LANGGRAPH_CHECKPOINTER`) and yields what `connect` opens. `open_checkpointer` does the same
from arguments, for a factory of one's own (a wrapper, encryption keys, a retention policy).
See docs/server.md. A top-level module: it may import `core`, the backends and `connecting`.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from .connecting import connect
from .core.errors import InvalidConfigError
from .core.retention import Retention, SweepSchedule
from .core.urls import parse_url

if TYPE_CHECKING:
    from .backends.checkpointer import Checkpointer

URL_VAR = "LGCKPT_URL"
SWEEP_VAR = "LGCKPT_SWEEP_EVERY"
CHECKPOINTER_VAR = "LANGGRAPH_CHECKPOINTER"
THREAD_TTL_VAR = "LANGGRAPH_THREAD_TTL"
SERDE_KEYS = ("allowed_json_modules", "allowed_msgpack_modules", "pickle_fallback")
REQUEST_KEYS = ("langgraph_request_id", "langgraph_auth_user", "langgraph_auth_user_id",
                "langgraph_auth_permissions")
"""Request-scoped keys the server puts in a run's `configurable` and means never to persist
(its adapter drops them from the metadata it hands over, but a saver merges `configurable`
into metadata again, as LangGraph's own do): dropped from metadata, besides the secrets."""


@dataclass(frozen=True)
class ServerSettings:
    """What the server factory opens.

    Attributes:
        url: the checkpointer URL, with its query options (see `connect`).
        ttl: LangGraph Platform's `checkpointer.ttl` mapping (`strategy`, `default_ttl` in
            minutes, `sweep_interval_minutes`, `sweep_limit`), or None: nothing expires.
        serde: `checkpointer.serde` (`allowed_json_modules`, `pickle_fallback`), or None.
        sweep_every: seconds between our background sweeps, overriding the ttl's
            `sweep_interval_minutes`; 0 runs none (the server's own sweeper alone).
    """

    url: str
    ttl: Mapping[str, Any] | None = None
    serde: Mapping[str, Any] | None = None
    sweep_every: float | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ServerSettings:
        """The settings from the environment (`os.environ` by default):

        - `LGCKPT_URL` (required): e.g. `sqlite:////data/checkpoints.db`,
          `postgresql://app@db/agents?schema=agents`, `redis://cache:6379/0`.
        - `LANGGRAPH_CHECKPOINTER`: the `checkpointer` object of `langgraph.json` as JSON (the
          server sets it); its `ttl` and `serde` are read, its `path` is the server's.
        - `LANGGRAPH_THREAD_TTL`: minutes, or a ttl object as JSON; as for the server, it
          takes precedence over `checkpointer.ttl`.
        - `LGCKPT_SWEEP_EVERY`: seconds between our sweeps (0: none).

        Raises `InvalidConfigError` naming the variable that is missing or wrong.
        """
        env = os.environ if environ is None else environ
        url = env.get(URL_VAR, "").strip()
        if not url:
            raise InvalidConfigError(
                f"{URL_VAR} is not set: set it to the checkpointer URL, e.g. "
                f"{URL_VAR}=sqlite:////data/checkpoints.db or postgresql://user@host/db")
        try:
            parse_url(url)
        except InvalidConfigError as exc:
            raise InvalidConfigError(f"{URL_VAR}: {exc}") from None
        section = _checkpointer_section(env.get(CHECKPOINTER_VAR))
        ttl = _thread_ttl(env.get(THREAD_TTL_VAR)) or section.get("ttl")
        settings = cls(url, ttl=ttl or None, serde=section.get("serde") or None,
                       sweep_every=_sweep_every(env.get(SWEEP_VAR)))
        try:
            settings.options()
            settings.schedule()
        except InvalidConfigError as exc:
            source = THREAD_TTL_VAR if env.get(THREAD_TTL_VAR) else CHECKPOINTER_VAR
            raise InvalidConfigError(f"{source}: {exc}") from None
        return settings

    def options(self) -> dict[str, Any]:
        """The keyword options of `connect` these settings give: `retention` from `ttl`
        (`Retention.from_platform`), `serde` from `serde`."""
        options: dict[str, Any] = {}
        if self.ttl is not None:
            policy, _ = Retention.from_platform(self.ttl)
            if policy.expires:
                options["retention"] = policy
        if self.serde is not None:
            serde = serde_from_settings(self.serde)
            if serde is not None:
                options["serde"] = serde
        return options

    def schedule(self) -> SweepSchedule | None:
        """When our background sweeper runs: the ttl's `sweep_interval_minutes` (5 by
        default) and `sweep_limit`, the interval replaced by `sweep_every`; None when nothing
        expires or `sweep_every` is 0."""
        if self.ttl is None:
            return None
        policy, schedule = Retention.from_platform(self.ttl)
        if not policy.expires or self.sweep_every == 0:
            return None
        if self.sweep_every is not None:
            return SweepSchedule(self.sweep_every, schedule.limit)
        return schedule


def serde_from_settings(settings: Mapping[str, Any]) -> JsonPlusSerializer | None:
    """`langgraph.json`'s `checkpointer.serde` as our serializer (None: our default, which
    loads the data types the application loaded: docs/security.md).

    `allowed_msgpack_modules`, as langgraph-cli documents it: a list of `[module, class]`
    (exactly those classes, and LangGraph's safe types), `true` (LangGraph's "any class": here
    our default, which never imports a module nor builds a class that is not a loaded data
    type) or `null` (LangGraph's strict mode: its safe types only). `allowed_json_modules` (a
    list of `[module, ..., class]` paths) lets stored values construct those classes too, and
    narrows msgpack to them when `allowed_msgpack_modules` is absent. Refused with
    `InvalidConfigError`, as we never load what could run any code: `allowed_json_modules:
    true` (any class) and `pickle_fallback: true`. `pickle_fallback: false` is what we do
    anyway."""
    if not isinstance(settings, Mapping):
        raise InvalidConfigError(f"checkpointer serde must be an object, not {settings!r}")
    unknown = set(settings) - set(SERDE_KEYS)
    if unknown:
        raise InvalidConfigError(f"unknown checkpointer serde key(s): {', '.join(sorted(unknown))}"
                                 f" (known: {', '.join(SERDE_KEYS)})")
    if settings.get("pickle_fallback") not in (None, False):
        raise InvalidConfigError(
            "checkpointer serde pickle_fallback must be false or absent: a stored pickle runs "
            "any code, and this checkpointer never loads one")
    modules = settings.get("allowed_json_modules")
    if modules is True:
        raise InvalidConfigError(
            "checkpointer serde allowed_json_modules: true (any class) is refused: list the "
            'classes instead, e.g. [["my_agent", "state", "Plan"]]')
    json_allowed = None if modules is None else _class_paths(
        "allowed_json_modules", modules, "[module, ..., class]")
    if "allowed_msgpack_modules" not in settings:
        if json_allowed is None:
            return None
        return JsonPlusSerializer(allowed_json_modules=json_allowed,
                                  allowed_msgpack_modules=json_allowed)
    msgpack = settings["allowed_msgpack_modules"]
    if msgpack is True:
        if json_allowed is None:
            return None
        return JsonPlusSerializer(allowed_json_modules=json_allowed, allowed_msgpack_modules=True)
    if msgpack is None:
        return JsonPlusSerializer(allowed_json_modules=json_allowed, allowed_msgpack_modules=None)
    listed = _class_paths("allowed_msgpack_modules", msgpack, "[module, class]", pairs=True)
    return JsonPlusSerializer(allowed_json_modules=json_allowed, allowed_msgpack_modules=listed)


def _class_paths(key: str, value: Any, form: str, pairs: bool = False) -> list[tuple[str, ...]]:
    """A serde key's list of class paths, each checked."""
    if not isinstance(value, list) or not all(
        isinstance(m, list | tuple) and m and all(isinstance(p, str) and p for p in m)
        and (not pairs or len(m) == 2)
        for m in value
    ):
        raise InvalidConfigError(
            f"checkpointer serde {key} must be a list of {form} lists of names, not {value!r}")
    return [tuple(m) for m in value]


@asynccontextmanager
async def open_checkpointer(
    settings: ServerSettings | str,
    *,
    wrap: Callable[[Checkpointer], BaseCheckpointSaver[Any]] | None = None,
    **options: Any,
) -> AsyncIterator[BaseCheckpointSaver[Any]]:
    """Open the checkpointer `settings` describe (or the URL given), yield it, close it.

    Args:
        settings: a `ServerSettings` (`ServerSettings.from_env()`) or a URL.
        wrap: builds what the server gets from the opened checkpointer (a `SmartCheckpointer`,
            a `ReplicatedCheckpointer`, ...); on exit it is closed first, then the
            checkpointer it wraps.
        options: keyword options of `connect` (`encryption=`, `retention=`, ...); they take
            precedence over those of `settings` (`sweep_every=` replaces its schedule).
            Unless `redact_metadata` is given (here or in the URL), the server's request-scoped
            keys (`REQUEST_KEYS`) are dropped from checkpoint metadata with the secrets.

    Raises `InvalidConfigError` for bad settings or options, before anything is opened.

    Example (a factory named in `langgraph.json` as `"./ckpt.py:checkpointer"`):
        >>> @asynccontextmanager                                  # doctest: +SKIP
        ... async def checkpointer():
        ...     async with open_checkpointer(ServerSettings.from_env(),
        ...                                  wrap=SmartCheckpointer) as cp:
        ...         yield cp
    """
    if isinstance(settings, str):
        settings = ServerSettings(settings)
    merged = {**settings.options(), **options}
    if "redact_metadata" not in merged and "redact_metadata" not in parse_url(settings.url).options:
        merged["redact_metadata"] = list(REQUEST_KEYS)
    async with AsyncExitStack() as stack:
        # `connect` opens synchronously (files, pools): off the server's event loop
        schedule = None if "sweep_every" in options else settings.schedule()
        inner = await asyncio.to_thread(lambda: connect(settings.url, **merged))
        stack.push_async_callback(inner.aclose)
        if schedule is not None:
            inner.start_sweeper(schedule.interval, limit=schedule.limit)
        saver: BaseCheckpointSaver[Any] = inner
        if wrap is not None:
            saver = wrap(inner)
            closer = getattr(saver, "aclose", None)
            if saver is not inner and closer is not None:
                stack.push_async_callback(closer)
        yield saver


@asynccontextmanager
async def checkpointer() -> AsyncIterator[BaseCheckpointSaver[Any]]:
    """The factory to name in `langgraph.json`: `"langgraph_ckpt_ext.server:checkpointer"`.

    Yields the checkpointer `ServerSettings.from_env()` describes (`LGCKPT_URL` is
    required) and closes it on exit. The server enters it once per thread that serves
    requests: each entry opens a checkpointer of its own on the same storage."""
    async with open_checkpointer(ServerSettings.from_env()) as saver:
        yield saver


def _json_object(text: str, var: str) -> dict[str, Any]:
    """The JSON object environment variable `var` holds."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise InvalidConfigError(f"{var} is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise InvalidConfigError(f"{var} must be a JSON object, not {text[:80]!r}")
    return value


def _checkpointer_section(text: str | None) -> dict[str, Any]:
    return _json_object(text, CHECKPOINTER_VAR) if text else {}


def _thread_ttl(text: str | None) -> dict[str, Any] | None:
    """`LANGGRAPH_THREAD_TTL` as the server reads it: minutes (strategy delete, the server's
    sweep interval and limit) or a ttl object as JSON."""
    if not text or not text.strip():
        return None
    text = text.strip()
    if text.startswith("{"):
        return _json_object(text, THREAD_TTL_VAR)
    try:
        minutes = float(text)
    except ValueError:
        raise InvalidConfigError(
            f"{THREAD_TTL_VAR} must be minutes or a JSON object, not {text!r}") from None
    return {"strategy": "delete", "default_ttl": minutes, "sweep_interval_minutes": 5.1,
            "sweep_limit": 10000}


def _sweep_every(text: str | None) -> float | None:
    if text is None or not text.strip():
        return None
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not math.isfinite(seconds) or seconds < 0:
        raise InvalidConfigError(
            f"{SWEEP_VAR} must be a number of seconds >= 0 (0: no sweeper), not {text!r}")
    return seconds


__all__ = ["ServerSettings", "checkpointer", "open_checkpointer", "serde_from_settings"]
