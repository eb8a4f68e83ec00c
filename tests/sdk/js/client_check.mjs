// The official JavaScript SDK (@a2a-js/sdk 1.3.0) as a client of a running a2ad.
//
// Run by tests/sdk/run (which starts the server); not part of `cargo test`.
// Usage: node client_check.mjs BASE_URL API_KEY
//
// Every client method is used against the 1.0 interfaces (JSON-RPC, HTTP+JSON and gRPC,
// each picked by the SDK from the card) and against the 0.3 interface (the SDK's legacy
// transport), on the `echo` agent (instant)
// and the `slow` agent (an echo that takes a few seconds). Push notifications are received
// by a local HTTP server. Exits 1 on the first failure.

import http from 'node:http';
import { randomUUID } from 'node:crypto';
import {
  ClientFactory,
  ClientFactoryOptions,
  DefaultAgentCardResolver,
  JsonRpcTransportFactory,
  RestTransportFactory,
  createAuthenticatingFetchWithRetry,
  ServiceParameters,
  withA2AExtensions,
} from '@a2a-js/sdk/client';
import { GrpcTransportFactory } from '@a2a-js/sdk/client/grpc';
import * as grpc from '@grpc/grpc-js';

const [BASE, KEY] = process.argv.slice(2);
const DEADLINE_MS = 30_000;
const ROLE_USER = 1;
const STATE = { SUBMITTED: 1, WORKING: 2, COMPLETED: 3, CANCELED: 5 };
let checks = 0;

function check(name, ok, detail) {
  checks += 1;
  if (!ok) {
    console.log(`FAIL ${name}: ${JSON.stringify(detail)}`);
    process.exit(1);
  }
  console.log(`ok   ${name}`);
}

const fetchImpl = createAuthenticatingFetchWithRetry(fetch, {
  headers: async () => ({ 'x-api-key': KEY }),
  shouldRetryWithHeaders: async () => undefined,
});

// gRPC calls get the key as metadata: the SDK sends a call's service parameters so.
const grpcKey = {
  async before(args) {
    args.options = {
      ...args.options,
      serviceParameters: { ...args.options?.serviceParameters, 'x-api-key': KEY },
    };
  },
  async after() {},
};

function factory(binding) {
  const transport =
    binding === 'HTTP+JSON'
      ? new RestTransportFactory({ fetchImpl })
      : binding === 'GRPC'
        ? new GrpcTransportFactory({ grpcChannelCredentials: grpc.credentials.createInsecure() })
        : new JsonRpcTransportFactory({ fetchImpl, legacyCompat: { enabled: true } });
  return new ClientFactory(
    ClientFactoryOptions.createFrom(ClientFactoryOptions.default, {
      clientConfig: binding === 'GRPC' ? { interceptors: [grpcKey] } : undefined,
      transports: [transport],
      // The SDK keeps its default transports beside the one given; this picks the card's
      // interface of the binding under test.
      preferredTransports: [binding],
      cardResolver: new DefaultAgentCardResolver({ fetchImpl }),
    }),
  );
}

/** A client of `agent` on the interface of `version` over `binding`. */
async function clientOn(agent, version, binding) {
  const f = factory(binding);
  if (version === '1.0') {
    return f.createFromUrl(`${BASE}/api/v1/a2a/${agent}/`);
  }
  const card = await new DefaultAgentCardResolver({ fetchImpl }).resolve(`${BASE}/api/v1/a2a/${agent}/`);
  const keep = card.supportedInterfaces.filter((i) => i.protocolVersion === version);
  if (keep.length !== 1) check(`[${version}] the card lists a ${version} interface`, false, card);
  return f.createFromAgentCard({ ...card, supportedInterfaces: keep });
}

function userMessage(text, taskId) {
  return {
    messageId: randomUUID(),
    role: ROLE_USER,
    parts: [{ content: { $case: 'text', value: text }, filename: '', mediaType: '', metadata: undefined }],
    contextId: '',
    taskId: taskId ?? '',
    metadata: undefined,
    extensions: [],
    referenceTaskIds: [],
  };
}

function sendRequest(text, returnImmediately = false) {
  return {
    tenant: '',
    message: userMessage(text),
    configuration: {
      acceptedOutputModes: [],
      taskPushNotificationConfig: undefined,
      returnImmediately,
    },
    metadata: undefined,
  };
}

/** Drains a stream; returns [events, last task state]. */
async function drain(stream) {
  let n = 0;
  let task;
  for await (const item of stream) {
    n += 1;
    const p = item.payload;
    if (p?.$case === 'task') task = p.value;
    else if (p?.$case === 'statusUpdate' && task) task = { ...task, status: p.value.status };
  }
  return [n, task];
}

