// Decoding and checking relayd's messages (docs/CONSUMING.md, "The event on
// the wire" and "Bad input").

import { createHash } from "node:crypto";
import { HTTP, type CloudEvent } from "cloudevents";

/** A message that no redelivery can make usable: it is terminated. */
export class Unusable extends Error {}

/** What a message is, once checked. */
export type Kind = "object" | "sync.started" | "sync.completed" | "heartbeat";

/** The CloudEvent of a relayd message, its extensions typed as structured mode types them. */
export interface Envelope {
  id: string;
  source: string;
  type: string;
  subject?: string;
  time?: string;
  data?: unknown;
  k8scluster?: string;
  k8sapiversion?: string;
  k8skind?: string;
  k8sresource?: string;
  k8snamespace?: string;
  k8sname?: string;
  k8suid?: string;
  k8sresourceversion?: string;
  relaydsource?: string;
  relaydorigin?: string;
  relaydepoch?: number;
  relaydpayload?: string;
  relaydscope?: string;
  relaydfinalunknown?: boolean;
}

/** The data of a sync marker (docs/CONSUMING.md, "The sync markers"). */
export interface SyncData {
  namespace: string;
  epoch: number;
  reason: string;
  requestId?: string;
  full?: boolean;
  fromResourceVersion?: string;
  toResourceVersion?: string;
  group?: string;
  version?: string;
  resource?: string;
  kind?: string;
  labelSelector?: string;
  fieldSelector?: string;
}

const boolExtensions = ["relaydoversize", "relaydunencodable", "relaydfinalunknown", "relaydchangedunknown"];

/**
 * decode reads a NATS message in either CloudEvents mode with the CloudEvents
 * SDK's HTTP binding: a binary-mode NATS message carries the same ce-*
 * headers as an HTTP request in binary mode, a structured one the same
 * application/cloudevents+json document. Binary-mode header values are
 * percent-encoded where needed (the SDK does not decode them), and every one
 * is a string: relaydepoch and the flags are typed here as structured mode
 * types them.
 */
export function decode(headers: Map<string, string>, body: Uint8Array): Envelope {
  const h: Record<string, string> = {};
  const structured = (headers.get("content-type") ?? "").startsWith("application/cloudevents+json");
  for (const [k, v] of headers) {
    if (k.startsWith("ce-")) {
      if (structured) continue;
      try {
        h[k] = decodeURIComponent(v);
      } catch {
        throw new Unusable(`header ${k}: malformed percent-encoding`);
      }
    } else if (k === "content-type") {
      h[k] = v;
    }
  }
  let ce: CloudEvent<unknown>;
  try {
    ce = HTTP.toEvent({ headers: h, body: new TextDecoder("utf-8", { fatal: true }).decode(body) }) as CloudEvent<unknown>;
    ce.validate();
  } catch (err) {
    throw new Unusable(`not a CloudEvent: ${errorText(err)}`);
  }
  const env = { ...ce } as Record<string, unknown>;
  if (typeof env.relaydepoch === "string") env.relaydepoch = Number(env.relaydepoch);
  for (const f of boolExtensions) {
    if (typeof env[f] === "string") env[f] = env[f] === "true";
  }
  if (env.data === "") delete env.data; // an event without data (relaydunencodable): an empty body in binary mode
  if (typeof env.data === "string" && (env.datacontenttype === "application/json" || env.datacontenttype === undefined)) {
    try {
      env.data = JSON.parse(env.data as string);
    } catch (err) {
      throw new Unusable(`data is not JSON: ${errorText(err)}`);
    }
  }
  return env as unknown as Envelope;
}

const tokenRE = /^[A-Za-z0-9_-]+$/;

/** A relayd source or cluster name: letters, digits, '_' and '-'. */
export function validToken(s: string | undefined): boolean {
  return s !== undefined && tokenRE.test(s);
}

