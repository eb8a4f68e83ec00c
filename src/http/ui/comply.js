// The compliance mark of "On the wire": each answer and stream frame the chat receives,
// checked against the object rules of its dialect — A2A 1.0 over JSON-RPC and HTTP+JSON
// (the specification's Task, Message, Part, Artifact, status and artifact update events,
// the JSON-RPC 2.0 envelope, google.rpc.Status errors) and the seed dialect (Evo AI's
// JSON-RPC: lower-case states, `type`d parts). `check` returns the first rule broken, or
// null when the value keeps them all.

const STATES_10 = new Set(['TASK_STATE_SUBMITTED', 'TASK_STATE_WORKING', 'TASK_STATE_COMPLETED',
  'TASK_STATE_FAILED', 'TASK_STATE_CANCELED', 'TASK_STATE_INPUT_REQUIRED', 'TASK_STATE_REJECTED',
  'TASK_STATE_AUTH_REQUIRED']);
const ROLES_10 = new Set(['ROLE_USER', 'ROLE_AGENT']);
const STATES_SEED = new Set(['submitted', 'working', 'input-required', 'completed', 'canceled',
  'failed', 'rejected', 'auth-required', 'unknown']);

class Broken extends Error {}

const isObject = (v) => v !== null && typeof v === 'object' && !Array.isArray(v);

function need(ok, rule) {
  if (!ok) throw new Broken(rule);
}

function str(v, path, { empty = false } = {}) {
  need(typeof v === 'string' && (empty || v.length > 0), `${path} must be a ${empty ? '' : 'non-empty '}string`);
}

function optStr(o, key, path) {
  if (o[key] !== undefined) str(o[key], `${path}.${key}`, { empty: true });
}

/** Exactly one of `keys` is present in `o`; returns it. */
function oneOf(o, keys, path) {
  const present = keys.filter((k) => o[k] !== undefined && o[k] !== null);
  need(present.length === 1, `${path} must hold exactly one of ${keys.join(', ')} (holds ${present.join(', ') || 'none'})`);
  return present[0];
}

// === A2A 1.0 (ProtoJSON) ===

function part10(p, path) {
  need(isObject(p), `${path} must be an object`);
  const kind = oneOf(p, ['text', 'raw', 'url', 'data'], path);
  if (kind === 'text') str(p.text, `${path}.text`, { empty: true });
  if (kind === 'raw') need(typeof p.raw === 'string' && /^[A-Za-z0-9+/_-]*={0,2}$/.test(p.raw), `${path}.raw must be base64`);
  if (kind === 'url') str(p.url, `${path}.url`);
  optStr(p, 'mediaType', path);
  optStr(p, 'filename', path);
}

function parts10(v, path) {
  need(Array.isArray(v), `${path} must be an array`);
  v.forEach((p, i) => part10(p, `${path}[${i}]`));
}

function message10(m, path) {
  need(isObject(m), `${path} must be an object`);
  str(m.messageId, `${path}.messageId`);
  need(ROLES_10.has(m.role), `${path}.role must be ROLE_USER or ROLE_AGENT (is ${JSON.stringify(m.role)})`);
  need(Array.isArray(m.parts) && m.parts.length > 0, `${path}.parts must be a non-empty array`);
  parts10(m.parts, `${path}.parts`);
  optStr(m, 'contextId', path);
  optStr(m, 'taskId', path);
}

function status10(s, path) {
  need(isObject(s), `${path} must be an object`);
  need(STATES_10.has(s.state), `${path}.state must be a TASK_STATE_* value (is ${JSON.stringify(s.state)})`);
  if (s.message !== undefined && s.message !== null) message10(s.message, `${path}.message`);
  optStr(s, 'timestamp', path);
}

function artifact10(a, path) {
  need(isObject(a), `${path} must be an object`);
  str(a.artifactId, `${path}.artifactId`);
  need(Array.isArray(a.parts), `${path}.parts must be an array`);
  parts10(a.parts, `${path}.parts`);
}

function task10(t, path) {
  need(isObject(t), `${path} must be an object`);
  str(t.id, `${path}.id`);
  str(t.contextId, `${path}.contextId`);
  status10(t.status, `${path}.status`);
  if (t.artifacts !== undefined) {
    need(Array.isArray(t.artifacts), `${path}.artifacts must be an array`);
    t.artifacts.forEach((a, i) => artifact10(a, `${path}.artifacts[${i}]`));
  }
  if (t.history !== undefined) {
    need(Array.isArray(t.history), `${path}.history must be an array`);
    t.history.forEach((m, i) => message10(m, `${path}.history[${i}]`));
  }
}

