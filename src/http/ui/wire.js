// How the inspector talks to a2ad: the user's credential on every call, the three wires a
// chat can use (seed JSON-RPC, A2A 1.0 JSON-RPC, A2A 1.0 HTTP+JSON), an SSE reader over
// fetch (EventSource cannot send a key or a body), and a log of the chat's requests,
// responses and stream frames exactly as sent, one exchange at a time (the chat's "On the
// wire" panel; the other views' calls are not logged there).

import { check } from './comply.js';

const listeners = new Set();
const exchanges = new WeakMap(); // response → the logged exchange it answers
const calls = new Map(); // logged exchange → {wire, op}: what its answers are checked against
let credential = null;
let nextId = 1;
let nextExchange = 1;

/** Calls `fn(entry)` for every logged request, response and frame (`entry.exchange` numbers
 *  the request it belongs to); returns an unsubscribe. */
export function onRaw(fn) {
  listeners.add(fn);
  return () => listeners.delete(fn);
}

function raw(exchange, kind, head, body, mark) {
  if (!exchange) return;
  for (const fn of listeners) fn({ exchange, kind, head, body, mark, at: new Date() });
}

/** The compliance mark of a logged answer or frame (comply.js): `{ok, rule}`. */
function markOf(exchange, text, { frame = false, status = 200 } = {}) {
  const call = calls.get(exchange);
  if (!call) return undefined;
  let value;
  try {
    value = JSON.parse(text);
  } catch {
    return { ok: false, rule: 'the body must be JSON' };
  }
  const rule = check({ ...call, frame, value, status });
  return { ok: !rule, rule };
}

export function setCredential(value) {
  credential = value;
}

