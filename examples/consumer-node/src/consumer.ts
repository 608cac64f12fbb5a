// A consumer of relayd's stream in TypeScript on Node.js that keeps the
// contract of docs/CONSUMING.md, as examples/consumer does in Go: a durable
// JetStream consumer (explicit ack) that keeps a view of the cluster's
// objects, keyed by (relaydsource, k8suid), in a JSON file (README.md).
//
//   node dist/consumer.js --server nats://127.0.0.1:4222 --stream K8S --cluster demo \
//     --state view.json [--kubeconfig FILE] [--follow cms=v1/configmaps@demo]
//
// It prints one JSON line per message applied and per scope a LIST loaded
// (stdout), and logs JSON lines (stderr); the state file is the view.

import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";
import { connect, credsAuthenticator, nanos, type NatsConnection } from "@nats-io/transport-node";
import {
  AckPolicy,
  DeliverPolicy,
  jetstream,
  jetstreamManager,
  JetStreamApiCodes,
  JetStreamApiError,
  type ConsumerInfo,
  type JetStreamManager,
  type JsMsg,
} from "@nats-io/jetstream";
import { check, decode, errorText, safeJSON, Unusable, validToken, type Envelope, type SyncData } from "./envelope.js";
import { Lister } from "./kube.js";
import { apiVersion, covers, decide, View, type Scope } from "./view.js";

interface Options {
  stream: string;
  durable: string;
  cluster: string;
  prefix: string;
  subjects: string[];
  follow: Scope[];
  maxDeliver: number;
  backOffMs: number[];
  tombstoneTTLMs: number;
  view: View;
  lister?: Lister;
}

const usage = `usage: consumer --cluster NAME [--server URL] [--creds FILE] [--stream K8S] [--durable NAME] [--state FILE]
       [--subject SUBJ]... [--kubeconfig FILE] [--follow SOURCE=[GROUP/]VERSION/RESOURCE[@NAMESPACE]]...
       [--prefix k8s] [--max-deliver 20] [--tombstone-ttl SECONDS]`;

/** out prints one machine-readable line (JSON, every non-ASCII character escaped). */
function out(v: Record<string, unknown>): void {
  process.stdout.write(safeJSON(v) + "\n");
}

/** log writes one JSON log line to stderr. */
function log(level: "info" | "warn" | "error", msg: string, attrs: Record<string, unknown> = {}): void {
  process.stderr.write(safeJSON({ time: new Date().toISOString(), level, msg, ...attrs }) + "\n");
}

/** parseScope reads --follow's SOURCE=[GROUP/]VERSION/RESOURCE[@NAMESPACE]. */
export function parseScope(v: string): Scope {
  const eq = v.indexOf("=");
  const source = v.slice(0, eq);
  let rest = v.slice(eq + 1);
  let namespace = "";
  const at = rest.indexOf("@");
  if (at >= 0) [rest, namespace] = [rest.slice(0, at), rest.slice(at + 1)];
  const parts = rest.split("/");
  if (eq < 0 || !validToken(source) || parts.length < 2 || parts.length > 3 || parts.some((p) => p === "")) {
    throw new Error(`--follow ${JSON.stringify(v)}: want SOURCE=[GROUP/]VERSION/RESOURCE[@NAMESPACE], e.g. cms=v1/configmaps@shop`);
  }
  const [group, version, resource] = parts.length === 2 ? ["", parts[0], parts[1]] : parts;
  return { source, group, version, resource, namespace };
}

