// LIST of the apiserver over HTTPS with a kubeconfig's credentials: what a
// reconcile after index-lost and a bootstrap need (docs/CONSUMING.md,
// "Keeping a view of the cluster", rule 5, and "Bootstrapping a new
// consumer"). Only what a LIST needs: the current context's server, CA,
// and a bearer token or client certificate (no exec or auth-provider
// plugins).

import { readFileSync } from "node:fs";
import { request, type RequestOptions } from "node:https";
import { dirname, isAbsolute, join } from "node:path";
import { parse } from "yaml";
import type { Scope } from "./view.js";

/** One object of a LIST. */
export interface Listed {
  uid: string;
  namespace: string;
  name: string;
  kind: string;
  resourceVersion: string;
}

type Named<T> = { name: string } & T;
interface Kubeconfig {
  "current-context"?: string;
  contexts?: Named<{ context: { cluster: string; user: string } }>[];
  clusters?: Named<{ cluster: Record<string, string | boolean> }>[];
  users?: Named<{ user: Record<string, string> }>[];
}

export class Lister {
  private readonly server: URL;
  private readonly tls: RequestOptions;
  private readonly token?: string;

  /** Lister reads the kubeconfig at path (its current context). */
  constructor(path: string) {
    const where = `kubeconfig ${path}`;
    let kc: Kubeconfig;
    try {
      kc = parse(readFileSync(path, "utf8")) as Kubeconfig;
    } catch (err) {
      throw new Error(`${where}: ${(err as Error).message}`);
    }
    const file = (p: string) => readFileSync(isAbsolute(p) ? p : join(dirname(path), p));
    const ctxName = kc["current-context"];
    const ctx = kc.contexts?.find((c) => c.name === ctxName)?.context;
    if (!ctx) throw new Error(`${where}: current-context ${JSON.stringify(ctxName)} is not among its contexts`);
    const cluster = kc.clusters?.find((c) => c.name === ctx.cluster)?.cluster;
    if (!cluster || typeof cluster.server !== "string") throw new Error(`${where}: cluster ${JSON.stringify(ctx.cluster)} has no server`);
    const user = kc.users?.find((u) => u.name === ctx.user)?.user ?? {};
    this.server = new URL(cluster.server);
    const tls: RequestOptions = {};
    if (typeof cluster["certificate-authority-data"] === "string") tls.ca = Buffer.from(cluster["certificate-authority-data"], "base64");
    else if (typeof cluster["certificate-authority"] === "string") tls.ca = file(cluster["certificate-authority"]);
    if (cluster["insecure-skip-tls-verify"] === true) tls.rejectUnauthorized = false;
    if (user["client-certificate-data"]) tls.cert = Buffer.from(user["client-certificate-data"], "base64");
    else if (user["client-certificate"]) tls.cert = file(user["client-certificate"]);
    if (user["client-key-data"]) tls.key = Buffer.from(user["client-key-data"], "base64");
    else if (user["client-key"]) tls.key = file(user["client-key"]);
    this.tls = tls;
    if (user.token) this.token = user.token;
    else if (user.tokenFile) this.token = file(user.tokenFile).toString("utf8").trim();
    if (user.exec || user["auth-provider"]) throw new Error(`${where}: user ${JSON.stringify(ctx.user)}: exec and auth-provider credentials are not supported here`);
  }

  /**
   * list lists the objects of a scope (all pages), at a resourceVersion at
   * or after minRV ("": the current one).
   */
  async list(s: Scope, minRV = ""): Promise<Listed[]> {
    let path = s.group === "" ? `/api/${s.version}` : `/apis/${s.group}/${s.version}`;
    if (s.namespace !== "") path += `/namespaces/${encodeURIComponent(s.namespace)}`;
    path += `/${s.resource}`;
    const out: Listed[] = [];
    let cont = "";
    for (;;) {
      const query = new URLSearchParams({ limit: "500" });
      if (s.labelSelector) query.set("labelSelector", s.labelSelector);
      if (s.fieldSelector) query.set("fieldSelector", s.fieldSelector);
      if (cont !== "") query.set("continue", cont);
      else if (minRV !== "") {
        query.set("resourceVersion", minRV);
        query.set("resourceVersionMatch", "NotOlderThan");
      }
      const page = (await this.get(`${path}?${query}`)) as {
        kind?: string;
        items: { kind?: string; metadata: { uid: string; namespace?: string; name: string; resourceVersion: string } }[];
        metadata: { continue?: string };
      };
      const kind = (page.kind ?? "").replace(/List$/, "");
      for (const it of page.items ?? []) {
        const m = it.metadata;
        out.push({ uid: m.uid, namespace: m.namespace ?? "", name: m.name, kind: it.kind ?? kind, resourceVersion: m.resourceVersion });
      }
      cont = page.metadata?.continue ?? "";
      if (cont === "") return out;
    }
  }

  private get(pathAndQuery: string): Promise<unknown> {
    const url = new URL(pathAndQuery, this.server);
    const headers: Record<string, string> = { Accept: "application/json" };
    if (this.token) headers.Authorization = `Bearer ${this.token}`;
    return new Promise((resolve, reject) => {
      const req = request(url, { ...this.tls, method: "GET", headers, timeout: 60_000 }, (res) => {
        const chunks: Buffer[] = [];
        res.on("data", (c: Buffer) => chunks.push(c));
        res.on("end", () => {
          const body = Buffer.concat(chunks).toString("utf8");
          if (res.statusCode !== 200) {
            reject(new Error(`GET ${url.pathname}${url.search}: ${res.statusCode} ${body.slice(0, 300)}`));
            return;
          }
          try {
            resolve(JSON.parse(body));
          } catch (err) {
            reject(new Error(`GET ${url.pathname}: ${(err as Error).message}`));
          }
        });
        res.on("error", reject);
      });
      req.on("timeout", () => req.destroy(new Error(`GET ${url.pathname}: timed out`)));
      req.on("error", reject);
      req.end();
    });
  }
}
