"""The keyed audit trail (`audit_keys=`) on every backend: the attack an unkeyed trail cannot
see (someone with write access rewrites a message by hand, or deletes a thread and writes a
forged one again with `audit=True`, unkeyed or under another key) fails `verify` with the real
keys; a keyed run verifies intact; a seal under a key id the verifier lacks is reported; rotation
(k1 then k2); audit over an encrypted store; `lgckpt verify` reading $LGCKPT_AUDIT_KEYS."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from langgraph_ckpt_ext.core.errors import InvalidConfigError
from langgraph_ckpt_ext.core.keys import StaticKeys, encode_key, new_key
from langgraph_ckpt_ext.core.saver import StoreCheckpointer
from langgraph_ckpt_ext.core.sealing import Encryption
from langgraph_ckpt_ext.timetravel.audit import ALTERED, UNKEYED, UNKNOWN_KEY, AuditReport
from tests.core.test_audit import Raw
from tests.support.common import conf
from tests.support.graphs import approval_graph, chat_graph, fan_graph, human
from tests.support.savers import SaverHandle, open_saver, params

A1, A2, OTHER = new_key(), new_key(), new_key()
KEYS = StaticKeys({"a1": A1})


@pytest.fixture(params=params(["memory", "sqlite", "postgres", "redis", "redis-cluster"]))
def keyed(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SaverHandle]:
    """A store audited with the key "a1"."""
    with open_saver(request.param, tmp_path, audit=True, audit_keys=KEYS) as h:
        yield h


def over(h: SaverHandle, **options: Any) -> StoreCheckpointer:
    """Another checkpointer over `h`'s storage, with nothing of its caches (the in-memory one
    shares the rows)."""
    if h.backend == "memory":
        from langgraph_ckpt_ext import InMemoryCheckpointer

        cp = InMemoryCheckpointer(**options)
        cp._raw_store.__dict__.update(
            {k: v for k, v in h.inner._raw_store.__dict__.items() if not k.startswith("_")})
        return cp
    return h.reopen(**options)


def verify_with(h: SaverHandle, thread: str, **options: Any) -> AuditReport:
    cp = over(h, **options)
    try:
        return cp.verify(thread)
    finally:
        cp.close()


def chat(cp: StoreCheckpointer, thread: str, *texts: str) -> None:
    graph = chat_graph().compile(checkpointer=cp)
    for text in texts:
        graph.invoke({"messages": [human(text)]}, conf(thread))


def ids_of(cp: StoreCheckpointer, thread: str) -> list[str]:
    return sorted(t.checkpoint["id"] for t in cp.list(conf(thread)))


def test_keyed_run_verifies_intact(keyed: SaverHandle) -> None:
    cp = keyed.inner
    chat(cp, "t", "hello", "again")
    approval = approval_graph().compile(checkpointer=cp)
    approval.invoke({"request": "deploy", "log": []}, conf("ok"))
    fan_graph().compile(checkpointer=cp).invoke({"items": [1, 2, 3], "results": []}, conf("fan"))
    record = cp.get_tuple(conf("t")).metadata["audit"]  # type: ignore[union-attr,typeddict-item]
    assert record["v"] == 2 and record["kid"] == "a1" and len(record["hash"]) == 64
    for thread in ("t", "ok", "fan"):
        for report in (cp.verify(thread), verify_with(keyed, thread, audit_keys=KEYS)):
            assert report.ok and report.status == "intact", str(report)
            assert report.keyed and report.key_ids == {"a1": report.checked}
            assert "intact, sealed under audit key(s) a1" in str(report)
    report = cp.verify("t")
    assert all(report.verdict(cid) == "intact" for cid in ids_of(cp, "t"))
    # a verifier without the keys cannot check a keyed seal: not taken on trust
    blind = verify_with(keyed, "t")
    assert not blind.ok and blind.status == UNKNOWN_KEY
    assert {p.kind for p in blind.problems} == {UNKNOWN_KEY}
    assert "no audit keys are given" in blind.problems[0].detail


def test_rewritten_message_is_altered(keyed: SaverHandle) -> None:
    """A message's stored bytes rewritten by hand: the checkpoints reading it are altered."""
    cp = keyed.inner
    chat(cp, "t", "pay 10 EUR", "thanks")
    tup = cp.get_tuple(conf("t"))
    assert tup is not None
    version = str(tup.checkpoint["channel_versions"]["messages"])
    from langgraph_ckpt_ext.core.versions import version_key

    raw = Raw(keyed)
    try:
        type_, data, _ = raw.blob("t", "messages", version_key(version))
        value = cp.serde.loads_typed((type_, bytes(data)))
        forged = [m.model_copy(update={"content": "pay 10000 EUR"}) for m in value]
        raw.set_blob("t", "messages", version_key(version), cp.serde.dumps_typed(forged))
    finally:
        raw.close()
    report = verify_with(keyed, "t", audit_keys=KEYS)
    assert not report.ok and report.status == ALTERED, str(report)
    assert report.verdict(tup.checkpoint["id"]) == ALTERED


