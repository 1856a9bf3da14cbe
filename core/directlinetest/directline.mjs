// Drives the real Direct Line client library (botframework-directlinejs) against a running
// core, in polling mode and in WebSocket mode: post a message and receive its echo, upload
// a file, refresh the token, and resume the conversation by id without losing or
// duplicating an activity. Run by core/directlinetest's Go test with BASE (the core's base
// URL) and SECRET (the secret of an echo channel). Exits 0 when every check passes.
import http from 'node:http';
import XMLHttpRequest from 'xhr2';
import WebSocket from 'ws';

// Node has neither XMLHttpRequest nor a browser WebSocket: the library uses both globals.
globalThis.XMLHttpRequest = XMLHttpRequest;
globalThis.WebSocket = WebSocket;
// A browser's XMLHttpRequest sends FormData as multipart; xhr2 does not, so encode it the
// way a browser would (Response serialises FormData with a boundary).
const send = XMLHttpRequest.prototype.send;
XMLHttpRequest.prototype.send = function (body) {
  if (body instanceof FormData) {
    const r = new Response(body);
    this.setRequestHeader('Content-Type', r.headers.get('content-type'));
    r.arrayBuffer().then((buf) => send.call(this, Buffer.from(buf)), (err) => this.onerror?.(err));
    return;
  }
  return send.call(this, body);
};

const { DirectLine, ConnectionStatus } = await import('botframework-directlinejs');

const BASE = process.env.BASE;
const SECRET = process.env.SECRET;
const DOMAIN = `${BASE}/api/v1/converger`;
const WAIT_MS = 15000;

function fail(msg) {
  console.error(`FAIL: ${msg}`);
  process.exit(1);
}

const overall = setTimeout(() => fail('timed out after 90 s'), 90000);

