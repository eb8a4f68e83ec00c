// The inspector's shell: sign-in (the credential lives in this tab's session storage), the
// agents the credential may use, and the five views. Every call goes through a2ad's normal
// authenticated endpoints (wire.js); the inspector has no privilege of its own.

import { ApiError, getJson, setCredential, showError } from './wire.js';
import * as agents from './agents.js';
import * as chat from './chat.js';
import * as tasks from './tasks.js';
import * as hooks from './hooks.js';
import * as pulse from './pulse.js';

const VIEWS = { agents, chat, tasks, hooks, pulse };
const KEY = 'a2ad.credential';
const $ = (id) => document.getElementById(id);

/** A view's address: `#view`, or `#view/<agent>/<task id>` for one task (Tasks, Webhooks). */
export function address(name, arg) {
  return arg?.agent && arg?.taskId
    ? `#${name}/${encodeURIComponent(arg.agent)}/${encodeURIComponent(arg.taskId)}`
    : `#${name}`;
}

/** The view and argument an address names. */
function route(hash) {
  const [name, agent, taskId] = hash.replace(/^#/, '').split('/').map((p) => {
    try { return decodeURIComponent(p); } catch { return ''; }
  });
  return { name: VIEWS[name] ? name : 'agents', arg: agent && taskId ? { agent, taskId } : undefined };
}

const app = {
  agents: [],
  principal: '',
  current: null,
  /** Switches view (also from other views: "open this task"); each switch is a step Back
   *  returns from, and its address can be reloaded or shared. */
  go(name, arg) {
    if (!VIEWS[name]) return;
    const hash = address(name, arg);
    if (location.hash !== hash) history.pushState(null, '', hash);
    show(name, arg);
  },
  /** Says the address of what is shown now, without a new step (a task opened or closed
   *  inside a view). */
  at(name, arg) {
    const hash = address(name, arg);
    if (app.current === name && location.hash !== hash) history.replaceState(null, '', hash);
  },
};

function show(name, arg) {
  const previous = app.current;
  app.current = name;
  if (previous && previous !== name) VIEWS[previous].hide?.();
  for (const v of Object.keys(VIEWS)) $(`view-${v}`).hidden = v !== name;
  for (const b of document.querySelectorAll('#nav button')) {
    if (b.dataset.view === name) b.setAttribute('aria-current', 'page');
    else b.removeAttribute('aria-current');
  }
  VIEWS[name].show?.(arg);
}

async function signIn(value) {
  setCredential(value);
  const listing = await getJson('/api/v1/agents');
  app.agents = listing.agents ?? [];
  app.principal = listing.principal ?? '';
  sessionStorage.setItem(KEY, value);
  $('signin').hidden = true;
  $('nav').hidden = false;
  $('who').hidden = false;
  $('principal').textContent = `signed in as ${app.principal}`;
  for (const v of Object.values(VIEWS)) v.mount?.(app);
  const start = route(location.hash);
  history.replaceState(null, '', address(start.name, start.arg));
  show(start.name, start.arg);
}

function signOut() {
  sessionStorage.removeItem(KEY);
  location.hash = '';
  location.reload();
}

function explain(e) {
  if (e instanceof ApiError && e.status === 401) {
    return new Error(`That key or token was not accepted. ${e.message}`);
  }
  return e;
}

document.addEventListener('DOMContentLoaded', async () => {
  $('signin-form').addEventListener('submit', async (ev) => {
    ev.preventDefault();
    showError($('signin-error'), null);
    const value = $('credential').value.trim();
    if (!value) return;
    try {
      await signIn(value);
    } catch (e) {
      setCredential(null);
      showError($('signin-error'), explain(e));
      $('credential').focus();
    }
  });
  $('signout').addEventListener('click', signOut);
  for (const b of document.querySelectorAll('#nav button')) {
    b.addEventListener('click', () => app.go(b.dataset.view));
  }
  // Back and Forward (and an address typed or followed): the view it names.
  window.addEventListener('popstate', () => {
    if ($('nav').hidden) return;
    const to = route(location.hash);
    show(to.name, to.arg);
  });
  // A link to an address inside the inspector (`#tasks/…`) is a step like a switch.
  document.addEventListener('click', (ev) => {
    const a = ev.target.closest?.('a[href^="#"]');
    if (!a || ev.ctrlKey || ev.metaKey || ev.shiftKey || $('nav').hidden) return;
    ev.preventDefault();
    const to = route(a.getAttribute('href'));
    app.go(to.name, to.arg);
  });
  const saved = sessionStorage.getItem(KEY);
  if (saved) {
    try {
      await signIn(saved);
    } catch (e) {
      sessionStorage.removeItem(KEY);
      showError($('signin-error'), explain(e));
    }
  }
  if ($('signin').hidden === false) $('credential').focus();
});