/** An error a2ad answered, in any dialect's shape, as one readable sentence. */
export class ApiError extends Error {
  constructor(message, status, code) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

/** A UUID v4 (the seed dialect requires one as messageId); works without a secure context. */
export function uuid4() {
  const b = crypto.getRandomValues(new Uint8Array(16));
  b[6] = (b[6] & 0x0f) | 0x40;
  b[8] = (b[8] & 0x3f) | 0x80;
  const h = [...b].map((x) => x.toString(16).padStart(2, '0')).join('');
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

export const agentBase = (agent) => `/api/v1/a2a/${encodeURIComponent(agent)}`;

const WIRE_PATH = { seed: '', v1: '/jsonrpc/v1', rest: '/rest' };

function headersFor(wire, extra) {
  const h = { ...extra };
  if (credential) h.authorization = `Bearer ${credential}`;
  if (wire !== 'seed') h['a2a-version'] = '1.0';
  return h;
}

function shown(headers) {
  const out = { ...headers };
  if (out.authorization) out.authorization = 'Bearer ••••••';
  return Object.entries(out).map(([k, v]) => `${k}: ${v}`).join('\n');
}

/** One HTTP request, logged as sent. */
/** One HTTP request; `log`: shown in the chat's "On the wire" panel, with its answer. */
export async function request(method, url, { wire = 'rest', body, headers = {}, signal, log = false } = {}) {
  const h = headersFor(wire, headers);
  let text;
  if (body !== undefined) {
    h['content-type'] = 'application/json';
    text = JSON.stringify(body);
  }
  const exchange = log ? nextExchange++ : 0;
  if (exchange) {
    calls.set(exchange, { wire, op: body?.method ?? url.split('?')[0] });
    calls.delete(exchange - 200);
  }
  raw(exchange, 'out', `${method} ${url}\n${shown(h)}`, text ? pretty(text) : '');
  let res;
  try {
    res = await fetch(url, { method, headers: h, body: text, signal, cache: 'no-store' });
  } catch (e) {
    if (e.name === 'AbortError') throw e;
    raw(exchange, 'in', 'network error', String(e));
    throw new ApiError(`The server did not answer (${e.message}).`, 0, null);
  }
  if (exchange) exchanges.set(res, exchange);
  return res;
}

function pretty(text) {
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch {
    return text;
  }
}

function responseHead(res) {
  const type = res.headers.get('content-type') || '';
  return `${res.status} ${res.statusText}\ncontent-type: ${type}`;
}

/** The body of a JSON answer; an error answer (any dialect's shape) becomes an ApiError. */
export async function readJson(res) {
  const text = await res.text();
  const exchange = exchanges.get(res);
  raw(exchange, 'in', responseHead(res), pretty(text), markOf(exchange, text, { status: res.status }));
  let value = null;
  try {
    value = text ? JSON.parse(text) : {};
  } catch {
    throw new ApiError(`Unexpected answer (HTTP ${res.status}): ${text.slice(0, 200)}`, res.status, null);
  }
  if (value && value.error) throw errorOf(value.error, res.status);
  if (!res.ok) throw new ApiError(`HTTP ${res.status}`, res.status, null);
  return value;
}

/** JSON-RPC errors (seed: data object; 1.0: data array of google.rpc details) and
 *  google.rpc.Status errors (HTTP+JSON) as one sentence with their reason. */
export function errorOf(err, status) {
  const reasons = [];
  const look = (d) => {
    if (!d || typeof d !== 'object') return;
    if (typeof d.reason === 'string' && !/^[A-Z_]+$/.test(d.reason)) reasons.push(d.reason);
    if (d.metadata && typeof d.metadata.reason === 'string') reasons.push(d.metadata.reason);
    if (d.metadata && d.metadata.field) reasons.push(`field ${d.metadata.field}`);
    if (Array.isArray(d.fieldViolations)) {
      for (const v of d.fieldViolations) reasons.push(`${v.field}: ${v.description}`);
    }
    if (typeof d.field === 'string' && !d.metadata) reasons.push(`field ${d.field}`);
  };
  const data = err.data ?? err.details;
  if (Array.isArray(data)) data.forEach(look);
  else look(data);
  const unique = [...new Set(reasons)];
  const what = err.message || err.status || 'Error';
  const code = err.status && typeof err.code === 'number' ? `${err.status}` : `${err.code}`;
  return new ApiError(`${what}${unique.length ? ': ' + unique.join('; ') : ''} (${code})`, status, err.code);
}

/** The frames of an SSE answer: `{id, data}` with `data` parsed; `: ping` comments skipped. */
export async function* frames(res, signal) {
  const exchange = exchanges.get(res);
  raw(exchange, 'in', responseHead(res), '(stream)');
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  const abort = () => reader.cancel().catch(() => {});
  signal?.addEventListener('abort', abort);
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true }).replace(/\r\n?/g, '\n');
      let cut;
      while ((cut = buffer.indexOf('\n\n')) >= 0) {
        const block = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        let id = null;
        const data = [];
        for (const line of block.split('\n')) {
          if (line.startsWith(':')) continue;
          const [field, ...rest] = line.split(':');
          const v = rest.join(':').replace(/^ /, '');
          if (field === 'id') id = v;
          else if (field === 'data') data.push(v);
        }
        if (!data.length) continue;
        const text = data.join('\n');
        raw(exchange, 'frame', `id: ${id ?? '—'}`, pretty(text), markOf(exchange, text, { frame: true }));
        let parsed;
        try {
          parsed = JSON.parse(text);
        } catch {
          continue;
        }
        yield { id: id === null ? null : Number(id), data: parsed };
      }
    }
  } finally {
    signal?.removeEventListener('abort', abort);
  }
}

/** A JSON-RPC call on the seed or 1.0 path; `stream` asks for SSE. Returns the result, or
 *  (streaming) an async iterator of `{id, data: result}`. */
export async function rpc(wire, agent, method, params, { stream = false, headers = {}, signal, log = false } = {}) {
  const url = agentBase(agent) + WIRE_PATH[wire];
  const id = nextId++;
  const extra = { ...headers };
  if (stream) extra.accept = 'text/event-stream';
  const res = await request('POST', url, {
    wire, body: { jsonrpc: '2.0', id, method, params }, headers: extra, signal, log,
  });
  const type = res.headers.get('content-type') || '';
  if (stream && type.startsWith('text/event-stream')) {
    return (async function* results() {
      for await (const f of frames(res, signal)) {
        if (f.data.error) throw errorOf(f.data.error, res.status);
        yield { id: f.id, data: f.data.result };
      }
    })();
  }
  const body = await readJson(res);
  return body.result;
}