/**
 * check tells whether a decoded message is one relayd published for this
 * consumer's cluster, and what it is (docs/CONSUMING.md, "Bad input"): the
 * type is one relayd publishes under prefix; k8scluster is the cluster;
 * source is /relayd/<cluster>/<relaydsource>; Nats-Msg-Id, when present, is
 * <prefix>.<cluster>/<relaydsource>/<id> (or the older
 * <relaydsource>/<id>); a marker or heartbeat is on its source's control
 * subject; an object event carries a uid and a resourceVersion, its id is
 * <uid>/<resourceVersion>[/deleted] (or a full resync's), and its subject
 * names exactly the envelope's cluster, group, version, resource,
 * namespace, name (or its hash token) and change type.
 */
export function check(prefix: string, cluster: string, subject: string, msgId: string, env: Envelope): Kind {
  if (env.k8scluster !== cluster) throw new Unusable(`k8scluster ${q(env.k8scluster)}, want ${q(cluster)} (the cluster this consumer follows)`);
  const src = env.relaydsource;
  if (!validToken(src)) throw new Unusable(`relaydsource ${q(src)} is not a source name`);
  if (env.source !== `/relayd/${cluster}/${src}`) throw new Unusable(`source ${q(env.source)}, want ${q(`/relayd/${cluster}/${src}`)}`);
  const own = `${prefix}.${cluster}/${src}/${env.id}`;
  if (msgId !== "" && msgId !== own && msgId !== `${src}/${env.id}`) throw new Unusable(`Nats-Msg-Id ${q(msgId)} is not ${q(own)}`);
  if (!env.type.startsWith(prefix + ".")) throw new Unusable(`type ${q(env.type)} does not start with ${q(prefix + ".")}`);
  const rest = env.type.slice(prefix.length + 1);
  const control = `${prefix}.${cluster}._relayd.${src}`;
  switch (rest) {
    case "source.sync.started":
    case "source.sync.completed": {
      const phase = rest.slice("source.sync.".length);
      if (subject !== `${control}.sync.${phase}`) throw new Unusable(`subject ${q(subject)}, want ${q(`${control}.sync.${phase}`)}`);
      return phase === "started" ? "sync.started" : "sync.completed";
    }
    case "source.heartbeat":
      if (subject !== `${control}.heartbeat`) throw new Unusable(`subject ${q(subject)}, want ${q(`${control}.heartbeat`)}`);
      return "heartbeat";
    case "object.added":
    case "object.modified":
    case "object.deleted":
      checkObject(prefix, subject, rest.slice("object.".length), env);
      return "object";
  }
  throw new Unusable(`type ${q(env.type)} is none of relayd's`);
}

function checkObject(prefix: string, subject: string, typ: string, env: Envelope): void {
  if (!env.k8suid || !env.k8sresourceversion) {
    throw new Unusable(`object event without k8suid (${q(env.k8suid)}) or k8sresourceversion (${q(env.k8sresourceversion)})`);
  }
  if (!/^[0-9]+$/.test(env.k8sresourceversion)) {
    throw new Unusable(`resourceVersion ${q(env.k8sresourceversion)} cannot be compared (not an integer)`);
  }
  let wantID = `${env.k8suid}/${env.k8sresourceversion}`;
  if (typ === "deleted") wantID += "/deleted";
  const fullResync = env.relaydorigin === "resync" && env.id === `${wantID}/full/${env.relaydepoch}`;
  if (env.id !== wantID && !fullResync) throw new Unusable(`id ${q(env.id)}, want ${q(wantID)} (k8suid/k8sresourceversion)`);
  const p = parseSubject(subject);
  const av = env.k8sapiversion ?? "";
  const slash = av.indexOf("/");
  const [group, version] = slash < 0 ? ["", av] : [av.slice(0, slash), av.slice(slash + 1)];
  const name = p.nameHash !== "" && p.nameHash === hashToken(env.k8sname ?? "") ? env.k8sname : p.name;
  const pairs: [string, string, string | undefined][] = [
    ["prefix", p.prefix, prefix],
    ["cluster", p.cluster, env.k8scluster],
    ["group", p.group, group],
    ["version", p.version, version],
    ["resource", p.resource, env.k8sresource ?? ""],
    ["namespace", p.namespace, env.k8snamespace ?? ""],
    ["name", name ?? "", env.k8sname ?? ""],
    ["change type", p.type, typ],
  ];
  for (const [what, fromSubject, fromEnv] of pairs) {
    if (fromSubject !== fromEnv) throw new Unusable(`subject ${q(subject)}: ${what} ${q(fromSubject)}, the event says ${q(fromEnv)}`);
  }
}

