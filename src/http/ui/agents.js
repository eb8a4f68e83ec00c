// Agents: each agent the credential may use, its public card (A2A 1.0), its extended card,
// capabilities, limits and live metrics, and a check of the card against the A2A 1.0 rules
// a2ad applies — with what a client without a preference would pick.

import { agentBase, el, readJson, request, rest, rpc, showError } from './wire.js';

let app;
let selected = null;
const $ = (id) => document.getElementById(id);

export function mount(a) {
  app = a;
  const list = $('agent-list');
  list.replaceChildren(
    ...app.agents.map((agent) =>
      el('li', {},
        el('button', {
          type: 'button', 'aria-pressed': 'false', 'data-agent': agent.id,
          onclick: () => select(agent.id),
        }, agent.name, el('small', { text: `${agent.id} · ${agent.backend}` })),
      ),
    ),
  );
  if (!app.agents.length) {
    $('agent-detail').replaceChildren(el('p', { text: 'This key may use no agent.' }));
  }
}

export function show() {
  if (!selected && app.agents.length) select(app.agents[0].id);
}

async function select(id) {
  selected = id;
  for (const b of document.querySelectorAll('#agent-list button')) {
    b.setAttribute('aria-pressed', String(b.dataset.agent === id));
  }
  const agent = app.agents.find((a) => a.id === id);
  const detail = $('agent-detail');
  const error = el('p.error', { role: 'alert', hidden: true });
  detail.replaceChildren(el('h3', { text: agent.name }), el('p.meta', { text: agent.description || 'No description.' }), error);

  detail.append(el('h3', { text: 'Capabilities and limits' }), kv({
    backend: agent.backend,
    streaming: agent.streaming,
    webhooks: agent.webhooks,
    'public card': agent.publicCard,
    'max message length': agent.limits.maxMessageLength,
    'max parts': agent.limits.maxParts,
    'max file size': `${agent.limits.maxFileSize} bytes`,
    'file types': agent.limits.supportedTypes.join(', ') || 'none',
    'requests per minute': agent.limits.requestsPerMinute,
    'concurrent tasks': agent.limits.concurrentTasks,
  }));

  if (agent.upstream) {
    // An agent a2ad fronts (backend a2a): is its upstream well?
    detail.append(el('h3', { text: 'Upstream agent' }), upstreamHealth(agent.upstream));
  }

  const metrics = el('div', {}, el('p.meta', { text: 'Loading…' }));
  detail.append(el('h3', { text: 'Live metrics' }), metrics);
  const cardBox = el('div');
  detail.append(el('h3', { text: 'Public card (A2A 1.0)' }), cardBox);
  const extBox = el('div');
  detail.append(el('h3', { text: 'Extended card' }), extBox);

  try {
    const seed = await rpc('seed', id, 'agent/authenticatedExtendedCard', { includeMetrics: true });
    if (selected !== id) return;
    metrics.replaceChildren(kv(seed.metrics ?? {}));
  } catch (e) {
    metrics.replaceChildren();
    showError(error, e);
  }
  if (agent.publicCard) {
    try {
      const res = await request('GET', `${agentBase(id)}/.well-known/agent-card.json`, {
        wire: 'v1', headers: {},
      });
      const card = await readJson(res);
      if (selected !== id) return;
      cardBox.replaceChildren(...cardCheck(card), json('The card as served', card));
    } catch (e) {
      cardBox.replaceChildren(el('p.error', { text: e.message }));
    }
  } else {
    // Said as it is, and checked: the URL is asked, and what it answers is shown.
    const url = `${agentBase(id)}/.well-known/agent-card.json`;
    let answer;
    try {
      const res = await request('GET', url, { wire: 'v1', headers: {} });
      answer = `it answers ${res.status}`;
    } catch (e) {
      answer = e.status ? `it answers ${e.status}` : `it cannot be read (${e.message})`;
    }
    if (selected !== id) return;
    cardBox.replaceChildren(el('p.meta', {
      id: 'public-card-state',
      text: `Not served (public_card = false): ${url} — ${answer}. Clients need the extended card, checked below.`,
    }));
  }
  try {
    const ext = await rest(id, 'GET', '/extendedAgentCard');
    if (selected !== id) return;
    extBox.replaceChildren(
      ...(agent.publicCard ? [] : cardCheck(ext)),
      json('GetExtendedAgentCard (HTTP+JSON)', ext),
    );
  } catch (e) {
    extBox.replaceChildren(el('p.error', { text: e.message }));
  }
}

/** The health of an upstream agent: its card's last fetch, the interface called, the last
 *  error. */