/** A call of the HTTP+JSON binding (`path` under `{agent}/rest`). */
export async function rest(agent, method, path, { body, stream = false, headers = {}, signal, log = false } = {}) {
  const url = agentBase(agent) + '/rest' + path;
  const extra = { ...headers };
  if (stream) extra.accept = 'text/event-stream';
  const res = await request(method, url, { wire: 'rest', body, headers: extra, signal, log });
  const type = res.headers.get('content-type') || '';
  if (stream && type.startsWith('text/event-stream')) return frames(res, signal);
  return readJson(res);
}

// === What the three wires say, in one shape ===

const ENDS = new Set(['completed', 'failed', 'canceled', 'rejected', 'input-required', 'auth-required']);

/** `TASK_STATE_INPUT_REQUIRED` → `input-required`; seed names stay. */
export function stateName(s) {
  return String(s ?? '').replace(/^TASK_STATE_/, '').toLowerCase().replace(/_/g, '-');
}

export const isEnd = (state) => ENDS.has(state);

/** A file by URL's address, in any dialect's part shape (`url`, `file.uri`). */
function urlOf(p) {
  return typeof p.url === 'string' ? p.url : (typeof p.file?.uri === 'string' ? p.file.uri : null);
}

/** Whether a part is a data part, in any dialect's shape. */
const isData = (p) => p.data !== undefined && (p.kind === undefined || p.kind === 'data') && (p.type === undefined || p.type === 'data');

/** A message's or artifact's parts as nodes: text as text, a data part as formatted JSON,
 *  a file by URL as a link (http/https only; never fetched, never rendered inline), an
 *  inline file named. Nothing from the agent becomes HTML. */
export function partsView(m) {
  if (!m || !Array.isArray(m.parts)) return [];
  return m.parts.map((p) => {
    if (typeof p.text === 'string') return el('span.part-text', { text: p.text });
    if (isData(p)) return el('pre.part-data', { text: JSON.stringify(p.data, null, 2) });
    const url = urlOf(p);
    const name = p.filename ?? p.file?.name ?? p.name;
    if (url !== null) {
      const safe = /^https?:\/\//i.test(url);
      const label = `${name ?? 'unnamed'} (${p.mediaType ?? p.file?.mimeType ?? 'application/octet-stream'})`;
      return el('span.part-file', {}, 'file ',
        safe ? el('a', { href: url, rel: 'noopener noreferrer nofollow', target: '_blank', text: label }) : label,
        ` ${url}`);
    }
    // An inline image shows (a data: URL: nothing is fetched); another file is named.
    const bytes = p.raw ?? p.file?.bytes;
    const type = p.mediaType ?? p.file?.mimeType ?? '';
    if (typeof bytes === 'string' && /^image\/(png|jpeg|gif|webp)$/.test(type) && /^[A-Za-z0-9+/]*={0,2}$/.test(bytes)) {
      return el('img.part-image', { src: `data:${type};base64,${bytes}`, alt: name ?? 'image' });
    }
    if (p.raw !== undefined || p.file) return el('span.part-file', { text: `[file ${name ?? 'unnamed'}]` });
    return null;
  }).filter(Boolean);
}

/** An agent's reply as Markdown, built as DOM nodes (never as HTML: any markup in the text
 *  stays text): paragraphs (a single line break kept), `#` headings, `-`/`*`/`1.` lists,
 *  fenced code blocks, `inline code`, **bold**, *italic*, and [links](https://…) — `http`
 *  and `https` only, opened in a new tab without referrer or opener. */
