// A control-socket client written in another language than the collector: Node.js, its standard
// library only, no JSON canonicalisation. It writes request frames the way any JavaScript program
// would (JSON.stringify: keys in insertion order, non-ASCII characters as they are) and binds each
// frame's bearer token to the body's text as sent (protocol 7), or, to show what 7 removes, to the
// same text in a frame written in protocol 6, where the gateway hashes a canonical form instead.
//
// usage: node frame_client.js KEY_PEM COLLECTOR_ID   (prints a JSON array of frames)
"use strict";
const crypto = require("crypto");
const fs = require("fs");

const [keyPath, collectorId] = process.argv.slice(2);
const key = crypto.createPrivateKey(fs.readFileSync(keyPath));
const b64url = (buf) => Buffer.from(buf).toString("base64url");

function token(kind, bodyText) {
  const now = Math.floor(Date.now() / 1000);
  const header = { alg: "ES256", typ: "JWT" };
  const claims = {
    iss: collectorId, sub: collectorId, aud: "versus-collector-gateway", iat: now, exp: now + 60,
    jti: b64url(crypto.randomBytes(12)), htm: "FRAME", htu: "/api/collector/v1/" + kind,
    bsh: b64url(crypto.createHash("sha256").update(Buffer.from(bodyText, "utf8")).digest()),
  };
  const input = b64url(JSON.stringify(header)) + "." + b64url(JSON.stringify(claims));
  const sig = crypto.sign("sha256", Buffer.from(input), { key, dsaEncoding: "ieee-p1363" });
  return input + "." + b64url(sig);
}

function frame(version, id, kind, body) {
  const text = JSON.stringify(body);
  const member = version >= 7 ? text : body;
  return JSON.stringify({ v: version, id, type: kind, auth: token(kind, text), body: member });
}

const session = "s-node";
console.log(JSON.stringify([
  frame(7, "claim", "claim", { wait_s: 0, session_id: session, protocol: { min: 1, max: 7 } }),
  frame(7, "bye", "bye", { session_id: session, reason: "arrêt — maintenance" }),
  frame(6, "bye6", "bye", { session_id: session, reason: "arrêt — maintenance" }),
]));