async function waitFor(predicate, what) {
  const deadline = Date.now() + DEADLINE_MS;
  while (Date.now() < deadline) {
    if (predicate()) return;
    await new Promise((r) => setTimeout(r, 50));
  }
  check(what, false, 'timed out');
}

const received = [];
const receiver = http.createServer((req, res) => {
  const chunks = [];
  req.on('data', (c) => chunks.push(c));
  req.on('end', () => {
    received.push({ headers: req.headers, body: Buffer.concat(chunks).toString() });
    res.writeHead(200).end();
  });
});
await new Promise((r) => receiver.listen(0, '127.0.0.1', r));
const receiverPort = receiver.address().port;

async function run(version, binding) {
  const v = `[${version} ${binding}]`;
  const tag = `${version}-${binding}`;
  const echo = await clientOn('echo', version, binding);
  const slow = await clientOn('slow', version, binding);
  check(`${v} the client speaks ${version}`, echo.protocolVersion === version, echo.protocolVersion);

  const card = await echo.getAgentCard();
  check(`${v} getAgentCard returns the card`, card.name === 'Echo', card.name);

  // Blocking send: the completed task with its reply.
  const task = await echo.sendMessage(sendRequest('hello'));
  check(`${v} sendMessage returns a completed task`, task.status?.state === STATE.COMPLETED, task);
  const reply = (task.status.message?.parts ?? []).map((p) => p.content?.value).join(' ');
  check(`${v} the reply echoes the text`, reply.includes('echo: hello'), reply);
  check(`${v} history holds the user message and the reply`, task.history.length === 2, task.history);

  // Every part kind: a data part and a file by URL (docs/PROTOCOL.md §12).
  const data = { form: { name: 'Ada', tags: ['x', 1.5, true] } };
  const fileUrl = 'https://files.example/report.pdf';
  const content = userMessage('content');
  content.parts.push(
    { content: { $case: 'data', value: data }, filename: '', mediaType: '', metadata: undefined },
    { content: { $case: 'url', value: fileUrl }, filename: 'report.pdf', mediaType: 'application/pdf', metadata: undefined },
  );
  const ct = await echo.sendMessage({ ...sendRequest('x'), message: content });
  const parts = ct.status?.message?.parts ?? [];
  const lines = parts.filter((p) => p.content?.$case === 'text').map((p) => p.content.value);
  check(`${v} a file by URL is named in the echo`, lines.includes(`file report.pdf (application/pdf, ${fileUrl})`), lines);
  const echoed = parts.filter((p) => p.content?.$case === 'data').map((p) => JSON.stringify(p.content.value));
  check(`${v} the data part comes back unchanged`, echoed.length === 1 && echoed[0] === JSON.stringify(data), echoed);
  const kept = (await echo.getTask({ tenant: '', id: ct.id })).history[0].parts;
  check(`${v} the task keeps the URL`, kept.length === 3 && kept[2].content?.value === fileUrl, kept);

  // An extension activated by the SDK's own means (service parameters): the echo names it
  // and the reply lists it, whatever the wire.
  const ext = 'https://ext.example/trace/v1';
  const et = await echo.sendMessage(sendRequest('ext'), {
    serviceParameters: ServiceParameters.create(withA2AExtensions(ext)),
  });
  const extLines = (et.status?.message?.parts ?? []).filter((p) => p.content?.$case === 'text').map((p) => p.content.value);
  check(`${v} an activated extension is named by the echo`, extLines.includes(`extensions: ${ext}`), extLines);
  check(`${v} the reply lists the activated extension`, JSON.stringify(et.status?.message?.extensions) === JSON.stringify([ext]), et.status?.message);

  // Streaming send.
  const [n, streamed] = await drain(echo.sendMessageStream(sendRequest('stream me')));
  check(`${v} sendMessageStream ends completed`, streamed?.status?.state === STATE.COMPLETED, streamed);
  check(`${v} the stream carried several events`, n >= 2, n);

  // getTask.
  const got = await echo.getTask({ tenant: '', id: task.id, historyLength: 1 });
  check(`${v} getTask returns the task with historyLength`, got.id === task.id && got.history.length === 1, got);
  try {
    await echo.getTask({ tenant: '', id: randomUUID() });
    check(`${v} an unknown task is an error`, false, 'no error');
  } catch (e) {
    check(`${v} an unknown task is TaskNotFound`, /TaskNotFound/i.test(e.constructor.name) || /not found/i.test(e.message), `${e.constructor.name}: ${e.message}`);
  }

  if (version === '1.0') {
    const page = await echo.listTasks({ tenant: '', status: 0, pageSize: 100, pageToken: '', contextId: '' });
    const ids = page.tasks.map((t) => t.id);
    check(`${v} listTasks lists this caller's tasks`, ids.includes(task.id) && ids.includes(streamed.id), ids);
  }

  // Non-blocking send, then cancel.
  const running = await slow.sendMessage(sendRequest('cancel me', true));
  check(`${v} a non-blocking send returns at once`, [STATE.SUBMITTED, STATE.WORKING].includes(running.status?.state), running);
  const canceled = await slow.cancelTask({ tenant: '', id: running.id, metadata: undefined });
  check(`${v} cancelTask cancels`, canceled.status.state === STATE.CANCELED, canceled);
  try {
    await slow.cancelTask({ tenant: '', id: running.id, metadata: undefined });
    check(`${v} canceling twice is an error`, false, 'no error');
  } catch (e) {
    check(`${v} canceling twice is TaskNotCancelable`, /Cancel/i.test(e.constructor.name) || /cancel/i.test(e.message), `${e.constructor.name}: ${e.message}`);
  }

  // Resubscribe to a running task.
  const follow = await slow.sendMessage(sendRequest('follow me', true));
  const [, followed] = await drain(slow.resubscribeTask({ tenant: '', id: follow.id }));
  check(`${v} resubscribeTask follows to completed`, followed?.status?.state === STATE.COMPLETED, followed);

  // Push configurations and their deliveries.
  const notify = await slow.sendMessage(sendRequest('notify me', true));
  const url = `http://127.0.0.1:${receiverPort}/hook/${tag}`;
  const created = await slow.createTaskPushNotificationConfig({
    tenant: '',
    id: '',
    taskId: notify.id,
    url,
    token: `tok-${tag}`,
    authentication: { scheme: 'Bearer', credentials: `cred-${tag}` },
  });
  check(`${v} createTaskPushNotificationConfig fills the id`, created.id !== '' && created.url === url, created);
  const fetched = await slow.getTaskPushNotificationConfig({ tenant: '', taskId: notify.id, id: created.id });
  check(`${v} getTaskPushNotificationConfig returns it`, fetched.id === created.id, fetched);
  const listed = await slow.listTaskPushNotificationConfig({ tenant: '', taskId: notify.id, pageSize: 0, pageToken: '' });
  check(`${v} listTaskPushNotificationConfig lists it`, listed.configs.length === 1 && listed.configs[0].id === created.id, listed);
  const mine = () =>
    received.filter(
      (r) => r.headers.authorization === `Bearer cred-${tag}` && r.headers['x-a2a-notification-token'] === `tok-${tag}`,
    );
  await waitFor(
    () => mine().some((r) => r.body.includes('TASK_STATE_COMPLETED') || r.body.includes('"completed"')),
    `${v} the completed event is delivered`,
  );
  const expected = version === '1.0' ? 'application/a2a+json' : 'application/json';
  check(`${v} deliveries carry ${expected}`, mine().every((r) => r.headers['content-type'].startsWith(expected)), mine()[0].headers);
  await slow.deleteTaskPushNotificationConfig({ tenant: '', taskId: notify.id, id: created.id });
  const after = await slow.listTaskPushNotificationConfig({ tenant: '', taskId: notify.id, pageSize: 0, pageToken: '' });
  check(`${v} deleteTaskPushNotificationConfig removes it`, after.configs.length === 0, after);

  // The server counted these calls under the binding the client was to speak.
  const label = { 'HTTP+JSON': 'rest', GRPC: 'grpc' }[binding] ?? 'jsonrpc';
  const dialect = version === '1.0' ? 'a2a-1.0' : 'a2a-0.3';
  const metrics = await (await fetch(`${BASE}/metrics`)).text();
  const series = `a2ad_requests_total{dialect="${dialect}",binding="${label}",method="${version === '1.0' ? 'SendMessage' : 'message/send'}",outcome="ok"}`;
  check(`${v} the server saw the calls over ${binding}`, metrics.includes(series), series);
}

for (const [version, binding] of [
  ['1.0', 'JSONRPC'],
  ['1.0', 'HTTP+JSON'],
  ['1.0', 'GRPC'],
  ['0.3', 'JSONRPC'],
]) {
  await run(version, binding);
}
receiver.close();
console.log(`@a2a-js/sdk: ${checks} checks passed`);