export function markdown(text) {
  const out = [];
  const lines = String(text).replace(/\r\n?/g, '\n').split('\n');
  let para = [];
  let list = null;
  const flush = () => {
    if (para.length) {
      const p = el('p.md');
      para.forEach((l, i) => { if (i) p.append(el('br')); p.append(...inline(l)); });
      out.push(p);
      para = [];
    }
    list = null;
  };
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    if (/^```/.test(line)) {
      flush();
      const code = [];
      for (i++; i < lines.length && !/^```/.test(lines[i]); i++) code.push(lines[i]);
      out.push(el('pre.md-code', {}, el('code', { text: code.join('\n') })));
      continue;
    }
    const h = /^(#{1,6})\s+(.*)$/.exec(line);
    if (h) {
      flush();
      out.push(el('p.md-h', {}, el('strong', {}, ...inline(h[2]))));
      continue;
    }
    const li = /^\s*(?:([-*])|(\d+)\.)\s+(.*)$/.exec(line);
    if (li) {
      if (para.length) flush();
      const ordered = li[2] !== undefined;
      if (!list || (list.tagName === 'OL') !== ordered) {
        list = el(ordered ? 'ol.md' : 'ul.md');
        out.push(list);
      }
      list.append(el('li', {}, ...inline(li[3])));
      continue;
    }
    if (!line.trim()) { flush(); continue; }
    list = null;
    para.push(line);
  }
  flush();
  return out;
}

