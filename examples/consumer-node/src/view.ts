// The view: relayd's objects keyed by (relaydsource, k8suid), with
// tombstones, kept in a JSON file that is written (whole, then renamed
// over the old one) before a message is acknowledged
// (docs/CONSUMING.md, "Keeping a view of the cluster").

import { readFileSync, renameSync, writeFileSync } from "node:fs";
import type { Envelope } from "./envelope.js";

/** What the view holds for one object: its last applied state, or a tombstone. */
export interface Entry {
  source: string;
  apiVersion: string;
  kind: string;
  resource: string;
  namespace: string;
  name: string;
  uid: string;
  resourceVersion: string;
  payload: string;
  object?: unknown;
  deleted?: boolean;
  /** When the view applied the delete (RFC 3339). */
  deletedAt?: string;
}

/** What one watch of a source covers, as its sync markers name it: what a LIST asks for. */
export interface Scope {
  source: string;
  group: string;
  version: string;
  resource: string;
  kind?: string;
  /** "" for all namespaces or a cluster-scoped resource. */
  namespace: string;
  labelSelector?: string;
  fieldSelector?: string;
}

export function apiVersion(s: Scope): string {
  return s.group === "" ? s.version : `${s.group}/${s.version}`;
}

export function covers(s: Scope, e: Entry): boolean {
  return e.source === s.source && e.apiVersion === apiVersion(s) && e.resource === s.resource && (s.namespace === "" || e.namespace === s.namespace);
}

/** The state file: the view, the scopes the markers named, and the last stream sequence applied. */
interface State {
  /** The last stream sequence this consumer applied (and then acknowledged). */
  streamSeq: number;
  /** "<source>/<uid>" → entry. */
  objects: Record<string, Entry>;
  /** "<source>/<namespace|_>" → scope. */
  scopes: Record<string, Scope>;
}

export type Action = "skip" | "store" | "delete";

/**
 * decide applies the ordering rule to one object event: an added or
 * modified event is stored only if its resourceVersion is greater than the
 * held entry's (tombstone included); a delete is applied if its
 * resourceVersion is greater or equal (a delete a relist inferred carries
 * the last version relayd published, which may be the held one).
 * resourceVersions are integers (Kubernetes v1.35 and later): compared as
 * such, of any length.
 */
export function decide(held: Entry | undefined, typ: string, rv: string): Action {
  const del = typ === "deleted";
  if (held === undefined) return del ? "delete" : "store";
  const c = compareRV(rv, held.resourceVersion);
  if (del && (c > 0 || (c === 0 && !held.deleted))) return "delete";
  if (!del && c > 0) return "store";
  return "skip";
}

export function compareRV(a: string, b: string): number {
  const x = BigInt(a);
  const y = BigInt(b);
  return x < y ? -1 : x > y ? 1 : 0;
}

export class View {
  private state: State = { streamSeq: 0, objects: {}, scopes: {} };
  /** Whether the state file existed when the view was opened. */
  readonly existed: boolean;

  constructor(private readonly path: string) {
    let text: string | undefined;
    try {
      text = readFileSync(path, "utf8");
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== "ENOENT") throw new Error(`view file ${path}: ${(err as Error).message}`);
    }
    this.existed = text !== undefined;
    if (text !== undefined) {
      try {
        this.state = JSON.parse(text) as State;
      } catch (err) {
        throw new Error(`view file ${path}: ${(err as Error).message}`);
      }
    }
  }

  get streamSeq(): number {
    return this.state.streamSeq;
  }

  get(source: string, uid: string): Entry | undefined {
    return this.state.objects[`${source}/${uid}`];
  }

  put(e: Entry): void {
    this.state.objects[`${e.source}/${e.uid}`] = e;
  }

  remove(e: Entry): void {
    delete this.state.objects[`${e.source}/${e.uid}`];
  }

  /** Every entry of a source ("" for all), tombstones included. */
  entries(source = ""): Entry[] {
    return Object.values(this.state.objects).filter((e) => source === "" || e.source === source);
  }

  putScope(s: Scope): void {
    this.state.scopes[`${s.source}/${s.namespace || "_"}`] = s;
  }

  scopes(): Scope[] {
    return Object.values(this.state.scopes);
  }

  /** apply applies one object event and returns what it did. */
  apply(env: Envelope): Action {
    const source = env.relaydsource as string;
    const uid = env.k8suid as string;
    const typ = env.type.slice(env.type.lastIndexOf(".") + 1);
    const act = decide(this.get(source, uid), typ, env.k8sresourceversion as string);
    if (act === "skip") return act;
    const e: Entry = {
      source,
      apiVersion: env.k8sapiversion ?? "",
      kind: env.k8skind ?? "",
      resource: env.k8sresource ?? "",
      namespace: env.k8snamespace ?? "",
      name: env.k8sname ?? "",
      uid,
      resourceVersion: env.k8sresourceversion as string,
      payload: env.relaydpayload ?? "",
    };
    if (act === "delete") {
      e.deleted = true;
      e.deletedAt = new Date().toISOString();
    } else {
      e.object = env.data;
    }
    this.put(e);
    return act;
  }

  /** markDeleted turns an entry into a tombstone at its held version (a reconcile found it gone). */
  markDeleted(e: Entry): void {
    this.put({ ...e, deleted: true, deletedAt: new Date().toISOString(), object: undefined });
  }

  /** pruneTombstones removes the tombstones applied before cutoff; it returns how many. */
  pruneTombstones(cutoff: Date): number {
    let n = 0;
    for (const e of this.entries()) {
      if (e.deleted && e.deletedAt !== undefined && new Date(e.deletedAt) < cutoff) {
        this.remove(e);
        n++;
      }
    }
    return n;
  }

  /** save writes the view, and seq as the last stream sequence applied, to its file (whole, renamed over the old one). */
  save(seq?: number): void {
    this.advance(seq);
    const tmp = `${this.path}.tmp`;
    writeFileSync(tmp, JSON.stringify(this.state));
    renameSync(tmp, this.path);
    this.dirty = false;
  }

  private dirty = false;

  /**
   * advance records seq as the last stream sequence read without changing
   * the view (a heartbeat): written by the next save or flush, not at once.
   */
  advance(seq?: number): void {
    if (seq !== undefined && seq > this.state.streamSeq) {
      this.state.streamSeq = seq;
      this.dirty = true;
    }
  }

  /** flush saves the view if advance recorded a sequence since the last save. */
  flush(): void {
    if (this.dirty) this.save();
  }
}