async function main(argv: string[]): Promise<number> {
  let a;
  try {
    a = parseArgs({
      args: argv,
      options: {
        server: { type: "string", default: "nats://127.0.0.1:4222" },
        creds: { type: "string" },
        stream: { type: "string", default: "K8S" },
        durable: { type: "string", default: "example-consumer-node" },
        state: { type: "string", default: "view.json" },
        cluster: { type: "string" },
        prefix: { type: "string", default: "k8s" },
        subject: { type: "string", multiple: true },
        kubeconfig: { type: "string" },
        follow: { type: "string", multiple: true },
        "max-deliver": { type: "string", default: "20" },
        "tombstone-ttl": { type: "string", default: "86400" },
        help: { type: "boolean" },
      },
    }).values;
  } catch (err) {
    process.stderr.write(`consumer: ${errorText(err)}\n${usage}\n`);
    return 2;
  }
  if (a.help) {
    process.stdout.write(usage + "\n");
    return 0;
  }
  if (!validToken(a.cluster)) {
    process.stderr.write(`consumer: --cluster is required: the cluster relayd publishes (its config key cluster)\n${usage}\n`);
    return 2;
  }
  const backOffMs = [30_000, 60_000, 120_000, 300_000, 600_000];
  const maxDeliver = Number(a["max-deliver"]);
  const ttl = Number(a["tombstone-ttl"]);
  if (!Number.isInteger(maxDeliver) || maxDeliver <= backOffMs.length) {
    process.stderr.write(`consumer: --max-deliver ${a["max-deliver"]}: want an integer above ${backOffMs.length} (JetStream wants more deliveries than back-off steps)\n`);
    return 2;
  }
  if (!(ttl > 0)) {
    process.stderr.write(`consumer: --tombstone-ttl ${a["tombstone-ttl"]}: want seconds above 0\n`);
    return 2;
  }
  const o: Options = {
    stream: a.stream,
    durable: a.durable,
    cluster: a.cluster as string,
    prefix: a.prefix,
    subjects: a.subject ?? [`${a.prefix}.${a.cluster}.>`],
    follow: (a.follow ?? []).map(parseScope),
    maxDeliver,
    backOffMs,
    tombstoneTTLMs: ttl * 1000,
    view: new View(a.state),
    lister: a.kubeconfig ? new Lister(a.kubeconfig) : undefined,
  };
  const nc = await connect({
    servers: a.server,
    name: "relayd-example-consumer-node",
    maxReconnectAttempts: -1,
    authenticator: a.creds ? credsAuthenticator(readFileSync(a.creds)) : undefined,
  });
  try {
    await run(nc, o);
  } finally {
    await nc.drain().catch(() => undefined);
  }
  return 0;
}

/** The start: where a new durable consumer begins, and whether the view must be loaded by a LIST first. */
interface Plan {
  deliver: DeliverPolicy;
  startSeq?: number;
  /** Why the view is listed ("bootstrap", "lost-messages"), "" when the stream holds every message not read yet. */
  relist: string;
  first: number;
  last: number;
  existing: boolean;
}

/**
 * plan compares the stream's first sequence with the last one this
 * consumer applied (recorded in its state file; docs/CONSUMING.md,
 * "Bootstrapping a new consumer"). A new consumer reads the stream from its
 * start if nothing ever left it; otherwise it starts after the stream's
 * last message and the view is loaded by a LIST first. A consumer that was
 * down while messages it had not read left the stream resumes, and the view
 * is listed first.
 */
async function plan(jsm: JetStreamManager, o: Options): Promise<Plan> {
  const si = await jsm.streams.info(o.stream);
  const p: Plan = { deliver: DeliverPolicy.All, relist: "", first: si.state.first_seq, last: si.state.last_seq, existing: false };
  let ci: ConsumerInfo;
  try {
    ci = await jsm.consumers.info(o.stream, o.durable);
  } catch (err) {
    if (err instanceof JetStreamApiError && err.code === JetStreamApiCodes.ConsumerNotFound) {
      if (p.first > 1) {
        [p.deliver, p.startSeq, p.relist] = [DeliverPolicy.StartSequence, p.last + 1, "bootstrap"];
      }
      return p;
    }
    throw err;
  }
  p.existing = true;
  const pos = o.view.existed ? o.view.streamSeq : ci.ack_floor.stream_seq;
  if (p.first > pos + 1) p.relist = "lost-messages";
  return p;
}