/** Inline Markdown: code first (its content is literal), then links, bold and italic. */
function inline(text) {
  const nodes = [];
  const re = /`([^`]+)`|\[([^\]]+)\]\((https?:\/\/[^\s)]+)\)|\*\*([^*]+)\*\*|\*([^*\s][^*]*)\*|_([^_\s][^_]*)_/g;
  let at = 0;
  for (let m; (m = re.exec(text));) {
    if (m.index > at) nodes.push(text.slice(at, m.index));
    if (m[1] !== undefined) nodes.push(el('code', { text: m[1] }));
    else if (m[2] !== undefined) nodes.push(el('a', { href: m[3], rel: 'noopener noreferrer nofollow', target: '_blank', text: m[2] }));
    else if (m[4] !== undefined) nodes.push(el('strong', { text: m[4] }));
    else nodes.push(el('em', { text: m[5] ?? m[6] }));
    at = re.lastIndex;
  }
  if (at < text.length) nodes.push(text.slice(at));
  return nodes;
}

/** Whether a message holds more than text (data parts, files by URL). */
export function hasRichParts(m) {
  return Array.isArray(m?.parts) && m.parts.some((p) => isData(p) || urlOf(p) !== null);
}

/** The text of a message or artifact (files named), in any dialect's part shape. */
export function textOf(m) {
  if (!m || !Array.isArray(m.parts)) return '';
  return m.parts
    .map((p) => {
      if (typeof p.text === 'string') return p.text;
      const name = p.filename ?? p.file?.name ?? p.name;
      if (urlOf(p) !== null) return `[file ${name ?? 'unnamed'} at ${urlOf(p)}]`;
      if (p.raw !== undefined || p.file) return `[file ${name ?? 'unnamed'}]`;
      if (p.data !== undefined) return JSON.stringify(p.data);
      return '';
    })
    .filter(Boolean)
    .join('\n');
}

/** One result or stream event of any wire as `{taskId, contextId, state, text, final}`. */
export function eventView(wire, r) {
  if (!r || typeof r !== 'object') return { state: '', text: '' };
  if (wire === 'seed') {
    const state = stateName(r.status?.state);
    const text = textOf(r.status?.message) || r.status?.reason || r.status?.error?.message || '';
    return { taskId: r.id, contextId: r.contextId, state, text, message: r.status?.message, final: Boolean(r.final) || isEnd(state) };
  }
  const t = r.task ?? r.statusUpdate ?? null;
  if (t) {
    const state = stateName(t.status?.state);
    return {
      taskId: t.id ?? t.taskId, contextId: t.contextId, state,
      text: textOf(t.status?.message), message: t.status?.message, final: isEnd(state),
    };
  }
  if (r.artifactUpdate) {
    const a = r.artifactUpdate;
    return { taskId: a.taskId, contextId: a.contextId, state: 'artifact', text: textOf(a.artifact), final: false };
  }
  if (r.message) {
    return { contextId: r.message.contextId, state: 'message', text: textOf(r.message), final: true };
  }
  return { state: '', text: '' };
}

/** The params of a send on a wire: text, files `{name, type, base64}`, a data part's value
 *  (`data`, any JSON; `undefined`: none), conversation. */
export function sendParams(wire, { text, files = [], data, contextId }) {
  if (wire === 'seed') {
    const parts = [];
    if (text) parts.push({ type: 'text', text });
    for (const f of files) parts.push({ type: 'file', file: { name: f.name, mimeType: f.type, bytes: f.base64 } });
    if (data !== undefined) parts.push({ type: 'data', data });
    const params = { message: { role: 'user', messageId: uuid4(), parts } };
    if (contextId) params.contextId = contextId;
    return params;
  }
  const parts = [];
  if (text) parts.push({ text });
  for (const f of files) parts.push({ raw: f.base64, filename: f.name, mediaType: f.type });
  if (data !== undefined) parts.push({ data });
  const message = { messageId: uuid4(), role: 'ROLE_USER', parts };
  if (contextId) message.contextId = contextId;
  return { message };
}

/** Sends on a wire. Streaming: calls `onEvent(view)` per event and returns the last view;
 *  else returns the result's view. */
export async function send(wire, agent, params, { stream, onEvent, signal, headers = {} }) {
  let answer;
  if (wire === 'rest') {
    answer = await rest(agent, 'POST', stream ? '/message:stream' : '/message:send', { body: params, stream, signal, headers, log: true });
  } else {
    const method = wire === 'seed'
      ? (stream ? 'message/stream' : 'message/send')
      : (stream ? 'SendStreamingMessage' : 'SendMessage');
    answer = await rpc(wire, agent, method, params, { stream, signal, headers, log: true });
  }
  if (answer && typeof answer[Symbol.asyncIterator] === 'function') {
    let last = null;
    for await (const f of answer) {
      last = eventView(wire, f.data);
      onEvent?.(last, f.id);
    }
    return last;
  }
  const view = eventView(wire, answer);
  onEvent?.(view, null);
  return view;
}

/** A task as it stands, on a wire, as an event view. */
export async function getTask(wire, agent, taskId, headers = {}) {
  const log = true;
  if (wire === 'rest') return eventView('rest', { task: await rest(agent, 'GET', `/tasks/${encodeURIComponent(taskId)}`, { log, headers }) });
  if (wire === 'seed') return eventView('seed', await rpc('seed', agent, 'tasks/get', { taskId }, { log, headers }));
  return eventView('v1', { task: await rpc('v1', agent, 'GetTask', { id: taskId }, { log, headers }) });
}

/** Cancels a task on a wire. */
export async function cancel(wire, agent, taskId, headers = {}) {
  const log = true;
  if (wire === 'rest') return rest(agent, 'POST', `/tasks/${encodeURIComponent(taskId)}:cancel`, { body: {}, log, headers });
  if (wire === 'seed') return rpc('seed', agent, 'tasks/cancel', { taskId }, { log, headers });
  return rpc('v1', agent, 'CancelTask', { id: taskId }, { log, headers });
}

/** GET of a path of a2ad's own (`/api/v1/agents`, `/metrics`). */
export async function getJson(url) {
  return readJson(await request('GET', url, { wire: 'rest' }));
}

// Small DOM helpers shared by the views.

/** `el('tag.class', {attr: v, onclick: f}, ...children)` */
export function el(spec, attrs = {}, ...children) {
  const [tag, ...classes] = spec.split('.');
  const e = document.createElement(tag);
  if (classes.length) e.className = classes.join(' ');
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else if (k === 'text') e.textContent = v;
    else e.setAttribute(k, v === true ? '' : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

/** A link to a task's page in Tasks (`#tasks/<agent>/<id>`: Back returns, the address can
 *  be reloaded or shared). */
export function taskLink(agent, id, text = id) {
  return el('a.tasklink', {
    href: `#tasks/${encodeURIComponent(agent)}/${encodeURIComponent(id)}`,
    'data-task-link': id,
    text,
  });
}

export function when(iso) {
  if (!iso) return '';
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? iso : d.toLocaleTimeString();
}

export function showError(node, e) {
  node.textContent = e ? (e.message || String(e)) : '';
  node.hidden = !e;
}

/** Fills a <select> with the agents, keeping its choice when it still exists. */
export function fillAgents(select, agents) {
  const keep = select.value;
  select.replaceChildren(...agents.map((a) => el('option', { value: a.id, text: a.name === a.id ? a.id : `${a.name} (${a.id})` })));
  if (agents.some((a) => a.id === keep)) select.value = keep;
}
