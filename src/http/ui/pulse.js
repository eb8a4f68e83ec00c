// Pulse: the server's vital signs from `/metrics` (the Prometheus text a2ad already
// serves), sampled every 2 seconds and drawn as small charts over the last 5 minutes:
// requests/s, p50 and p99 latency, tasks by state, streams held, store commit latency and
// batch size, webhook success rate. Rates and quantiles are taken between two samples.

import { el, request } from './wire.js';

const EVERY_MS = 2000;
const KEEP = 150; // 5 minutes
let timer = null;
let previous = null;
const series = new Map(); // id -> [{t, v}]

const CHARTS = [
  { id: 'rps', title: 'Requests/s', unit: '/s' },
  { id: 'p50', title: 'Latency p50', unit: ' ms' },
  { id: 'p99', title: 'Latency p99', unit: ' ms' },
  { id: 'working', title: 'Tasks working', unit: '' },
  { id: 'submitted', title: 'Tasks queued (submitted)', unit: '' },
  { id: 'finished', title: 'Tasks finished/s', unit: '/s' },
  { id: 'streams', title: 'Streams held', unit: '' },
  { id: 'commit', title: 'Store commit latency', unit: ' ms' },
  { id: 'batch', title: 'Store batch size', unit: ' writes' },
  { id: 'hooks', title: 'Webhook success rate', unit: ' %', empty: 'no deliveries' },
];

export function mount() {
  const box = document.getElementById('charts');
  if (box.children.length) return;
  box.replaceChildren(...CHARTS.map((c) =>
    el('figure.chart', { id: `chart-${c.id}` },
      el('h3', {}, el('span', { text: c.title }), el('span.now', { text: '—' })),
      el('canvas', { width: '600', height: '180', role: 'img', 'aria-label': `${c.title} over the last 5 minutes`, 'data-points': '0' }))));
}

export function show() {
  sample();
  clearInterval(timer);
  timer = setInterval(sample, EVERY_MS);
}

export function hide() {
  clearInterval(timer);
  timer = null;
}

/** Prometheus text → [{name, labels, value}] (comments skipped). */
export function parse(text) {
  const out = [];
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const m = /^([a-zA-Z_:][\w:]*)(\{([^}]*)\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    const labels = {};
    for (const l of (m[3] ?? '').matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]] = l[2];
    out.push({ name: m[1], labels, value: Number(m[4]) });
  }
  return out;
}

function sum(samples, name, filter = () => true) {
  return samples.filter((s) => s.name === name && filter(s.labels)).reduce((a, s) => a + s.value, 0);
}

/** Cumulative latency buckets summed over every dialect and method: le → count. */
function buckets(samples) {
  const b = new Map();
  for (const s of samples) {
    if (s.name !== 'a2ad_request_duration_seconds_bucket') continue;
    const le = s.labels.le === '+Inf' ? Infinity : Number(s.labels.le);
    b.set(le, (b.get(le) ?? 0) + s.value);
  }
  return [...b.entries()].sort((x, y) => x[0] - y[0]);
}

/** The q-quantile (seconds) of the requests between two bucket snapshots, interpolated. */
function quantile(q, now, before) {
  const delta = now.map(([le, n], i) => [le, n - (before[i]?.[1] ?? 0)]);
  const total = delta.length ? delta[delta.length - 1][1] : 0;
  if (total <= 0) return null;
  const rank = q * total;
  let lower = 0;
  let below = 0;
  for (const [le, n] of delta) {
    if (n >= rank) {
      if (le === Infinity) return lower;
      const inBucket = n - below;
      return lower + (le - lower) * (inBucket > 0 ? (rank - below) / inBucket : 1);
    }
    lower = le === Infinity ? lower : le;
    below = n;
  }
  return lower;
}

