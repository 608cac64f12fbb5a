"""A relayd consumer in Python (nats-py) that keeps the rules of docs/CONSUMING.md.

It reads the durable consumer of examples/consumer/nats/consumer.json
(Deployments of cluster "prod" and the markers of source "deploys"; create
it first: nats consumer add K8S --config consumer.json) into a view keyed
by (relaydsource, k8suid). The view and the last acknowledged stream
sequence are saved to a JSON file before each ack (rule 6; use a real store
for anything large). LISTs go through kubectl (kubectl get --raw).
Requires nats-py 2.x and Python 3.
"""
import asyncio
import json
import os
import subprocess
import time
from urllib.parse import quote, unquote

import nats
from nats.errors import TimeoutError as FetchTimeout
from nats.js.errors import NotFoundError

STREAM, DURABLE, PREFIX, CLUSTER = "K8S", "my-app", "k8s", "prod"
STATE = "my-app-view.json"
# What this consumer follows: LISTed when the stream lost messages it did not read.
FOLLOWS = [{"source": "deploys", "group": "apps", "version": "v1", "resource": "deployments", "namespace": ""}]
BACKOFF, MAX_DELIVER = [30, 60, 120, 300, 600], 20  # seconds; as in consumer.json
TYPES = {PREFIX + ".object." + t for t in ("added", "modified", "deleted")}
MARKERS = {PREFIX + ".source.sync." + p for p in ("started", "completed")}
HEARTBEAT = PREFIX + ".source.heartbeat"

view = {}  # (source, uid) -> {"rv": int, "deleted": bool, "namespace": str, "object": dict}
position = {"stream_seq": 0}  # the last stream sequence acknowledged
beats = {}  # (source, namespace) -> [when the newest heartbeat was read, its interval (s), missing logged]


def load():
    if os.path.exists(STATE):
        with open(STATE) as f:
            state = json.load(f)
        view.update({tuple(k.split("/", 1)): e for k, e in state["view"].items()})
        position["stream_seq"] = state["stream_seq"]


def save(seq):
    position["stream_seq"] = max(position["stream_seq"], seq)
    with open(STATE + ".tmp", "w") as f:
        json.dump({"view": {"/".join(k): e for k, e in view.items()}, "stream_seq": position["stream_seq"]}, f)
    os.replace(STATE + ".tmp", STATE)


class Unusable(Exception):
    """A message no redelivery can fix: terminated."""


def decode(msg):
    """The event's attributes and data, in either CloudEvents mode."""
    headers = msg.headers or {}
    if headers.get("Content-Type") == "application/cloudevents+json":
        return json.loads(msg.data)
    ev = {k[3:]: unquote(v) for k, v in headers.items() if k.startswith("ce-")}
    if msg.data:
        ev["data"] = json.loads(msg.data)
    return ev


def check(msg, ev):
    """Rule 5: the message is relayd's, for the cluster this consumer follows."""
    src = ev.get("relaydsource", "")
    if ev.get("k8scluster") != CLUSTER or ev.get("source") != "/relayd/%s/%s" % (CLUSTER, src):
        raise Unusable("not relayd's for cluster %s: %r" % (CLUSTER, ev.get("source")))
    if ev.get("type") not in TYPES | MARKERS | {HEARTBEAT}:
        raise Unusable("type %r" % ev.get("type"))
    msg_id = (msg.headers or {}).get("Nats-Msg-Id", "")
    if msg_id not in ("%s.%s/%s/%s" % (PREFIX, CLUSTER, src, ev.get("id")), "%s/%s" % (src, ev.get("id"))):
        raise Unusable("Nats-Msg-Id %r" % msg_id)
    if ev["type"] in TYPES and not ev.get("k8sresourceversion", "").isdigit():
        raise Unusable("resourceVersion %r cannot be compared" % ev.get("k8sresourceversion"))


def apply(ev):
    """Rules 1-3: newer versions win, deletes (newer or equal) leave tombstones."""
    key, rv = (ev["relaydsource"], ev["k8suid"]), int(ev["k8sresourceversion"])
    deleted = ev["type"].endswith(".deleted")
    held = view.get(key)
    if held and (rv < held["rv"] or (rv == held["rv"] and (not deleted or held["deleted"]))):
        return "skip"  # a duplicate, a replay or a redelivery
    view[key] = {"rv": rv, "deleted": deleted, "namespace": ev.get("k8snamespace", ""),
                 "object": None if deleted else ev.get("data")}
    return "delete" if deleted else "store"


def list_objects(group, version, resource, namespace, label_selector="", field_selector="", min_rv=""):
    """LIST a resource (all pages) at min_rv or later, with kubectl get --raw."""
    path = "/api/" + version if not group else "/apis/%s/%s" % (group, version)
    path += ("/namespaces/" + namespace if namespace else "") + "/" + resource
    query = {"limit": "500", "labelSelector": label_selector, "fieldSelector": field_selector}
    if min_rv:
        query.update(resourceVersion=min_rv, resourceVersionMatch="NotOlderThan")
    items, cont = [], ""
    while True:
        q = dict(query, **({"continue": cont} if cont else {}))
        url = path + "?" + "&".join("%s=%s" % (k, quote(v, safe="")) for k, v in q.items() if v)
        page = json.loads(subprocess.run(["kubectl", "get", "--raw", url], check=True, capture_output=True).stdout)
        items += page["items"]
        cont = page["metadata"].get("continue", "")
        if not cont:
            return items