@pytest.mark.parametrize("forger", ["unkeyed", "same id, other key", "other id"])
def test_thread_deleted_and_forged_again_is_not_intact(keyed: SaverHandle, forger: str) -> None:
    """The attack of an unkeyed trail: delete the thread, write a forged one with audit=True.
    Unkeyed, its chain is whole (verify without keys says intact, as before keys); verify with
    the real keys says unkeyed, altered (a key under the real key's id) or unknown key."""
    cp = keyed.inner
    chat(cp, "t", "pay 10 EUR")
    cp.delete_thread("t")
    keys = {"unkeyed": None, "same id, other key": StaticKeys({"a1": OTHER}),
            "other id": StaticKeys({"mallory": OTHER})}[forger]
    forging = over(keyed, audit=True, audit_keys=keys)
    try:
        chat(forging, "t", "pay 10000 EUR")
    finally:
        forging.close()
    report = verify_with(keyed, "t", audit_keys=KEYS)
    assert not report.ok, str(report)
    expected = {"unkeyed": UNKEYED, "same id, other key": ALTERED, "other id": UNKNOWN_KEY}
    assert report.status == expected[forger]
    assert {p.kind for p in report.problems} == {expected[forger]}
    assert len(report.problems) == report.checked == 3
    if forger == "unkeyed":
        assert "not proof against someone with write access" in report.problems[0].detail
        assert verify_with(keyed, "t").ok  # what an unkeyed verify said of the forgery
    if forger == "other id":
        assert "'mallory'" in report.problems[0].detail and report.key_ids == {"mallory": 3}


def test_rotation_old_seals_verify_while_their_key_is_held(keyed: SaverHandle) -> None:
    """Sealed under a1, then under a2 (a1 still held): both verify; once a1 is dropped, the
    checkpoints sealed under it are reported unknown key, those under a2 intact."""
    chat(keyed.inner, "t", "one", "two")
    under_a1 = set(ids_of(keyed.inner, "t"))
    rotated = StaticKeys({"a1": A1, "a2": A2}, current="a2")
    later = over(keyed, audit_keys=rotated)
    try:
        chat(later, "t", "three")
        both = later.verify("t")
        assert both.ok, str(both)
        assert both.key_ids == {"a1": len(under_a1), "a2": 3}
        later.copy_thread("t", "t-copy")  # a copy is sealed again under the current key
        assert later.verify("t-copy").key_ids == {"a2": len(under_a1) + 3}
    finally:
        later.close()
    dropped = verify_with(keyed, "t", audit_keys=StaticKeys({"a2": A2}))
    assert not dropped.ok and dropped.status == UNKNOWN_KEY
    assert {p.checkpoint_id for p in dropped.problems} == under_a1
    assert {p.kind for p in dropped.problems} == {UNKNOWN_KEY}
    assert "'a1'" in dropped.problems[0].detail and "do not hold" in dropped.problems[0].detail
    assert all(dropped.verdict(cid) == "intact" for cid in set(ids_of(keyed.inner, "t")) - under_a1)


@pytest.mark.parametrize("backend", params(["memory", "sqlite", "postgres", "redis",
                                            "redis-cluster"]))
def test_keyed_audit_on_an_encrypted_store(backend: str, tmp_path: Path) -> None:
    """Hashes are over the plaintext: a keyed trail on an encrypted store verifies with the
    encryption key present, and a message rewritten in plaintext terms is still caught."""
    encryption = Encryption(StaticKeys({"e1": new_key()}))
    with open_saver(backend, tmp_path, audit=True, audit_keys=KEYS, encryption=encryption,
                    compression=True) as h:
        cp = h.inner
        chat(cp, "t", "hello", "secret plans")
        fan_graph().compile(checkpointer=cp).invoke({"items": [1, 2], "results": []}, conf("f"))
        row = cp.run_sync(cp._raw_store.read_checkpoint("t", "", ids_of(cp, "t")[-1]))
        assert row is not None and b"a1" not in bytes(row.metadata[1])  # sealed: not readable
        for thread in ("t", "f"):
            assert cp.verify(thread).ok
            fresh = verify_with(h, thread, audit_keys=KEYS, encryption=encryption)
            assert fresh.ok and fresh.key_ids == {"a1": fresh.checked}, str(fresh)


def test_audit_keys_must_be_a_key_provider() -> None:
    from langgraph_ckpt_ext import InMemoryCheckpointer

    with pytest.raises(InvalidConfigError, match="audit_keys takes a KeyProvider"):
        InMemoryCheckpointer(audit_keys={"a1": A1})  # type: ignore[arg-type]


@pytest.mark.parametrize("backend", params(["sqlite", "postgres", "redis"]))
def test_cli_verify_reads_the_audit_keys_from_the_environment(backend: str, tmp_path: Path) -> None:
    from tests.cli.test_cli import lgckpt

    env = {"LGCKPT_AUDIT_KEYS": f"a1:{encode_key(A1)}"}
    with open_saver(backend, tmp_path, audit=True, audit_keys=KEYS) as h:
        chat(h.inner, "t", "hello")
        url = h.store_url()
        run = lgckpt("verify", "t", "--json", url=url, env=env)
        assert run.code == 0, run
        (row,) = json.loads(run.out)
        assert row["status"] == "intact" and row["keyed"] and row["key_ids"] == {"a1": 3}
        # without the keys the seals cannot be checked: not intact
        assert lgckpt("verify", "t", url=url).code == 6
        # a thread forged by a writer without the key
        h.inner.delete_thread("t")
        forging = over(h, audit=True)
        try:
            chat(forging, "t", "forged")
        finally:
            forging.close()
        run = lgckpt("verify", "t", "--json", url=url, env=env)
        assert run.code == 6, run
        (row,) = json.loads(run.out)
        assert row["status"] == "failed (unkeyed): 3 problem(s)"
        assert {p["kind"] for p in row["problems"]} == {UNKEYED}
