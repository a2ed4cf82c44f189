"""Queue items are checked when claimed: each refusal on its own, with the message a user sees, and a
malformed item in a real Redis is dead-lettered with that message while the run goes on."""

from __future__ import annotations

import json

import pytest

from workload.core.errors import ItemFault
from workload.queue.workqueue import Item, MalformedItem, WorkQueue, connect
from workload.runtime.redis_server import RedisServer

GOOD = {"run": "main", "shard": "training/2018-04-01.parquet", "dataset": "fraud", "seq": 3}
ID = "main/training/2018-04-01.parquet"


def refusal(raw: str | bytes, item_id: str = ID, run: str = "main") -> str:
    with pytest.raises(MalformedItem) as caught:
        Item.parse(raw, item_id, run)
    return str(caught.value)


def with_(**changes: object) -> str:
    return json.dumps({**GOOD, **changes})


def test_a_well_formed_item_is_parsed_as_it_is() -> None:
    item = Item.parse(json.dumps(GOOD).encode(), ID, "main")
    assert item == Item(run="main", shard="training/2018-04-01.parquet", dataset="fraud", seq=3)
    assert item.id == ID
    assert json.loads(item.to_json()) == GOOD
    assert Item.parse(item.to_json(), item.id, item.run) == item  # what enqueue stores, claim reads back


def test_a_malformed_item_is_an_item_fault() -> None:
    assert issubclass(MalformedItem, ItemFault)  # the worker dead-letters item faults, never retries them


def test_not_json() -> None:
    assert refusal(b'{"run": "main",') == (
        f"queue item {ID!r}: not valid JSON (Expecting property name enclosed in double quotes: line 1 column 16 "
        """(char 15)): '{"run": "main",'""")


def test_bytes_that_are_not_utf8() -> None:
    message = refusal(b'{"run": "\xff"}')
    assert message.startswith(f"queue item {ID!r}: not valid JSON (") and message.endswith("""'{"run": "\ufffd"}'""")


@pytest.mark.parametrize("raw", ["[1, 2]", '"main"', "3", "null"])
def test_not_an_object(raw: str) -> None:
    assert refusal(raw) == f"queue item {ID!r}: expected a JSON object {{run, shard, dataset, seq}}, got {raw!r}"


def test_the_shown_text_is_clipped_at_80_characters() -> None:
    exactly = "[" + "1," * 38 + "11]"
    assert len(exactly) == 80
    assert refusal(exactly).endswith(f"got {exactly!r}")
    one_more = "[" + "1," * 39 + "1]"
    assert len(one_more) == 81
    assert refusal(one_more).endswith(f"got {one_more[:80] + '...'!r}")
    longer = "[" + "1," * 40 + "1]"
    assert refusal(longer).endswith(f"got {longer[:80] + '...'!r}")
    assert refusal(longer.encode()).endswith(f"got {longer[:80] + '...'!r}")


@pytest.mark.parametrize("key", ["run", "shard", "dataset", "seq"])
def test_each_missing_field_is_named(key: str) -> None:
    raw = json.dumps({k: v for k, v in GOOD.items() if k != key})
    assert refusal(raw) == f"queue item {ID!r}: missing field(s) [{key!r}]; an item is {{run, shard, dataset, seq}}"


def test_all_missing_fields_are_named() -> None:
    assert refusal("{}") == (f"queue item {ID!r}: missing field(s) ['run', 'shard', 'dataset', 'seq']; "
                             "an item is {run, shard, dataset, seq}")


@pytest.mark.parametrize(("key", "value", "kind"), [
    ("run", 5, "str"), ("shard", ["a"], "str"), ("dataset", None, "str"), ("seq", "3", "int"), ("seq", 3.0, "int"),
    ("seq", True, "int"), ("run", False, "str"),
])
def test_each_field_has_its_type(key: str, value: object, kind: str) -> None:
    assert refusal(with_(**{key: value})) == f"queue item {ID!r}: field {key!r} must be a {kind}, got {value!r}"


def test_the_item_must_name_the_run_whose_queue_it_sits_in() -> None:
    assert refusal(with_(run="other")) == (
        f"queue item {ID!r}: names run 'other' but sits in the queue of run 'main'")


@pytest.mark.parametrize(("key", "value"), [
    ("run", "../etc"), ("run", ".hidden"), ("run", "a/b"), ("dataset", "../../etc"), ("dataset", ""),
    ("dataset", "x" * 64),
])
def test_run_and_dataset_must_be_plain_folder_names(key: str, value: str) -> None:
    raw = with_(**{key: value})
    run = value if key == "run" else "main"
    message = refusal(raw, run=run)
    assert message == (f"queue item {ID!r}: {key} {value!r} is not allowed: use 1-63 letters, digits, '_', '.', "
                       "'-', starting with a letter or digit (it names a folder on the share)")


