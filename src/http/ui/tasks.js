// Tasks: the caller's tasks on an agent (ListTasks over HTTP+JSON: filter by state and
// context, paged), refreshed every 3 seconds while shown; a task's history and artifacts
// (GetTask), its numbered events as a timeline (seed tasks/resubscribe from event 1,
// resumed with Last-Event-ID when the connection drops), and cancel.

import { ApiError, el, fillAgents, isEnd, partsView, rest, rpc, stateName, textOf, when } from './wire.js';

let app;
let timer = null;
let page = { token: '', next: '' };
let openTask = null; // {agent, id, controller}
const $ = (id) => document.getElementById(id);

export function mount(a) {
  app = a;
  fillAgents($('task-agent'), app.agents);
  if (mount.done) return;
  mount.done = true;
  $('task-filter').addEventListener('submit', (ev) => { ev.preventDefault(); page = { token: '', next: '' }; refresh(); });
  $('task-agent').addEventListener('change', () => { page = { token: '', next: '' }; closeTask(); refresh(); });
  $('task-first').addEventListener('click', () => { page = { token: '', next: '' }; refresh(); });
  $('task-next').addEventListener('click', () => { page = { token: page.next, next: '' }; refresh(); });
}

/** `arg`: `{agent, taskId}` to open one task. */
export function show(arg) {
  if (arg?.agent) $('task-agent').value = arg.agent;
  refresh();
  clearInterval(timer);
  timer = setInterval(() => { if (!document.hidden) refresh(); }, 3000);
  if (arg?.taskId) {
    if (openTask?.id !== arg.taskId || openTask?.agent !== arg.agent) openDetail(arg.agent, arg.taskId);
  } else closeTask();
}

export function hide() {
  clearInterval(timer);
  timer = null;
  closeTask();
}

async function refresh() {
  const agent = $('task-agent').value;
  if (!agent) return;
  const q = new URLSearchParams({ pageSize: '20' });
  if ($('task-state').value) q.set('status', $('task-state').value);
  if ($('task-context').value.trim()) q.set('contextId', $('task-context').value.trim());
  if (page.token) q.set('pageToken', page.token);
  const rows = $('task-rows');
  try {
    const r = await rest(agent, 'GET', `/tasks?${q}`);
    rows.dataset.polls = String(Number(rows.dataset.polls ?? 0) + 1);
    page.next = r.nextPageToken || '';
    $('task-next').disabled = !page.next;
    $('task-count').textContent = `${r.totalSize} task${r.totalSize === 1 ? '' : 's'}`;
    // Unchanged rows stay as they are (a keyboard user's focus stays where it was).
    const seen = JSON.stringify((r.tasks ?? []).map((t) => [t.id, t.status?.state, t.status?.timestamp, openTask?.id]));
    if (seen === rows.dataset.seen) return;
    rows.dataset.seen = seen;
    rows.replaceChildren(...(r.tasks ?? []).map((t) => {
      const state = stateName(t.status?.state);
      return el('tr', { 'data-task': t.id, 'aria-selected': String(openTask?.id === t.id) },
        el('td', {}, el('button.linkish', { type: 'button', text: t.id, onclick: () => openDetail(agent, t.id) })),
        el('td', {}, el(`span.st.st-${state}`, { text: state })),
        el('td', { text: when(t.status?.timestamp) }),
        el('td', {}, el('code', { text: t.contextId ?? '' })));
    }));
    if (!r.tasks?.length) rows.replaceChildren(el('tr', {}, el('td', { colspan: '4', text: 'No tasks.' })));
  } catch (e) {
    delete rows.dataset.seen;
    rows.replaceChildren(el('tr', {}, el('td.error', { colspan: '4', text: e.message })));
  }
}

function closeTask() {
  openTask?.controller.abort();
  openTask = null;
  app?.at('tasks');
}