interface SubjectParts {
  prefix: string;
  cluster: string;
  group: string;
  version: string;
  resource: string;
  namespace: string;
  name: string;
  nameHash: string;
  type: string;
}

/**
 * parseSubject takes an object subject apart:
 * <prefix>.<cluster>.<group|core>.<version>.<resource>.<namespace|_>.<name>.<type>,
 * every variable token decoded (%HH escapes; a placeholder for ""; a
 * %H<32 hex> hash token for an over-long name).
 */
export function parseSubject(subject: string): SubjectParts {
  const toks = subject.split(".");
  if (toks.length < 8) throw new Unusable(`subject ${q(subject)}: not an object subject (too few tokens)`);
  const t = toks.slice(-7);
  const prefix = toks.slice(0, -7).join(".");
  if (!toks.slice(0, -7).every(validToken) || !validToken(t[0])) throw new Unusable(`subject ${q(subject)}: invalid prefix or cluster token`);
  const slot = (tok: string, placeholder: string, what: string): string => {
    if (tok === placeholder) return "";
    try {
      return decodeToken(tok);
    } catch {
      throw new Unusable(`subject ${q(subject)}: malformed ${what} token ${q(tok)}`);
    }
  };
  let name = "";
  let nameHash = "";
  if (t[5].startsWith("%H")) {
    if (!/^%H[0-9a-f]{32}$/.test(t[5])) throw new Unusable(`subject ${q(subject)}: malformed hash token ${q(t[5])}`);
    nameHash = t[5];
  } else {
    name = slot(t[5], "_", "name");
  }
  return {
    prefix,
    cluster: t[0],
    group: slot(t[1], "core", "group"),
    version: slot(t[2], "_", "version"),
    resource: slot(t[3], "_", "resource"),
    namespace: slot(t[4], "_", "namespace"),
    name,
    nameHash,
    type: t[6],
  };
}

function decodeToken(tok: string): string {
  if (!/^([^%]|%[0-9A-F]{2})*$/.test(tok)) throw new Error("bad escape");
  const bytes: number[] = [];
  for (let i = 0; i < tok.length; ) {
    if (tok[i] === "%") {
      bytes.push(parseInt(tok.slice(i + 1, i + 3), 16));
      i += 3;
    } else {
      bytes.push(...Buffer.from(tok[i], "utf8"));
      i++;
    }
  }
  return new TextDecoder("utf-8", { fatal: true }).decode(Uint8Array.from(bytes));
}

/** The name token of an over-long subject: "%H" + hex(sha256(name)[:16]). */
export function hashToken(name: string): string {
  return "%H" + createHash("sha256").update(name, "utf8").digest("hex").slice(0, 32);
}

/** q quotes a value from a message for an error text or a log (JSON string escapes, non-ASCII too). */
export function q(s: string | undefined): string {
  return s === undefined ? "<absent>" : safeJSON(s);
}

/**
 * safeJSON is JSON.stringify with every character outside printable ASCII
 * escaped: names from a message never reach a terminal as control
 * characters, escape sequences or bidi overrides.
 */
export function safeJSON(v: unknown): string {
  return JSON.stringify(v).replace(/[\u007f-\uffff]/g, (c) => "\\u" + c.charCodeAt(0).toString(16).padStart(4, "0"));
}

export function errorText(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