/** A send's result (`SendMessageResponse`) or a stream's event (`StreamResponse`). */
function event10(r, path, stream) {
  need(isObject(r), `${path} must be an object`);
  const kinds = stream ? ['task', 'message', 'statusUpdate', 'artifactUpdate'] : ['task', 'message'];
  const kind = oneOf(r, kinds, path);
  const v = r[kind];
  const at = `${path}.${kind}`;
  if (kind === 'task') task10(v, at);
  if (kind === 'message') message10(v, at);
  if (kind === 'statusUpdate') {
    need(isObject(v), `${at} must be an object`);
    str(v.taskId, `${at}.taskId`);
    str(v.contextId, `${at}.contextId`);
    status10(v.status, `${at}.status`);
  }
  if (kind === 'artifactUpdate') {
    need(isObject(v), `${at} must be an object`);
    str(v.taskId, `${at}.taskId`);
    str(v.contextId, `${at}.contextId`);
    artifact10(v.artifact, `${at}.artifact`);
  }
}

/** What an operation answers in 1.0, by its JSON-RPC method or HTTP+JSON path. */
function result10(op, r, path, stream) {
  if (/SendStreamingMessage|SubscribeToTask|message:stream|:subscribe/.test(op)) return event10(r, path, true);
  if (/SendMessage|message:send/.test(op)) return event10(r, path, stream);
  if (/GetTask|CancelTask|\/tasks\/[^/?]+(:cancel)?$/.test(op)) return task10(r, path);
  return null;
}

// === The seed dialect (Evo AI) ===

function partSeed(p, path) {
  need(isObject(p), `${path} must be an object`);
  need(['text', 'file', 'data'].includes(p.type), `${path}.type must be text, file or data (is ${JSON.stringify(p.type)})`);
  if (p.type === 'text') str(p.text, `${path}.text`, { empty: true });
  if (p.type === 'file') need(isObject(p.file), `${path}.file must be an object`);
  if (p.type === 'data') need(p.data !== undefined, `${path}.data is required`);
}

function messageSeed(m, path) {
  need(isObject(m), `${path} must be an object`);
  need(m.role === 'user' || m.role === 'agent', `${path}.role must be user or agent (is ${JSON.stringify(m.role)})`);
  need(Array.isArray(m.parts), `${path}.parts must be an array`);
  m.parts.forEach((p, i) => partSeed(p, `${path}.parts[${i}]`));
}

function statusSeed(s, path) {
  need(isObject(s), `${path} must be an object`);
  need(STATES_SEED.has(s.state), `${path}.state must be a task state (is ${JSON.stringify(s.state)})`);
  if (s.message !== undefined && s.message !== null) messageSeed(s.message, `${path}.message`);
}

function resultSeed(r, path) {
  need(isObject(r), `${path} must be an object`);
  str(r.id, `${path}.id`);
  if (r.status !== undefined) statusSeed(r.status, `${path}.status`);
  if (r.artifact !== undefined) {
    need(isObject(r.artifact) && Array.isArray(r.artifact.parts), `${path}.artifact.parts must be an array`);
    r.artifact.parts.forEach((p, i) => partSeed(p, `${path}.artifact.parts[${i}]`));
  }
  need(r.status !== undefined || r.artifact !== undefined, `${path} must hold a status or an artifact`);
}

// === The envelopes ===

function envelope(v, check) {
  need(isObject(v), 'the response must be a JSON object');
  need(v.jsonrpc === '2.0', 'jsonrpc must be "2.0"');
  need('id' in v && (v.id === null || ['string', 'number'].includes(typeof v.id)), 'id must be a string, a number or null');
  const kind = oneOf(v, ['result', 'error'], 'the response');
  if (kind === 'error') {
    need(isObject(v.error) && Number.isInteger(v.error.code), 'error.code must be an integer');
    str(v.error.message, 'error.message', { empty: true });
  } else {
    check(v.result, 'result');
  }
}

/**
 * The first rule `value` breaks, or null. `wire`: `seed`, `v1` (1.0 JSON-RPC) or `rest`
 * (1.0 HTTP+JSON); `op`: the JSON-RPC method or the HTTP+JSON path; `frame`: a stream
 * frame rather than a whole answer; `status`: the answer's HTTP status.
 */
export function check({ wire, op, frame, value, status = 200 }) {
  try {
    if (wire === 'rest') {
      if (status >= 400) {
        need(isObject(value) && isObject(value.error), 'an error answer must be {"error": google.rpc.Status}');
        need(Number.isInteger(value.error.code), 'error.code must be an integer');
        str(value.error.message, 'error.message', { empty: true });
        return null;
      }
      result10(op, value, frame ? 'the event' : 'the answer', frame);
      return null;
    }
    envelope(value, (r, path) => {
      if (wire === 'seed') {
        if (/message\/send|message\/stream|tasks\/get|tasks\/cancel|tasks\/resubscribe/.test(op)) resultSeed(r, path);
      } else {
        result10(op, r, path, frame);
      }
    });
    return null;
  } catch (e) {
    if (e instanceof Broken) return e.message;
    throw e;
  }
}