async function openDetail(agent, id) {
  closeTask();
  const controller = new AbortController();
  openTask = { agent, id, controller };
  app.at('tasks', { agent, taskId: id });
  for (const tr of document.querySelectorAll('#task-rows tr')) {
    tr.setAttribute('aria-selected', String(tr.dataset.task === id));
  }
  const box = $('task-detail');
  const info = el('div');
  const timeline = el('ol.timeline', { 'aria-label': 'Events', 'aria-live': 'polite' });
  const note = el('p.meta');
  const cancelBtn = el('button', { type: 'button', id: 'task-cancel', text: 'Cancel task', disabled: true });
  const hooksLink = el('a', {
    href: `#hooks/${encodeURIComponent(agent)}/${encodeURIComponent(id)}`,
    id: 'task-hooks',
    text: 'Its webhooks',
  });
  box.replaceChildren(el('h3', {}, 'Task ', el('code', { text: id })), info, el('p', {}, cancelBtn, ' ', hooksLink),
    el('h3', { text: 'Timeline' }), note, timeline);
  cancelBtn.addEventListener('click', async () => {
    cancelBtn.disabled = true;
    try {
      await rest(agent, 'POST', `/tasks/${encodeURIComponent(id)}:cancel`, { body: {} });
    } catch (e) {
      note.textContent = e.message;
    }
  });
  const load = async () => {
    try {
      const t = await rest(agent, 'GET', `/tasks/${encodeURIComponent(id)}`);
      if (openTask?.id !== id) return;
      const state = stateName(t.status?.state);
      cancelBtn.disabled = isEnd(state);
      // The activated extensions: an agent message of the task lists them first.
      const extensions = [...new Set((t.history ?? []).filter((m) => m.role === 'ROLE_AGENT').flatMap((m) => m.extensions ?? []))];
      info.replaceChildren(
        el('dl.kv', {},
          el('dt', { text: 'state' }), el('dd', {}, el(`span.st.st-${state}`, { text: state })),
          el('dt', { text: 'context' }), el('dd', { text: t.contextId ?? '' }),
          el('dt', { text: 'updated' }), el('dd', { title: t.status?.timestamp ?? '', text: when(t.status?.timestamp) }),
          ...(['failed', 'canceled', 'rejected'].includes(state)
            ? [el('dt', { text: 'reason' }), el('dd', { id: 'task-reason', text: textOf(t.status?.message) || 'none given' })]
            : []),
          ...(extensions.length ? [el('dt', { text: 'extensions' }), el('dd', { id: 'task-extensions', text: extensions.join(', ') })] : [])),
        el('h3', { text: 'History' }),
        el('ol.history', {}, (t.history ?? []).map((m) => el('li', {}, el('strong', { text: m.role === 'ROLE_USER' ? 'user: ' : 'agent: ' }), ...partsView(m)))),
        ...((t.artifacts ?? []).length ? [
          el('h3', { text: 'Artifacts' }),
          el('ul', {}, t.artifacts.map((a) => el('li', {}, el('strong', { text: `${a.name ?? a.artifactId}: ` }), ...partsView(a)))),
        ] : []));
    } catch (e) {
      info.replaceChildren(el('p.error', { text: e.message }));
    }
  };
  await load();
  // On a narrow screen the detail is below the list: once it holds the task, it comes
  // into view.
  if (openTask?.id === id && window.matchMedia('(max-width: 820px)').matches) {
    box.scrollIntoView({ block: 'start' });
  }
  follow(agent, id, timeline, note, controller.signal, load);
}

/** The task's events from 1, live to the end; a dropped connection resumes after the last
 *  event seen (Last-Event-ID), a few times, then gives up with a note. */
async function follow(agent, id, timeline, note, signal, reload) {
  let last = 0;
  let drops = 0;
  // The task's history, artifacts and "updated" are read again with its events: at once
  // when its state changes, else at most once a second (a progress update, an artifact, a
  // token), so they never fall behind the timeline for long.
  let pending = null;
  let readAt = 0;
  const readNow = () => {
    clearTimeout(pending);
    pending = null;
    readAt = Date.now();
    reload();
  };
  const readSoon = () => {
    if (pending) return;
    pending = setTimeout(() => { if (!signal.aborted) readNow(); }, Math.max(0, 1000 - (Date.now() - readAt)));
  };
  signal.addEventListener('abort', () => clearTimeout(pending));
  while (!signal.aborted) {
    let ended = false;
    try {
      note.textContent = last ? `Resumed after event ${last}.` : 'Following…';
      const stream = await rpc('seed', agent, 'tasks/resubscribe', { taskId: id, includeHistory: true },
        { stream: true, headers: { 'last-event-id': String(last) }, signal });
      if (!(stream && typeof stream[Symbol.asyncIterator] === 'function')) {
        // Answered as JSON (the agent does not stream to this client): the task as it stands.
        timeline.append(entry(null, stream));
        ended = true;
      } else {
        let state = null;
        for await (const f of stream) {
          if (f.id !== null && f.id <= last) continue;
          if (f.id !== null) last = f.id;
          timeline.append(entry(f.id, f.data));
          if (f.data?.final) ended = true;
          if (f.data?.status?.state !== state || ended) {
            state = f.data?.status?.state;
            readNow();
          } else {
            readSoon();
          }
        }
      }
    } catch (e) {
      if (signal.aborted) return;
      note.textContent = e.message;
      // An error a2ad answered ends it; a connection that broke is resumed.
      if (e instanceof ApiError && e.status !== 0) return;
    }
    if (ended || signal.aborted) {
      if (!signal.aborted) note.textContent = `${last || 'No'} event${last === 1 ? '' : 's'}; the task has ended.`;
      return;
    }
    drops += 1;
    if (drops > 5) {
      note.textContent = `The stream dropped ${drops} times; reopen the task to try again.`;
      return;
    }
    await new Promise((r) => setTimeout(r, 500 * drops));
  }
}

function entry(n, t) {
  const state = stateName(t?.status?.state);
  const text = textOf(t?.status?.message) || t?.status?.reason || '';
  return el('li', { 'data-event': n ?? '' },
    el('span.n', { text: n === null ? '·' : `#${n}` }),
    el(`span.st.st-${state}`, { text: state }),
    text ? ` — ${text}` : '',
    el('span.meta', { text: `  ${when(t?.status?.timestamp)}` }));
}
