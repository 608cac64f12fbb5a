// Decodes and checks relayd's golden messages (pkg/event/testdata/golden,
// both CloudEvents modes) with the example's dist/envelope.js, and prints
// one JSON line per file: what it is, or why it was refused. Run by
// golden_test.go after tsc: node test/golden.mjs DIR
import { readFileSync, readdirSync } from "node:fs";
import { check, decode } from "../dist/envelope.js";

const dir = process.argv[2];
for (const file of readdirSync(dir).sort()) {
  // The .msg format: "subject: S", then headers "Name: value", a blank line, the body.
  const text = readFileSync(`${dir}/${file}`, "utf8");
  const blank = text.indexOf("\n\n");
  const headers = new Map();
  let subject = "";
  for (const line of text.slice(0, blank).split("\n")) {
    const colon = line.indexOf(": ");
    const [k, v] = [line.slice(0, colon), line.slice(colon + 2)];
    if (k === "subject") subject = v;
    else headers.set(k.toLowerCase(), v);
  }
  const body = new TextEncoder().encode(text.slice(blank + 2).replace(/\n$/, ""));
  try {
    const env = decode(headers, body);
    const prefix = subject.slice(0, subject.indexOf(`.${env.k8scluster}.`));
    const kind = check(prefix, env.k8scluster, subject, headers.get("nats-msg-id") ?? "", env);
    console.log(JSON.stringify({ file, kind, epoch: env.relaydepoch, finalUnknown: env.relaydfinalunknown ?? false, scope: env.relaydscope ?? "", hasData: env.data !== undefined, reason: env.data?.reason ?? "" }));
  } catch (err) {
    console.log(JSON.stringify({ file, error: err.message }));
  }
}