async function post(path, token, body) {
  const r = await fetch(`${DOMAIN}${path}`, {
    method: 'POST',
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await r.text();
  if (!r.ok) fail(`POST ${path}: ${r.status} ${text}`);
  return JSON.parse(text);
}

// waitFor resolves with the first collected activity that matches, or fails after WAIT_MS.
function waitFor(seen, what, match) {
  return new Promise((resolve) => {
    const deadline = Date.now() + WAIT_MS;
    const tick = () => {
      const found = seen.find(match);
      if (found) return resolve(found);
      if (Date.now() > deadline) fail(`${what} never arrived; got ${JSON.stringify(seen.map((a) => a.text ?? a.type))}`);
      setTimeout(tick, 25);
    };
    tick();
  });
}

function postActivity(dl, activity) {
  return new Promise((resolve, reject) => dl.postActivity(activity).subscribe(resolve, reject));
}

// A file for the upload, served over HTTP since the library fetches contentUrl itself.
const fileBytes = Buffer.from('hello from a file\n');
const files = http.createServer((req, res) => {
  res.writeHead(200, { 'content-type': 'text/plain' });
  res.end(fileBytes);
});
await new Promise((r) => files.listen(0, '127.0.0.1', r));
const fileUrl = `http://127.0.0.1:${files.address().port}/note.txt`;

async function scenario(mode) {
  const webSocket = mode === 'websocket';
  const { token } = await post('/tokens/generate', SECRET, { user: { id: `user-${mode}` } });
  const dl = new DirectLine({ token, domain: DOMAIN, webSocket, pollingInterval: 200, timeout: 10000 });
  const seen = [];
  const sub = dl.activity$.subscribe((a) => seen.push(a), (err) => fail(`${mode}: activity$ failed: ${err}`));

  // A message, its echo, and channelData's clientActivityID round trip.
  const id = await postActivity(dl, {
    type: 'message', from: { id: `user-${mode}` }, text: `hello ${mode}`,
    channelData: { clientActivityID: `cid-${mode}` },
  });
  const own = await waitFor(seen, `${mode}: the posted message`, (a) => a.id === id);
  if (own.channelData?.clientActivityID !== `cid-${mode}` || own.from?.id !== `user-${mode}`) {
    fail(`${mode}: posted message came back as ${JSON.stringify(own)}`);
  }
  await waitFor(seen, `${mode}: the echo`, (a) => a.from?.id === 'bot' && a.text === `echo: hello ${mode}`);
  if (dl.connectionStatus$.getValue() !== ConnectionStatus.Online) fail(`${mode}: not online`);

  // An upload: the activity carries the file, and its contentUrl serves the bytes.
  const upId = await postActivity(dl, {
    type: 'message', from: { id: `user-${mode}` }, text: `a file (${mode})`,
    attachments: [{ contentType: 'text/plain', contentUrl: fileUrl, name: 'note.txt' }],
  });
  const up = await waitFor(seen, `${mode}: the upload`, (a) => a.id === upId);
  const att = up.attachments?.[0];
  if (!att?.contentUrl || att.contentType !== 'text/plain') fail(`${mode}: upload came back as ${JSON.stringify(up)}`);
  const got = Buffer.from(await (await fetch(att.contentUrl)).arrayBuffer());
  if (!got.equals(fileBytes)) fail(`${mode}: the uploaded file came back as ${JSON.stringify(got.toString())}`);
  // Its echo too, so that the watermark taken below is past everything this conversation
  // has produced so far (on a busy machine the echo may otherwise come after it).
  await waitFor(seen, `${mode}: the upload's echo`, (a) => a.from?.id === 'bot' && a.text === `echo: a file (${mode})`);

  // Token refresh, as the library does every 15 minutes.
  const refreshed = await new Promise((resolve, reject) => dl.refreshToken().subscribe(resolve, reject));
  if (typeof refreshed !== 'string' || refreshed === dl.token) fail(`${mode}: refresh gave ${refreshed}`);

  // Resume: leave, let an activity happen meanwhile, come back by conversation id and
  // watermark, and receive exactly what came after, once.
  const before = new Set(seen.map((a) => a.id));
  const watermark = dl.watermark;
  const conversationId = dl.conversationId;
  sub.unsubscribe();
  dl.end();
  const missed = await post(`/conversations/${conversationId}/activities`, refreshed, {
    type: 'message', from: { id: `user-${mode}` }, text: `while away (${mode})`,
  });
  const dl2 = new DirectLine({ token: refreshed, conversationId, watermark, domain: DOMAIN, webSocket, pollingInterval: 200, timeout: 10000 });
  const seen2 = [];
  const sub2 = dl2.activity$.subscribe((a) => seen2.push(a), (err) => fail(`${mode}: resumed activity$ failed: ${err}`));
  await waitFor(seen2, `${mode}: the activity posted while away`, (a) => a.id === missed.id);
  await waitFor(seen2, `${mode}: its echo`, (a) => a.text === `echo: while away (${mode})`);
  const post2 = await postActivity(dl2, { type: 'message', from: { id: `user-${mode}` }, text: `back (${mode})` });
  await waitFor(seen2, `${mode}: a message after the resume`, (a) => a.id === post2);
  await waitFor(seen2, `${mode}: its echo after the resume`, (a) => a.text === `echo: back (${mode})`);
  await new Promise((r) => setTimeout(r, 500)); // time for a duplicate to show up
  const ids = seen2.map((a) => a.id);
  if (new Set(ids).size !== ids.length) fail(`${mode}: duplicates after the resume: ${ids}`);
  const replayed = ids.filter((x) => before.has(x));
  if (replayed.length) fail(`${mode}: activities before the watermark came again: ${replayed}`);
  if (ids.length !== 4) fail(`${mode}: after the resume got ${ids.length} activities, want 4: ${JSON.stringify(seen2.map((a) => a.text))}`);
  sub2.unsubscribe();
  dl2.end();
  console.log(`ok ${mode}: message and echo, upload, refresh, resume without loss or duplicates`);
}

await scenario('polling');
await scenario('websocket');
clearTimeout(overall);
files.close();
process.exit(0);
