"""Every pull consumer command through the proxy with pymongo (Debian's python3-pymongo, 3.11).

Usage: matrix.py PROXY_URI DIRECT_URI PLAN_JSON

PLAN_JSON (written by matrix.test.js) names the handler, the events published for it, the outbox
database and prefix, the application database and the bad inputs to send. One JSON line is
printed per case; matrix.test.js asserts them, the same for every driver. matrix.c is the same
program for mongo-c-driver.
"""
import datetime
import json
import sys
import time

from bson.int64 import Int64
from bson.son import SON
from pymongo import MongoClient
from pymongo.errors import OperationFailure

uri, direct_uri = sys.argv[1], sys.argv[2]
plan = json.loads(sys.argv[3], object_pairs_hook=SON)
H = plan["handler"]
ids = plan["ids"]

# One connection each: a lease is settled on the connection that claimed it.
a = MongoClient(uri, maxPoolSize=1, serverSelectionTimeoutMS=10000)
b = MongoClient(uri, maxPoolSize=1, serverSelectionTimeoutMS=10000)
direct = MongoClient(direct_uri, serverSelectionTimeoutMS=10000)
outbox = direct[plan["outboxDb"]]
deliveries = outbox[plan["prefix"] + "deliveries"]
lanes = outbox[plan["prefix"] + "lanes"]


def now_ms():
    return int(time.time() * 1000)


def out(case, **facts):
    facts["case"] = case
    print(json.dumps(facts, sort_keys=True), flush=True)


def cmd(client, doc, session=None):
    return client.admin.command(doc, session=session)


def error_of(fn):
    """The server's error of fn() as {code, codeName, errmsg, labels}, or None if it succeeded."""
    try:
        fn()
    except OperationFailure as e:
        d = e.details or {}
        return {"code": e.code, "codeName": d.get("codeName"), "errmsg": d.get("errmsg", str(e)),
                "labels": list(d.get("errorLabels", []))}
    return None


def type_name(v):
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, Int64):
        return "int64"
    if isinstance(v, int):
        return "int32"
    if isinstance(v, float):
        return "double"
    if isinstance(v, str):
        return "string"
    if isinstance(v, datetime.datetime):
        return "date"
    if isinstance(v, dict):
        return "document"
    if isinstance(v, list):
        return "array"
    return type(v).__name__


def plain(v):
    """A BSON value as JSON: dates as milliseconds since the epoch."""
    if isinstance(v, datetime.datetime):
        return int(v.replace(tzinfo=datetime.timezone.utc).timestamp() * 1000)
    if isinstance(v, dict):
        return {k: plain(x) for k, x in v.items()}
    if isinstance(v, list):
        return [plain(x) for x in v]
    return v


def stored(event_id):
    d = deliveries.find_one({"eventId": event_id, "handler": H})
    return None if d is None else {"status": d.get("status"), "attempts": d.get("attempts"),
                                   "lastError": d.get("lastError")}


def claim_until(client, wanted, extra=(), ms=10000):
    """Claims until every event of `wanted` was handed out; others' leftovers are released."""
    got = {}
    until = time.time() + ms / 1000.0
    while set(wanted) - set(got) and time.time() < until:
        r = cmd(client, SON([("relaybusClaim", H), ("limit", 100)] + list(extra)))
        others = []
        for d in r["deliveries"]:
            if d["eventId"] in wanted:
                got[d["eventId"]] = d
            else:
                others.append(d["lease"])
        if others:
            cmd(client, SON([("relaybusRelease", H), ("leases", others)]))
        if set(wanted) - set(got):
            time.sleep(0.05)
    if set(wanted) - set(got):
        raise SystemExit("never claimed: %s" % sorted(set(wanted) - set(got)))
    return got


def snapshot():
    return (list(deliveries.find({}).sort("_id", 1)), list(lanes.find({}).sort("_id", 1)))


# claim: every field of a delivery, with its BSON type.
held = claim_until(a, list(ids.values()), [("leaseMs", 30000), ("consumer", "matrix-py")])
d = held[ids["claim"]]
fields = {k: plain(v) for k, v in d.items() if k != "createdAt"}
out("claim", fields=fields, types={k: type_name(v) for k, v in d.items()},
    storedId=str(deliveries.find_one({"eventId": ids["claim"], "handler": H})["_id"]))

# status: the handler while this connection holds the batch.
st = cmd(a, SON([("relaybusStatus", H)]))
out("status", reply={k: plain(v) for k, v in st.items() if k not in ("$clusterTime", "operationTime")},
    types={k: type_name(v) for k, v in st.items()}, held=len(held))

# bad input: each refused with its code, nothing changed.
lease = d["lease"]
forged = ":".join(lease.split(":")[:3]) + ":" + "0" * 24


def subst(v):
    if v == "$LEASE":
        return lease
    if v == "$FORGED":
        return forged
    if isinstance(v, dict):
        return SON([(k, subst(x)) for k, x in v.items()])
    if isinstance(v, list):
        return [subst(x) for x in v]
    return v


before = snapshot()
results = [error_of(lambda doc=doc: cmd(a, subst(doc))) for doc in plan["bad"]]
foreign = [error_of(lambda: cmd(b, SON([("relaybusComplete", H), ("leases", [lease])]))),
           error_of(lambda: cmd(b, SON([("relaybusRelease", H), ("leases", [lease])])))]