async function sample() {
  let text;
  try {
    const res = await request('GET', '/metrics', { wire: 'rest' });
    text = await res.text();
  } catch {
    return;
  }
  const s = parse(text);
  const now = {
    t: performance.now() / 1000,
    requests: sum(s, 'a2ad_requests_total'),
    finished: sum(s, 'a2ad_tasks_finished_total'),
    buckets: buckets(s),
    commits: sum(s, 'a2ad_store_commits_total'),
    commitSeconds: sum(s, 'a2ad_store_commit_seconds_total'),
    writes: sum(s, 'a2ad_store_writes_total'),
    delivered: sum(s, 'a2ad_webhook_deliveries_total'),
    failed: sum(s, 'a2ad_webhook_failures_total'),
  };
  const gauges = {
    working: sum(s, 'a2ad_tasks', (l) => l.state === 'working'),
    submitted: sum(s, 'a2ad_tasks', (l) => l.state === 'submitted'),
    streams: sum(s, 'a2ad_streams_open'),
  };
  for (const [k, v] of Object.entries(gauges)) push(k, now.t, v);
  if (previous) {
    const dt = Math.max(now.t - previous.t, 0.001);
    push('rps', now.t, (now.requests - previous.requests) / dt);
    push('finished', now.t, (now.finished - previous.finished) / dt);
    const p50 = quantile(0.5, now.buckets, previous.buckets);
    const p99 = quantile(0.99, now.buckets, previous.buckets);
    push('p50', now.t, p50 === null ? 0 : p50 * 1000);
    push('p99', now.t, p99 === null ? 0 : p99 * 1000);
    const commits = now.commits - previous.commits;
    push('commit', now.t, commits > 0 ? ((now.commitSeconds - previous.commitSeconds) / commits) * 1000 : 0);
    push('batch', now.t, commits > 0 ? (now.writes - previous.writes) / commits : 0);
    // A rate of nothing is no rate: with no delivery ended in the interval the point is
    // empty (a gap in the line, "no deliveries" as the value), never a made-up 100 %.
    const ended = (now.delivered - previous.delivered) + (now.failed - previous.failed);
    push('hooks', now.t, ended > 0 ? ((now.delivered - previous.delivered) / ended) * 100 : null);
  }
  previous = now;
  for (const c of CHARTS) draw(c);
}

function push(id, t, v) {
  const list = series.get(id) ?? [];
  list.push({ t, v: v === null ? null : (Number.isFinite(v) ? v : 0) });
  while (list.length > KEEP) list.shift();
  series.set(id, list);
}

const round = (v) => (v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2));

function draw(chart) {
  const fig = document.getElementById(`chart-${chart.id}`);
  if (!fig) return;
  const canvas = fig.querySelector('canvas');
  const points = series.get(chart.id) ?? [];
  const lastV = points.at(-1)?.v;
  fig.querySelector('.now').textContent = !points.length
    ? '—'
    : lastV === null ? (chart.empty ?? '—') : `${round(lastV)}${chart.unit}`;
  // Drawn at the canvas's size on screen, in device pixels: sharp, never stretched.
  const box = canvas.getBoundingClientRect();
  const dpr = window.devicePixelRatio || 1;
  if (box.width > 0) {
    canvas.width = Math.round(box.width * dpr);
    canvas.height = Math.round(box.height * dpr);
  }
  const g = canvas.getContext('2d');
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  const w = canvas.width / dpr;
  const h = canvas.height / dpr;
  g.clearRect(0, 0, w, h);
  g.fillStyle = '#ffffff';
  g.fillRect(0, 0, w, h);
  g.strokeStyle = '#cfd5dd';
  g.lineWidth = 1;
  for (let i = 1; i < 4; i++) {
    g.beginPath();
    g.moveTo(0, (h * i) / 4);
    g.lineTo(w, (h * i) / 4);
    g.stroke();
  }
  const values = points.filter((p) => p.v !== null).map((p) => p.v);
  const max = Math.max(...values, chart.unit === ' %' ? 100 : 1e-9);
  g.fillStyle = '#4a5361';
  g.font = '11px sans-serif';
  g.fillText(`max ${round(max)}${chart.unit}`, 4, 12);
  if (points.length) {
    // The window grows with the samples (at least 20 s) up to the 5 minutes kept.
    const span = Math.min((KEEP * EVERY_MS) / 1000, Math.max(20, points.at(-1).t - points[0].t));
    const t0 = points.at(-1).t - span;
    const x = (t) => ((t - t0) / span) * (w - 4);
    const y = (v) => h - 16 - (v / max) * (h - 34);
    // The time axis: how far back the left edge is, and now on the right.
    g.fillStyle = '#4a5361';
    g.fillText(`−${Math.round(span)} s`, 4, h - 3);
    const nowLabel = 'now';
    g.fillText(nowLabel, w - 4 - g.measureText(nowLabel).width, h - 3);
    canvas.dataset.span = String(Math.round(span));
    g.strokeStyle = '#0b5cad';
    g.lineWidth = 2;
    g.beginPath();
    let pen = false;
    for (const p of points) {
      if (p.v === null) {
        pen = false;
        continue;
      }
      if (pen) g.lineTo(x(p.t), y(p.v));
      else g.moveTo(x(p.t), y(p.v));
      pen = true;
    }
    g.stroke();
    const lastP = points.at(-1);
    if (lastP.v !== null) {
      g.fillStyle = '#0b5cad';
      g.beginPath();
      g.arc(x(lastP.t), y(lastP.v), 3, 0, Math.PI * 2);
      g.fill();
    }
  }
  canvas.dataset.points = String(points.length);
}