function upstreamHealth(u) {
  const ok = u.cardFetchedAt && !(u.lastError && u.lastError.at > u.cardFetchedAt);
  const state = el(ok ? 'p.meta' : 'p.error', {
    id: 'upstream-state',
    text: ok ? 'Reachable: its card was read.' : 'Not reachable: see the last error.',
  });
  return el('div', {}, state, kv({
    'card URL': u.cardUrl,
    'card fetched': u.cardFetchedAt ?? 'never',
    interface: u.interface ? `${u.interface.binding} ${u.interface.protocol}` : 'none yet',
    calls: u.requests,
    failures: u.errors,
    'last error': u.lastError ? `${u.lastError.at} — ${u.lastError.message}` : 'none',
  }));
}

function kv(obj, prefix = '') {
  const dl = el('dl.kv');
  for (const [k, v] of Object.entries(obj)) {
    if (v && typeof v === 'object' && !Array.isArray(v)) {
      for (const [k2, v2] of Object.entries(v)) {
        dl.append(el('dt', { text: `${prefix}${k}.${k2}` }), el('dd', { text: fmt(v2) }));
      }
    } else {
      dl.append(el('dt', { text: prefix + k }), el('dd', { text: fmt(v) }));
    }
  }
  return dl;
}

const fmt = (v) => (Array.isArray(v) ? v.join(', ') : typeof v === 'object' ? JSON.stringify(v) : String(v));

function json(title, value) {
  return el('details', {}, el('summary', { text: title }), el('pre', { text: JSON.stringify(value, null, 2) }));
}

const BINDINGS = ['JSONRPC', 'HTTP+JSON', 'GRPC'];
const nonEmpty = (s) => typeof s === 'string' && s.length > 0;

/** The A2A 1.0 card rules a2ad holds its cards to, each as pass/fail, and what a client
 *  without a preference would do with the card. */
export function cardCheck(card) {
  const checks = [];
  const check = (ok, text) => checks.push({ ok: Boolean(ok), text });
  check(nonEmpty(card.name), 'name is set');
  check(typeof card.description === 'string', 'description is present');
  check(nonEmpty(card.version), 'version is set');
  const ifaces = Array.isArray(card.supportedInterfaces) ? card.supportedInterfaces : [];
  check(ifaces.length > 0, 'supportedInterfaces lists at least one interface');
  for (const i of ifaces) {
    check(nonEmpty(i.url) && BINDINGS.includes(i.protocolBinding) && nonEmpty(i.protocolVersion),
      `interface ${i.protocolBinding ?? '?'} ${i.protocolVersion ?? '?'}: url, protocolBinding and protocolVersion`);
  }
  check(card.capabilities && typeof card.capabilities === 'object', 'capabilities is an object');
  for (const f of ['defaultInputModes', 'defaultOutputModes']) {
    check(Array.isArray(card[f]) && card[f].length > 0 && card[f].every(nonEmpty), `${f} lists media types`);
  }
  const skills = Array.isArray(card.skills) ? card.skills : [];
  check(skills.length > 0, 'skills lists at least one skill');
  for (const s of skills) {
    check(nonEmpty(s.id) && nonEmpty(s.name) && typeof s.description === 'string' && Array.isArray(s.tags),
      `skill ${s.id ?? '?'}: id, name, description, tags`);
  }
  const schemes = card.securitySchemes ?? {};
  const reqs = Array.isArray(card.securityRequirements) ? card.securityRequirements : [];
  const named = reqs.flatMap((r) => Object.keys(r.schemes ?? r));
  check(named.every((n) => n in schemes), 'every security requirement names a declared scheme');
  if (card.signatures) {
    for (const s of card.signatures) {
      let header = null;
      try {
        header = JSON.parse(atob(s.protected.replace(/-/g, '+').replace(/_/g, '/')));
      } catch {
        header = null;
      }
      check(header && nonEmpty(header.alg) && nonEmpty(header.kid) && nonEmpty(s.signature),
        `signature: protected header ${header ? `alg ${header.alg}, kid ${header.kid}` : 'unreadable'}`);
    }
  }
  const first = ifaces[0];
  const client = first
    ? `A client without a preference uses the first interface: ${first.protocolBinding} ${first.protocolVersion} at ${first.url}.`
    : 'A client finds no interface to use.';
  const auth = Object.keys(schemes).length
    ? `It authenticates with one of: ${Object.keys(schemes).join(', ')}.`
    : 'It needs no credential.';
  const failed = checks.filter((c) => !c.ok).length;
  return [
    el('p', { class: failed ? 'error' : 'meta', text: failed ? `${failed} of ${checks.length} checks fail.` : `All ${checks.length} checks pass.` }),
    el('ul.checks', {}, checks.map((c) => el('li', { class: c.ok ? '' : 'fail', text: c.text }))),
    el('p', { text: `${client} ${auth}` }),
  ];
}