@pytest.mark.parametrize("shard", ["/etc/passwd", "../other/x.parquet", "training/../../x.parquet", ""])
def test_the_shard_must_stay_inside_the_dataset_folder(shard: str) -> None:
    assert refusal(with_(shard=shard), item_id=f"main/{shard}") == (
        f"queue item {'main/' + shard!r}: shard {shard!r} must be a relative path inside the dataset folder "
        "(no leading '/', no '..')")


def test_a_shard_name_with_dots_inside_is_fine() -> None:
    item = Item.parse(with_(shard="training/..2018.parquet"), "main/training/..2018.parquet", "main")
    assert item.shard == "training/..2018.parquet"


def test_the_fields_must_make_the_id_the_item_is_stored_under() -> None:
    assert refusal(with_(), item_id="main/training/2018-04-02.parquet") == (
        "queue item 'main/training/2018-04-02.parquet': its fields make the id "
        f"{ID!r}, not 'main/training/2018-04-02.parquet'")


# -- in a real Redis -------------------------------------------------------------------------------

def plant(server: RedisServer, run: str, item_id: str, raw: str, seq: int) -> None:
    """What a hand-edited or foreign queue holds: written with plain Redis commands, past enqueue's checks."""
    r = connect(server.url, server.password)
    r.hset("t:items", item_id, raw)
    r.sadd("t:runs", run)
    r.zadd(f"t:pending:{run}", {item_id: seq})


def test_claim_dead_letters_a_malformed_item_at_once_and_goes_on(redis_server: RedisServer, caplog) -> None:
    q = WorkQueue(connect(redis_server.url, redis_server.password), prefix="t", max_attempts=5)
    plant(redis_server, "main", "main/../../etc/passwd", with_(shard="../../etc/passwd"), seq=0)
    q.enqueue([Item.parse(with_(seq=1), ID, "main")])
    lease = q.claim("w1", 30)
    assert lease and lease.item.seq == 1 and lease.owner == "w1" and lease.attempts == 0
    error = ("queue item 'main/../../etc/passwd': shard '../../etc/passwd' must be a relative path inside the "
             "dataset folder (no leading '/', no '..')")
    assert f"{error} -> dead" in caplog.text
    snap = q.snapshot()["runs"]["main"]
    dead = snap["dead"]["main/../../etc/passwd"]
    assert dead["error"] == error and dead["attempts"] == 1 and dead["owner"] == "w1"
    assert snap["errors"]["main/../../etc/passwd"] == error
    c = q.counts()
    assert (c.pending, c.leased, c.dead, c.total) == (0, 1, 1, 2)


def test_a_queue_of_malformed_items_only_is_drained_into_dead_letters(redis_server: RedisServer) -> None:
    q = WorkQueue(connect(redis_server.url, redis_server.password), prefix="t", max_attempts=5)
    plant(redis_server, "main", "main/a", "not json", seq=0)
    plant(redis_server, "main", "main/b", json.dumps({"run": "main"}), seq=1)
    assert q.claim("w1", 30) is None
    c = q.counts()
    assert c.drained and c.dead == 2


def test_status_shows_a_dead_item_whose_json_names_no_queued_run(redis_server: RedisServer) -> None:
    """A dead letter is shown under the run its id belongs to when its JSON cannot say (unreadable, or
    naming a run that has no queue), so `status` never hides one."""
    q = WorkQueue(connect(redis_server.url, redis_server.password), prefix="t", max_attempts=5)
    plant(redis_server, "main", "main/x", "not json", seq=0)
    plant(redis_server, "main", "main/y", with_(run="ghost"), seq=1)
    plant(redis_server, "main", "main/z", json.dumps(["main"]), seq=2)
    plant(redis_server, "main", "main/q", json.dumps({"shard": "q"}), seq=3)
    plant(redis_server, "main.v2", "main.v2/w", json.dumps({"run": 7}), seq=0)
    plant(redis_server, "main.v2", "main.v2/a/b", with_(run="main.v2", shard="a/b", seq=1), seq=1)
    assert q.claim("w1", 30) is not None
    runs = q.snapshot()["runs"]
    assert sorted(runs) == ["main", "main.v2"]
    assert sorted(runs["main"]["dead"]) == ["main/q", "main/x", "main/y", "main/z"]
    assert sorted(runs["main.v2"]["dead"]) == ["main.v2/w"]
    assert runs["main"]["total"] == 4 and runs["main.v2"]["total"] == 2