with a.start_session() as s:
    s.start_transaction()
    in_txn = error_of(lambda: cmd(a, SON([("relaybusRelease", H), ("leases", [lease])]), session=s))
    try:
        s.abort_transaction()
    except OperationFailure:
        pass
after = snapshot()
out("bad", results=results, foreign=foreign, inTransaction=in_txn,
    deliveriesUnchanged=before[0] == after[0], lanesUnchanged=before[1] == after[1])

# complete outside a transaction.
r = cmd(a, SON([("relaybusComplete", H), ("leases", [lease])]))
out("completeOutside", lease=lease, completed=r["completed"], notCompleted=r["notCompleted"],
    stored=stored(ids["claim"]))

# complete inside the consumer's transaction, with the handler's write.
t = held[ids["txn"]]
with a.start_session() as s:
    with s.start_transaction():
        a[plan["appDb"]].projections.update_one({"_id": t["eventId"]}, {"$inc": {"n": 1}}, upsert=True, session=s)
        r = cmd(a, SON([("relaybusComplete", H), ("leases", [t["lease"]])]), session=s)
again = error_of(lambda: cmd(a, SON([("relaybusComplete", H), ("leases", [t["lease"]])])))
out("completeInTransaction", lease=t["lease"], completed=r["completed"], notCompleted=r["notCompleted"],
    again=again, stored=stored(t["eventId"]))

# retry with delayMs: pending with the error, not due before delayMs, due again after it.
t = held[ids["retry"]]
r = cmd(a, SON([("relaybusRetry", H), ("lease", t["lease"]), ("delayMs", 800), ("error", "boom")]))
retried_at = now_ms()
after_retry = stored(t["eventId"])
early = cmd(a, SON([("relaybusClaim", H), ("limit", 100)]))
early_ids = [x["eventId"] for x in early["deliveries"]]
if early["deliveries"]:
    cmd(a, SON([("relaybusRelease", H), ("leases", [x["lease"] for x in early["deliveries"]])]))
again = claim_until(a, [t["eventId"]])[t["eventId"]]
due_after = now_ms() - retried_at
old = error_of(lambda: cmd(a, SON([("relaybusComplete", H), ("leases", [t["lease"]])])))
done = cmd(a, SON([("relaybusComplete", H), ("leases", [again["lease"]])]))
out("retry", applied=r["applied"], status=r["status"], dueAtType=type_name(r.get("dueAt")), stored=after_retry,
    earlyHadIt=t["eventId"] in early_ids, dueAfterMs=due_after, attempt=again["attempt"],
    newLease=again["lease"] != t["lease"], oldLease=old, completed=done["completed"] == [again["lease"]])

# bury: dead at once, with the error.
t = held[ids["bury"]]
r = cmd(a, SON([("relaybusBury", H), ("lease", t["lease"]), ("error", "poison: cannot parse")]))
out("bury", applied=r["applied"], status=r["status"], stored=stored(t["eventId"]))

# extend, then release: no attempt charged, another connection claims it as attempt 1.
t = held[ids["ext"]]
r = cmd(a, SON([("relaybusExtend", H), ("leases", [t["lease"]]), ("leaseMs", 120000)]))
# A pull handler's lane n is lane n of the handler's own lane space.
lane = lanes.find_one({"_id": plan["laneBase"] + int(t["lease"].split(":")[0])})
out("extend", extended=r["extended"], notExtended=r["notExtended"], leaseExpiresAtType=type_name(r.get("leaseExpiresAt")),
    laneLeaseLeftMs=plain(lane["leaseExpiresAt"]) - now_ms())
r = cmd(a, SON([("relaybusRelease", H), ("leases", [t["lease"]])]))
after_release = stored(t["eventId"])
again = claim_until(b, [t["eventId"]])[t["eventId"]]
done = cmd(b, SON([("relaybusComplete", H), ("leases", [again["lease"]])]))
out("release", released=r["released"], notReleased=r["notReleased"], stored=after_release,
    attempt=again["attempt"], completed=done["completed"] == [again["lease"]])

# the long poll: empty after maxAwaitTimeMS, then answered by a commit (the test publishes).
leftover = cmd(a, SON([("relaybusClaim", H), ("limit", 1000)]))["deliveries"]
if leftover:
    cmd(a, SON([("relaybusRelease", H), ("leases", [x["lease"] for x in leftover])]))
t0 = now_ms()
r = cmd(b, SON([("relaybusClaim", H), ("limit", 5), ("maxAwaitTimeMS", 400)]))
out("longPollEmpty", waitedMs=now_ms() - t0, deliveries=len(r["deliveries"]), leftover=len(leftover))
out("longPollWaiting", at=now_ms())
r = cmd(b, SON([("relaybusClaim", H), ("limit", 5), ("maxAwaitTimeMS", 10000)]))
answered = now_ms()
if r["deliveries"]:
    cmd(b, SON([("relaybusComplete", H), ("leases", [x["lease"] for x in r["deliveries"]])]))
out("longPoll", answeredAt=answered, eventIds=[x["eventId"] for x in r["deliveries"]])

a.close()
b.close()
direct.close()
