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

const app = {
  agents: [],
  principal: '',
  current: null,
  /** Switches view (also from other views: "open this task"). */
  go(name, arg) {
    if (!VIEWS[name]) return;
    if (app.current && app.current !== name) VIEWS[app.current].hide?.();
    app.current = name;
    for (const v of Object.keys(VIEWS)) $(`view-${v}`).hidden = v !== name;
    for (const b of document.querySelectorAll('#nav button')) {
      if (b.dataset.view === name) b.setAttribute('aria-current', 'page');
      else b.removeAttribute('aria-current');
    }
    if (location.hash !== `#${name}`) history.replaceState(null, '', `#${name}`);
    VIEWS[name].show?.(arg);
  },
};

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
  const start = location.hash.slice(1);
  app.go(VIEWS[start] ? start : 'agents');
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