async function run(nc: NatsConnection, o: Options): Promise<void> {
  const jsm = await jetstreamManager(nc);
  const p = await plan(jsm, o);
  const cfg = {
    filter_subjects: o.subjects,
    max_deliver: o.maxDeliver,
    backoff: o.backOffMs.map(nanos),
  };
  if (p.existing) {
    await jsm.consumers.update(o.stream, o.durable, cfg);
  } else {
    await jsm.consumers.add(o.stream, {
      ...cfg,
      durable_name: o.durable,
      ack_policy: AckPolicy.Explicit,
      deliver_policy: p.deliver,
      ...(p.startSeq !== undefined ? { opt_start_seq: p.startSeq } : {}),
    });
  }
  if (p.relist !== "") {
    if (o.lister === undefined) {
      log("error", "the stream no longer holds messages this consumer has not read, and there is no kubeconfig to LIST the cluster: the view misses their changes until a reconcile", { reason: p.relist, streamFirstSeq: p.first });
    } else {
      log("warn", "the stream no longer holds messages this consumer has not read: loading the view by a LIST", { reason: p.relist, streamFirstSeq: p.first });
      await relistAll(o, p.relist);
      // The view now holds what the stream no longer does: a later start must not list again for it.
      o.view.save(p.relist === "bootstrap" ? p.last : p.first - 1);
    }
  }

  const js = jetstream(nc);
  const consumer = await js.consumers.get(o.stream, o.durable);
  const msgs = await consumer.consume({ max_messages: 64 });
  const dog = new Watchdog();
  const timers = [
    setInterval(() => dog.check(Date.now()), 1000),
    setInterval(() => o.view.flush(), 1000),
    setInterval(() => {
      const n = o.view.pruneTombstones(new Date(Date.now() - o.tombstoneTTLMs));
      if (n > 0) {
        o.view.save();
        log("info", "pruned expired tombstones", { removed: n });
      }
    }, Math.max(1000, o.tombstoneTTLMs / 4)),
  ];
  const stop = () => void msgs.close();
  process.once("SIGINT", stop);
  process.once("SIGTERM", stop);
  try {
    for await (const m of msgs) {
      await settle(o, m, await handle(o, m, dog));
    }
  } finally {
    timers.forEach(clearInterval);
    o.view.flush();
  }
}

/** settle acknowledges, gives back with a back-off, or terminates a message after handle. */
async function settle(o: Options, m: JsMsg, err: unknown): Promise<void> {
  const seq = m.info.streamSequence;
  if (err === undefined) {
    try {
      await m.ackAck();
    } catch (e) {
      log("warn", "ack failed; the message comes back and is skipped then", { subject: m.subject, seq, error: errorText(e) });
    }
    return;
  }
  if (err instanceof Unusable) {
    log("error", "not a usable message of relayd for this cluster: terminated", { subject: m.subject, seq, error: err.message });
    m.term(err.message);
    return;
  }
  const n = m.info.deliveryCount;
  if (n >= o.maxDeliver) {
    log("error", "not applied after the last delivery: terminated; the view misses this change until a reconcile", { subject: m.subject, seq, deliveries: n, error: errorText(err) });
    m.term("not applied after MaxDeliver deliveries");
    return;
  }
  const delay = o.backOffMs[Math.min(n, o.backOffMs.length) - 1];
  log("warn", "not applied; redelivered later", { subject: m.subject, seq, deliveries: n, retryInMs: delay, error: errorText(err) });
  m.nak(delay);
}

