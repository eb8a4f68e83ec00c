// Webhooks: a task's push configurations (create, list, delete: the A2A 1.0 operations over
// HTTP+JSON) and the caller's recent delivery attempts on the agent — event, delivery id,
// attempt, outcome, HTTP status, latency, next retry — from a2ad's own read
// `GET …/rest/x-a2ad/deliveries`, refreshed every 2 seconds while shown.

import { el, fillAgents, rest, showError, taskLink, when } from './wire.js';

let app;
let timer = null;
const $ = (id) => document.getElementById(id);
const configsPath = (task) => `/tasks/${encodeURIComponent(task)}/pushNotificationConfigs`;

export function mount(a) {
  app = a;
  fillAgents($('hook-agent'), app.agents.filter((x) => x.webhooks));
  if (mount.done) return;
  mount.done = true;
  $('hook-form').addEventListener('submit', (ev) => { ev.preventDefault(); create(); });
  $('hook-list').addEventListener('click', list);
  $('hook-agent').addEventListener('change', () => { $('hook-rows').replaceChildren(); deliveries(); });
  $('hook-task').addEventListener('input', () => deliveries());
}

/** `arg`: `{agent, taskId}` to fill in. */
export function show(arg) {
  if (arg?.agent) $('hook-agent').value = arg.agent;
  if (arg?.taskId) $('hook-task').value = arg.taskId;
  if (!app.agents.some((x) => x.webhooks)) {
    showError($('hook-error'), new Error('No agent of this key takes webhooks.'));
  }
  deliveries();
  clearInterval(timer);
  timer = setInterval(() => { if (!document.hidden) deliveries(); }, 2000);
}

export function hide() {
  clearInterval(timer);
  timer = null;
}

async function create() {
  const agent = $('hook-agent').value;
  const task = $('hook-task').value.trim();
  const body = { taskId: task, url: $('hook-url').value.trim() };
  if ($('hook-token').value.trim()) body.token = $('hook-token').value.trim();
  showError($('hook-error'), null);
  try {
    await rest(agent, 'POST', configsPath(task), { body });
    await list();
  } catch (e) {
    showError($('hook-error'), e);
  }
}

async function list() {
  const agent = $('hook-agent').value;
  const task = $('hook-task').value.trim();
  if (!task) {
    showError($('hook-error'), new Error('Name a task: configurations belong to one task.'));
    return;
  }
  showError($('hook-error'), null);
  try {
    const r = await rest(agent, 'GET', configsPath(task));
    const rows = (r.configs ?? []).map((c) =>
      el('tr', { 'data-config': c.id },
        el('td', {}, el('code', { text: c.id })),
        el('td', { text: c.url }),
        el('td', { text: c.token ? 'set' : '' }),
        el('td', {}, el('button.quiet', {
          type: 'button', text: 'Delete', 'aria-label': `Delete configuration ${c.id}`,
          onclick: async () => {
            try {
              await rest(agent, 'DELETE', `${configsPath(task)}/${encodeURIComponent(c.id)}`);
              await list();
            } catch (e) {
              showError($('hook-error'), e);
            }
          },
        }))));
    $('hook-rows').replaceChildren(...(rows.length ? rows : [el('tr', {}, el('td', { colspan: '4', text: 'None.' }))]));
  } catch (e) {
    showError($('hook-error'), e);
  }
}

async function deliveries() {
  const agent = $('hook-agent').value;
  if (!agent) return;
  const body = $('delivery-rows');
  try {
    const r = await rest(agent, 'GET', '/x-a2ad/deliveries?pageSize=50');
    // A task named above: its deliveries only (a task's page links here).
    const task = $('hook-task').value.trim();
    const list = (r.deliveries ?? []).filter((d) => !task || d.taskId === task);
    $('delivery-scope').textContent = task
      ? `Deliveries of task ${task} (clear the task above to see all).`
      : 'Your recent deliveries on this agent.';
    const seen = JSON.stringify([agent, task, list.map((d) => [d.deliveryId, d.attempt, d.at])]);
    if (seen === body.dataset.seen) return;
    body.dataset.seen = seen;
    const rows = list.map((d) =>
      el('tr', { 'data-delivery': d.deliveryId, 'data-outcome': d.outcome },
        el('td', { text: when(d.at) }),
        // The target it went to, masked as the server shows it (query values, password).
        el('td', {}, d.event, d.url ? el('small.url', { text: d.url }) : null),
        el('td', {}, el('code', {}, taskLink(agent, d.taskId))),
        el('td', {}, el('code', { title: d.deliveryId, text: d.deliveryId.slice(0, 8) })),
        el('td', { text: `${d.attempt}/${d.maxAttempts}` }),
        el('td', {}, el(`span.st.st-${d.outcome}`, { text: d.outcome }), d.error ? el('small', { text: ` ${d.error}` }) : null),
        el('td', { text: d.httpStatus ?? '' }),
        el('td', { text: `${d.latencyMs} ms` }),
        el('td', { text: when(d.nextAttemptAt) })));
    body.replaceChildren(...(rows.length ? rows : [el('tr', {}, el('td', { colspan: '9', text: 'No deliveries yet.' }))]));
  } catch (e) {
    delete body.dataset.seen;
    body.replaceChildren(el('tr', {}, el('td.error', { colspan: '9', text: e.message })));
  }
}