def reconcile(source, d):
    """Rule 5: after index-lost (or initial over held state), the LIST decides."""
    live = {}
    for o in list_objects(d["group"], d["version"], d["resource"], d["namespace"],
                          d.get("labelSelector", ""), d.get("fieldSelector", ""), d.get("toResourceVersion", "")):
        live[o["metadata"]["uid"]] = o
    for (src, uid), e in view.items():
        if src == source and not e["deleted"] and (not d["namespace"] or e["namespace"] == d["namespace"]):
            if uid not in live:
                e.update(deleted=True, object=None)  # gone: a tombstone at the held version
    for uid, o in live.items():
        rv, held = int(o["metadata"]["resourceVersion"]), view.get((source, uid))
        if held is None or rv > held["rv"]:
            view[(source, uid)] = {"rv": rv, "deleted": False, "namespace": d["namespace"] or o["metadata"].get("namespace", ""), "object": o}


def on_marker(ev):
    """Rule 4: only sync.completed of reason index-lost (or initial over held state) needs a LIST."""
    d, src = ev["data"], ev["relaydsource"]
    if not ev["type"].endswith(".completed") or d["reason"] not in ("index-lost", "initial"):
        return
    held = any(s == src and (not d["namespace"] or e["namespace"] == d["namespace"]) for (s, _), e in view.items())
    if d["reason"] == "initial" and not held:
        return
    if "resource" not in d:  # a marker of a relayd before markers named the resource
        d.update(next(dict(f) for f in FOLLOWS if f["source"] == src), namespace=d["namespace"])
    reconcile(src, d)


def on_heartbeat(ev):
    """A watch of relayd is alive (docs/CONSUMING.md, "Heartbeats")."""
    key = (ev["relaydsource"], ev.get("k8snamespace", ""))
    if beats.get(key, [0, 0, False])[2]:
        print("heartbeat resumed: source %r namespace %r" % key)
    beats[key] = [time.time(), float(ev["data"]["intervalSeconds"]), False]


def check_heartbeats():
    """Called when caught up: log a watch whose heartbeat is 2 intervals overdue."""
    now = time.time()
    for key, b in beats.items():
        if not b[2] and now - b[0] > 2 * b[1]:
            b[2] = True
            print("heartbeat missing: source %r namespace %r: relayd absent, or the watch down or stalled" % key)


async def check_retention(js):
    """Bootstrapping: messages this consumer never read left the stream: LIST.

    The last sequence acknowledged is the one saved with the view: the
    server's ack floor may move past messages that left the stream."""
    first = (await js.stream_info(STREAM)).state.first_seq
    try:
        await js.consumer_info(STREAM, DURABLE)
    except NotFoundError:
        raise SystemExit("create the consumer first: nats consumer add %s --config consumer.json" % STREAM)
    consumed = position["stream_seq"]
    if first > consumed + 1:
        print("stream starts at %d, this consumer is at %d: reconciling by LIST" % (first, consumed))
        for f in FOLLOWS:
            reconcile(f["source"], dict(f))
        save(consumed)


async def handle(msg):
    try:
        ev = decode(msg)
        check(msg, ev)
    except (Unusable, ValueError, KeyError) as err:
        print("terminated seq %d: %r" % (msg.metadata.sequence.stream, str(err)))
        await msg.term()
        return
    try:
        if ev["type"] == HEARTBEAT:
            on_heartbeat(ev)
        elif ev["type"] in MARKERS:
            on_marker(ev)
        else:
            print(apply(ev), repr(ev.get("k8snamespace", "")), repr(ev["k8sname"]), ev["k8sresourceversion"])
        save(msg.metadata.sequence.stream)
    except Exception as err:  # the store failed: give it back, spaced out, at most MAX_DELIVER times
        n = msg.metadata.num_delivered
        if n >= MAX_DELIVER:
            print("not applied after %d deliveries, terminated: %r" % (n, str(err)))
            await msg.term()
        else:
            await msg.nak(delay=BACKOFF[min(n, len(BACKOFF)) - 1])
        return
    await msg.ack()  # rule 6: after the effect is stored


async def main():
    nc = await nats.connect(os.environ.get("NATS_URL", "nats://127.0.0.1:4222"))
    js = nc.jetstream()
    load()
    await check_retention(js)
    sub = await js.pull_subscribe_bind(DURABLE, STREAM)
    while True:
        try:
            msgs = await sub.fetch(64, timeout=5)
        except FetchTimeout:
            check_heartbeats()
            continue
        for msg in msgs:
            await handle(msg)


if __name__ == "__main__":
    asyncio.run(main())