/** handle applies one message and stores its effect; it returns an error to settle (undefined: applied). */
async function handle(o: Options, m: JsMsg, dog: Watchdog): Promise<unknown> {
  const seq = m.info.streamSequence;
  try {
    const headers = new Map<string, string>();
    for (const k of m.headers?.keys() ?? []) headers.set(k.toLowerCase(), m.headers?.get(k) ?? "");
    const env = decode(headers, m.data);
    const kind = check(o.prefix, o.cluster, m.subject, headers.get("nats-msg-id") ?? "", env);
    if (kind === "heartbeat") {
      dog.beat(env, m.info.pending);
      o.view.advance(seq); // not part of the view; the position is written within a second
      return undefined;
    }
    dog.seen(m.info.pending);
    const base = { seq, event: env.type.slice(o.prefix.length + 1).replace(/^(object|source)\./, ""), source: env.relaydsource, namespace: env.k8snamespace ?? "" };
    switch (kind) {
      case "sync.started":
        o.view.save(seq);
        out({ ...base, epoch: env.relaydepoch, reason: (env.data as SyncData | undefined)?.reason });
        return undefined;
      case "sync.completed": {
        const d = env.data as SyncData;
        if (typeof d !== "object" || d === null || typeof d.reason !== "string") throw new Unusable("sync marker without data");
        if ((d.namespace ?? "") !== (env.k8snamespace ?? "")) throw new Unusable(`sync marker of namespace ${JSON.stringify(d.namespace)}, k8snamespace ${JSON.stringify(env.k8snamespace)}`);
        const s = markerScope(env.relaydsource as string, d);
        if (s !== undefined) o.view.putScope(s); // what a LIST of the source asks for, should the stream lose messages
        const reconciled = await reconcile(o, m, env.relaydsource as string, d);
        o.view.save(seq);
        out({ ...base, epoch: env.relaydepoch, reason: d.reason, requestId: d.requestId, reconciled });
        return undefined;
      }
    }
    const action = o.view.apply(env);
    o.view.save(seq);
    if (env.relaydscope) {
      // A filtered source: a scope-left delete removes the object from the
      // view like a delete (the object still exists, out of the filter); a
      // scope-entered add adds it.
      log("info", `object ${env.relaydscope} the source's filter`, { source: env.relaydsource, namespace: env.k8snamespace, name: env.k8sname, seq });
    }
    out({
      ...base,
      action,
      name: env.k8sname,
      uid: env.k8suid,
      resourceVersion: env.k8sresourceversion,
      origin: env.relaydorigin,
      ...(env.relaydscope ? { scope: env.relaydscope } : {}),
      ...(env.relaydfinalunknown ? { finalUnknown: true } : {}),
    });
    return undefined;
  } catch (err) {
    return err;
  }
}

function markerScope(source: string, d: SyncData): Scope | undefined {
  if (!d.resource || !d.version) return undefined;
  return {
    source,
    group: d.group ?? "",
    version: d.version,
    resource: d.resource,
    kind: d.kind,
    namespace: d.namespace ?? "",
    labelSelector: d.labelSelector,
    fieldSelector: d.fieldSelector,
  };
}

/**
 * reconcile handles a completed relist. After reason expired,
 * no-checkpoint, requested or config-changed the events between the
 * markers brought the view up to date. After index-lost (or an initial
 * snapshot over objects the view holds) relayd may not know objects the
 * view holds, so their deletes cannot come: they are found by a LIST with
 * the resource and selectors the marker names (or, from a relayd whose
 * markers do not name them, the resources of the entries held).
 */
async function reconcile(o: Options, m: JsMsg, source: string, d: SyncData): Promise<number> {
  if (d.reason !== "index-lost" && d.reason !== "initial") return 0;
  const ns = d.namespace ?? "";
  const held = o.view.entries(source).filter((e) => !e.deleted && (ns === "" || e.namespace === ns));
  if (held.length === 0) return 0;
  const scopes: Scope[] = [];
  const s = markerScope(source, d);
  if (s !== undefined) scopes.push(s);
  else {
    for (const e of held) {
      const slash = e.apiVersion.indexOf("/");
      const [group, version] = slash < 0 ? ["", e.apiVersion] : [e.apiVersion.slice(0, slash), e.apiVersion.slice(slash + 1)];
      if (!scopes.some((x) => x.group === group && x.version === version && x.resource === e.resource)) {
        scopes.push({ source, group, version, resource: e.resource, namespace: ns });
      }
    }
  }
  if (o.lister === undefined) {
    log("warn", "relayd relisted without its object index: objects deleted meanwhile may remain in the view; reconcile against a LIST", { source, namespace: ns, reason: d.reason, toResourceVersion: d.toResourceVersion });
    return 0;
  }
  let n = 0;
  for (const sc of scopes) {
    m.working(); // a LIST may take a while: not redelivered meanwhile
    const live = new Set((await o.lister.list(sc, d.toResourceVersion ?? "")).map((l) => l.uid));
    for (const e of held) {
      if (covers(sc, e) && !live.has(e.uid)) {
        o.view.markDeleted(e);
        n++;
      }
    }
  }
  if (n > 0) log("info", "reconciled after a relist", { source, namespace: ns, reason: d.reason, removed: n });
  return n;
}

