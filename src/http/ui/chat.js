// Chat: talk to an agent on the wire of your choice (seed, A2A 1.0 JSON-RPC, A2A 1.0
// HTTP+JSON), streamed or not, multi-turn through the contextId the agent returned, with
// files (size and type checked against the agent's limits before sending) and a cancel for
// the running task. Every request and response/SSE frame shows in the "On the wire" panel.

import { cancel, el, fillAgents, getTask, hasRichParts, markdown, onRaw, partsView, send, sendParams, showError, taskLink, uuid4 } from './wire.js';

let app;
let contextId = null;
let running = null; // {wire, agent, taskId}
let files = [];
const $ = (id) => document.getElementById(id);
const HEADERS_KEY = 'a2ad.headers';
const TOKEN = /^[A-Za-z0-9!#$%&'*+.^_`|~-]+$/;
// Set by the page itself: the credential, the body's type, the dialect's version.
const OWN = new Set(['authorization', 'content-type', 'a2a-version', 'accept']);

/** The extra request headers typed for this tab: `{ok, headers}`, or refused (an error
 *  shown, nothing sent) when a line is not `name: value` or names a header the page sets. */
function extraHeaders() {
  const headers = {};
  for (const [i, line] of $('chat-headers').value.split('\n').entries()) {
    if (!line.trim()) continue;
    const at = line.indexOf(':');
    const name = at > 0 ? line.slice(0, at).trim() : '';
    const value = at > 0 ? line.slice(at + 1).trim() : '';
    if (!TOKEN.test(name) || /[\r\n]/.test(value)) {
      return { ok: false, error: new Error(`Request headers, line ${i + 1}: not "name: value"; nothing was sent.`) };
    }
    if (OWN.has(name.toLowerCase())) {
      return { ok: false, error: new Error(`Request headers, line ${i + 1}: ${name} is set by the inspector itself; nothing was sent.`) };
    }
    headers[name.toLowerCase()] = value;
  }
  return { ok: true, headers };
}

export function mount(a) {
  app = a;
  fillAgents($('chat-agent'), app.agents);
  if (mount.done) return;
  mount.done = true;
  // Another agent or wire starts a new conversation, and says so: what was said stays.
  $('chat-agent').addEventListener('change', () => { newConversation(true); syncStream(); });
  $('chat-wire').addEventListener('change', () => newConversation(true));
  $('chat-new').addEventListener('click', () => newConversation(false));
  $('compose').addEventListener('submit', (ev) => { ev.preventDefault(); submit(); });
  // Enter sends; Shift+Enter starts a new line (an IME composition's Enter is its own).
  $('message').addEventListener('keydown', (ev) => {
    if (ev.key === 'Enter' && !ev.shiftKey && !ev.isComposing) { ev.preventDefault(); submit(); }
  });
  $('cancel').addEventListener('click', cancelRunning);
  // The extra request headers live in this tab's session, like the credential.
  $('chat-headers').value = sessionStorage.getItem(HEADERS_KEY) ?? '';
  if ($('chat-headers').value) $('headers-box').open = true;
  $('chat-headers').addEventListener('input', () => sessionStorage.setItem(HEADERS_KEY, $('chat-headers').value));
  $('raw-clear').addEventListener('click', () => $('raw').replaceChildren());
  onRaw(rawEntry);
  const zone = $('dropzone');
  const input = $('file-input');
  zone.addEventListener('click', () => input.click());
  zone.addEventListener('keydown', (ev) => {
    if (ev.key === 'Enter' || ev.key === ' ') { ev.preventDefault(); input.click(); }
  });
  zone.addEventListener('dragover', (ev) => { ev.preventDefault(); zone.classList.add('over'); });
  zone.addEventListener('dragleave', () => zone.classList.remove('over'));
  zone.addEventListener('drop', (ev) => {
    ev.preventDefault();
    zone.classList.remove('over');
    attach([...ev.dataTransfer.files]);
  });
  input.addEventListener('change', () => { attach([...input.files]); input.value = ''; });
  syncStream();
}

export function show() {
  $('message').focus();
}

const agent = () => app.agents.find((a) => a.id === $('chat-agent').value);

function syncStream() {
  const a = agent();
  const box = $('chat-stream');
  box.disabled = !a?.streaming;
  if (!a?.streaming) box.checked = false;
}

/** A new conversation: `keep` leaves the transcript in place under a divider naming what
 *  comes next (a switch of agent or wire); the button clears it. Typed text stays. */
function newConversation(keep) {
  contextId = null;
  $('chat-context').textContent = 'new';
  const transcript = $('transcript');
  if (keep && transcript.children.length) {
    const wire = $('chat-wire').selectedOptions[0]?.textContent ?? $('chat-wire').value;
    transcript.append(el('li.divider', { role: 'separator', text: `New conversation with ${$('chat-agent').value} over ${wire}` }));
  } else {
    transcript.replaceChildren();
  }
  files = [];
  renderFiles();
}

/** A file's type against the agent's accepted types (`type/*` matches the family). */
function typeAccepted(type, accepted) {
  const base = type.split(';')[0].trim().toLowerCase();
  return accepted.some((t) => {
    const a = t.toLowerCase();
    return a.endsWith('/*') ? base.startsWith(a.slice(0, -1)) : base === a;
  });
}

async function attach(list) {
  const a = agent();
  const err = $('compose-error');
  showError(err, null);
  for (const f of list) {
    const limits = a.limits;
    if (files.length + 1 >= limits.maxParts) {
      showError(err, new Error(`At most ${limits.maxParts} parts in one message.`));
      break;
    }
    if (!f.type) {
      showError(err, new Error(`${f.name}: the browser does not know this file's type; ${a.id} accepts ${limits.supportedTypes.join(', ') || 'no files'}.`));
      continue;
    }
    if (!typeAccepted(f.type, limits.supportedTypes)) {
      showError(err, new Error(`${f.name}: ${f.type} is not accepted by ${a.id} (accepted: ${limits.supportedTypes.join(', ') || 'no files'}).`));
      continue;
    }
    if (f.size > limits.maxFileSize) {
      showError(err, new Error(`${f.name}: ${f.size} bytes is over ${a.id}'s limit of ${limits.maxFileSize} bytes.`));
      continue;
    }
    const base64 = await new Promise((resolve, reject) => {
      const r = new FileReader();
      r.onload = () => resolve(String(r.result).split(',')[1] ?? '');
      r.onerror = () => reject(r.error);
      r.readAsDataURL(f);
    });
    files.push({ name: f.name, type: f.type, size: f.size, base64 });
  }
  renderFiles();
}

function renderFiles() {
  $('attachments').replaceChildren(...files.map((f, i) =>
    el('li', {}, `${f.name} (${f.type}, ${f.size} B)`,
      el('button', { type: 'button', 'aria-label': `Remove ${f.name}`, text: '×', onclick: () => { files.splice(i, 1); renderFiles(); } }))));
}

function bubble(kind, text) {
  const b = el(`li.bubble.${kind}`, {}, el('span.body', { text }), el('span.state'));
  $('transcript').append(b);
  b.scrollIntoView({ block: 'end' });
  return b;
}

/** The data editor's value: `undefined` when empty; refused (an error shown, nothing sent)
 *  when it is not JSON. */
function dataValue() {
  const raw = $('data-json').value.trim();
  if (!raw) return { ok: true, value: undefined };
  try {
    return { ok: true, value: JSON.parse(raw) };
  } catch (e) {
    return { ok: false, error: new Error(`The data part is not valid JSON (${e.message}); nothing was sent.`) };
  }
}

async function submit() {
  const text = $('message').value.trim();
  const a = agent();
  const data = dataValue();
  if (!data.ok) {
    showError($('compose-error'), data.error);
    $('data-json').focus();
    return;
  }
  const extra = extraHeaders();
  if (!extra.ok) {
    showError($('compose-error'), extra.error);
    $('headers-box').open = true;
    $('chat-headers').focus();
    return;
  }
  if (!a || (!text && !files.length && data.value === undefined) || running?.busy) return;
  showError($('compose-error'), null);
  const wire = $('chat-wire').value;
  const stream = $('chat-stream').checked;
  const params = sendParams(wire, { text, files, data: data.value, contextId });
  const mine = bubble('user', text + (files.length ? `\n${files.map((f) => `[file ${f.name}]`).join(' ')}` : ''));
  if (data.value !== undefined) mine.querySelector('.body').append(el('pre.part-data', { text: JSON.stringify(data.value, null, 2) }));
  $('message').value = '';
  $('data-json').value = '';
  files = [];
  renderFiles();
  const reply = bubble('agent', '…');
  const body = reply.querySelector('.body');
  const state = reply.querySelector('.state');
  const deltas = a.backend === 'openai';
  let streamed = '';
  running = { wire, agent: a.id, taskId: null, busy: true, headers: extra.headers };
  $('send').disabled = true;
  const onEvent = (v, id) => {
    if (v.contextId) setContext(v.contextId);
    if (v.taskId) {
      running.taskId = v.taskId;
      reply.dataset.task = v.taskId;
    }
    $('cancel').disabled = v.final || !running.taskId;
    state.replaceChildren(`${v.state}${id !== null && id !== undefined ? ` · event ${id}` : ''}`,
      ...(v.taskId ? [' · task ', taskLink(a.id, v.taskId)] : []));
    reply.dataset.state = v.state;
    if (v.final && hasRichParts(v.message)) {
      body.replaceChildren(...partsView(v.message));
    } else if (v.text) {
      // The end of a reply reads as Markdown (built as nodes: markup stays text).
      if (v.final) body.replaceChildren(...markdown(v.text));
      else if (deltas && v.state === 'working') body.textContent = (streamed += v.text);
      else body.textContent = v.text;
    }
    reply.scrollIntoView({ block: 'end' });
  };
  try {
    if (stream) {
      await send(wire, a.id, params, { stream, onEvent, headers: extra.headers });
    } else if (wire === 'seed') {
      // The seed names a new task by the client's id: Cancel works while the send waits.
      params.taskId = uuid4();
      running.taskId = params.taskId;
      reply.dataset.task = params.taskId;
      $('cancel').disabled = false;
      const last = await send(wire, a.id, params, { stream, onEvent, headers: extra.headers });
      if (last && !last.final) state.append(' · still running: see Tasks');
    } else {
      // The official wires: the task at once (returnImmediately), then read until it ends,
      // so that Cancel works while it runs.
      params.configuration = { ...(params.configuration ?? {}), returnImmediately: true };
      let view = await send(wire, a.id, params, { stream, onEvent, headers: extra.headers });
      const until = Date.now() + (a.limits?.syncWaitSeconds ?? 30) * 1000;
      while (view?.taskId && !view.final && Date.now() < until) {
        await new Promise((r) => setTimeout(r, 500));
        view = await getTask(wire, a.id, view.taskId, extra.headers);
        onEvent(view, null);
      }
      if (view && !view.final) state.append(' · still running: see Tasks');
    }
  } catch (e) {
    reply.remove();
    bubble('error', e.message);
    // Nothing typed is lost: the text (and a data part) come back to the editor, unless
    // something new was typed meanwhile.
    if (!$('message').value) $('message').value = text;
    if (data.value !== undefined && !$('data-json').value) $('data-json').value = JSON.stringify(data.value);
  } finally {
    running.busy = false;
    $('send').disabled = false;
    $('cancel').disabled = reply.dataset.state ? ['completed', 'failed', 'canceled', 'rejected'].includes(reply.dataset.state) : true;
    if ($('cancel').disabled) running = null;
  }
}

function setContext(id) {
  contextId = id;
  $('chat-context').textContent = id;
}

async function cancelRunning() {
  if (!running?.taskId) return;
  $('cancel').disabled = true;
  try {
    await cancel(running.wire, running.agent, running.taskId, running.headers);
  } catch (e) {
    bubble('error', e.message);
  }
}

/** One logged request, its answer and its stream's frames, as one entry that folds and
 *  copies (as shown: the credential masked). */
function rawEntry(e) {
  const list = $('raw');
  if (!list) return;
  let entry = list.querySelector(`li.exchange[data-exchange="${e.exchange}"]`);
  if (!entry) {
    const summary = el('summary', { text: `${e.at.toLocaleTimeString()} ${e.head.split('\n')[0]}` });
    const copy = el('button.copy', { type: 'button', text: 'Copy', 'aria-label': 'Copy this exchange' });
    const items = el('ol.items');
    copy.addEventListener('click', () => copyExchange(items, copy));
    entry = el('li.exchange', { 'data-exchange': String(e.exchange) },
      el('details', { open: true }, summary, copy, items));
    list.append(entry);
    while (list.children.length > 100) list.firstChild.remove();
  }
  const items = entry.querySelector('ol.items');
  const arrow = e.kind === 'out' ? '→' : e.kind === 'in' ? '←' : '⇠';
  // The compliance mark: ✓ when the answer or frame keeps its dialect's object rules, ✗
  // with the rule it breaks (also on hover).
  const mark = e.mark
    ? el(`span.mark.${e.mark.ok ? 'ok' : 'bad'}`, {
      title: e.mark.ok ? 'Keeps the A2A object rules of its dialect' : e.mark.rule,
      'aria-label': e.mark.ok ? 'compliant' : `not compliant: ${e.mark.rule}`,
      text: e.mark.ok ? '✓' : '✗',
    })
    : null;
  items.append(el(`li.${e.kind}`, { 'data-compliant': e.mark ? String(e.mark.ok) : undefined },
    el('pre.head', {}, mark, mark ? ' ' : null, `${arrow} ${e.head}`),
    e.mark && !e.mark.ok ? el('p.rule', { text: e.mark.rule }) : null,
    e.body ? el('pre', { text: e.body }) : null));
  if (e.kind === 'in') {
    const summary = entry.querySelector('summary');
    summary.textContent = `${summary.textContent.split(' · ')[0]} · ${e.head.split('\n')[0]}`;
  }
  if (e.kind === 'frame') entry.dataset.frames = String(Number(entry.dataset.frames ?? 0) + 1);
  const panel = list.parentElement;
  panel.scrollTop = panel.scrollHeight;
}

async function copyExchange(items, button) {
  const text = [...items.children].map((li) => li.innerText).join('\n\n');
  try {
    await navigator.clipboard.writeText(text);
    button.textContent = 'Copied';
  } catch {
    // No clipboard (an insecure context): the text is selected for the user to copy.
    window.getSelection()?.selectAllChildren(items);
    button.textContent = 'Selected';
  }
  setTimeout(() => { button.textContent = 'Copy'; }, 2000);
}