/**
 * relistAll loads the view from a LIST of every scope it knows (the ones
 * the sync markers named, and --follow): a listed object newer than the
 * view's entry is stored (as a reference), and an entry of the scope the
 * LIST lacks becomes a tombstone.
 */
async function relistAll(o: Options, why: string): Promise<void> {
  const seen = new Set<string>();
  for (const s of [...o.view.scopes(), ...o.follow]) {
    const k = `${s.source}/${s.namespace}`;
    if (seen.has(k)) continue;
    seen.add(k);
    const listed = await (o.lister as Lister).list(s);
    const live = new Set<string>();
    let changed = 0;
    for (const l of listed) {
      live.add(l.uid);
      if (decide(o.view.get(s.source, l.uid), "modified", l.resourceVersion) !== "store") continue;
      const kind = l.kind || s.kind || "";
      o.view.put({
        source: s.source,
        apiVersion: apiVersion(s),
        kind,
        resource: s.resource,
        namespace: l.namespace,
        name: l.name,
        uid: l.uid,
        resourceVersion: l.resourceVersion,
        payload: "reference",
        object: { apiVersion: apiVersion(s), kind, namespace: l.namespace, name: l.name, uid: l.uid, resourceVersion: l.resourceVersion },
      });
      changed++;
    }
    for (const e of o.view.entries(s.source)) {
      if (!e.deleted && !live.has(e.uid) && covers(s, e)) {
        o.view.markDeleted(e);
        changed++;
      }
    }
    out({ relist: why, source: s.source, resource: `${apiVersion(s)}/${s.resource}`, namespace: s.namespace, changed });
  }
  if (seen.size === 0) log("error", "the view must be loaded by a LIST but no source's scope is known: give --follow", { reason: why });
}

/**
 * Watchdog keeps the newest heartbeat of each (source, namespace) and,
 * while the consumer is caught up with the stream, logs "heartbeat missing"
 * once when the next one is 2 intervals overdue, and "heartbeat resumed"
 * when one comes again (docs/CONSUMING.md, "Heartbeats").
 */
class Watchdog {
  private beats = new Map<string, { at: number; intervalMs: number; missing: boolean }>();
  private caughtUp = false;

  beat(env: Envelope, pending: number): void {
    const d = env.data as { intervalSeconds?: number } | undefined;
    const key = `${env.relaydsource}/${env.k8snamespace ?? ""}`;
    const at = Date.parse(env.time ?? "");
    if (typeof d?.intervalSeconds !== "number" || !(d.intervalSeconds > 0) || Number.isNaN(at)) {
      throw new Unusable("heartbeat without time or intervalSeconds");
    }
    const prev = this.beats.get(key);
    if (prev !== undefined && prev.at > at) return; // an older one
    if (prev?.missing) log("info", "heartbeat resumed", { source: env.relaydsource, namespace: env.k8snamespace ?? "" });
    this.beats.set(key, { at, intervalMs: d.intervalSeconds * 1000, missing: false });
    this.caughtUp = pending === 0;
  }

  seen(pending: number): void {
    this.caughtUp = pending === 0;
  }

  check(now: number): void {
    if (!this.caughtUp) return;
    for (const [key, b] of this.beats) {
      if (!b.missing && now - b.at > 2 * b.intervalMs) {
        b.missing = true;
        const [source, namespace] = key.split("/");
        log("warn", "heartbeat missing: relayd absent, not running the source, or the watch down or stalled", { source, namespace });
      }
    }
  }
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (err) => {
    process.stderr.write(`consumer: ${errorText(err)}\n`);
    process.exit(1);
  },
);
