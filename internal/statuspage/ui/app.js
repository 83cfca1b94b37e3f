// sigwatch status page: polls the /v1 API and renders it. Every value from
// the API reaches the DOM through textContent or an attribute, never as HTML.
'use strict';

const POLL_MS = 1500;
const PAGE = 50;
const STORMS = 20; // storms listed
const TOKEN_KEY = 'sigwatch.token';

const $ = (id) => document.getElementById(id);

let token = sessionStorage.getItem(TOKEN_KEY) || '';
let timer = null;
let busy = false;

class APIError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

// api calls path with the token and returns the decoded JSON body.
async function api(method, path, body) {
  const headers = {};
  if (token) headers.Authorization = 'Bearer ' + token;
  const init = { method, headers, cache: 'no-store' };
  if (body !== undefined) {
    headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  let resp;
  try {
    resp = await fetch(path, init);
  } catch (e) {
    throw new APIError(0, 'sigwatch is not answering');
  }
  let data = null;
  try {
    data = await resp.json();
  } catch (e) {
    // not JSON: the status says enough
  }
  if (!resp.ok) {
    const msg = data && data.error ? data.error : resp.status + ' ' + resp.statusText;
    throw new APIError(resp.status, msg);
  }
  return data;
}

// --- formatting ---

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

// ms shows a duration in ms; its parts never wrap apart (no-break spaces).
function ms(v) {
  if (typeof v !== 'number' || !isFinite(v)) return '–';
  const a = Math.abs(v);
  if (a < 1000) return Math.round(v) + '\u00a0ms';
  if (a < 60e3) return (v / 1e3).toFixed(a < 10e3 ? 1 : 0) + '\u00a0s';
  // Round once, then split, so that 9m 59.6s reads 10m 0s, not 9m 60s.
  const sec = Math.round(v / 1e3);
  if (sec < 3600) return Math.floor(sec / 60) + 'm\u00a0' + (sec % 60) + 's';
  const min = Math.round(sec / 60);
  if (min < 1440) return Math.floor(min / 60) + 'h\u00a0' + (min % 60) + 'm';
  const hr = Math.round(min / 60);
  return Math.floor(hr / 24) + 'd\u00a0' + (hr % 24) + 'h';
}

function ago(t) {
  if (typeof t !== 'number' || t <= 0) return '–';
  return ms(Math.max(0, Date.now() - t)) + ' ago';
}

function until(t) {
  if (typeof t !== 'number' || t <= 0) return '–';
  return 'in ' + ms(Math.max(0, t - Date.now()));
}

function clockTime(t) {
  if (typeof t !== 'number' || t <= 0) return '';
  return new Date(t).toLocaleString();
}

// duration shows a threshold given in ms or as a Go duration string.
function duration(v) {
  if (typeof v === 'number') return ms(v);
  if (typeof v === 'string' && v) return v;
  return '–';
}

function num(v, digits) {
  if (typeof v !== 'number' || !isFinite(v)) return '–';
  return v.toLocaleString(undefined, { maximumFractionDigits: digits || 0 });
}

// pick returns the first of the dotted paths that is present in o.
function pick(o, ...paths) {
  for (const p of paths) {
    let v = o;
    for (const k of p.split('.')) {
      if (v === null || typeof v !== 'object' || !(k in v)) {
        v = undefined;
        break;
      }
      v = v[k];
    }
    if (v !== undefined && v !== null) return v;
  }
  return undefined;
}

// --- banner and token ---

function showErrors(errs) {
  const b = $('banner');
  b.replaceChildren();
  if (errs.length === 0) {
    b.hidden = true;
    return;
  }
  for (const e of errs) b.append(el('div', e));
  b.hidden = false;
}

function askToken(why) {
  $('login-why').textContent = why;
  $('login').hidden = false;
  $('main').hidden = true;
  $('live').textContent = 'needs a token';
  $('live').className = 'live off';
  if (document.activeElement !== $('token')) $('token').focus();
}

$('login').addEventListener('submit', (ev) => {
  ev.preventDefault();
  token = $('token').value.trim();
  sessionStorage.setItem(TOKEN_KEY, token);
  $('token').value = '';
  $('login').hidden = true;
  $('main').hidden = false;
  poll();
});

$('forget').addEventListener('click', () => {
  token = '';
  sessionStorage.removeItem(TOKEN_KEY);
  poll();
});

// renderWho shows whose token the page uses; the buttons its role may not
// use are hidden (style.css), as the API would refuse them.
function renderWho(w) {
  const role = (w && w.role) || 'admin';
  document.body.dataset.role = role;
  const named = w && w.name && w.name !== 'local';
  $('who').hidden = !named;
  $('who').textContent = named ? w.name + ' · ' + role + (role === 'viewer' || role === 'metrics' ? ' (read only)' : '') : '';
}

// --- paged lists ---

// Pager follows the API's opaque cursors: the stack holds the cursor of
// every page up to the one shown, so previous goes back exactly.
class Pager {
  constructor(name) {
    this.name = name;
    this.stack = [''];
    this.next = '';
    $(name + '-prev').addEventListener('click', () => {
      if (this.stack.length > 1) this.stack.pop();
      poll();
    });
    $(name + '-next').addEventListener('click', () => {
      if (this.next) this.stack.push(this.next);
      poll();
    });
  }
  cursor() { return this.stack[this.stack.length - 1]; }
  show(next, rows) {
    this.next = next || '';
    $(this.name + '-prev').disabled = this.stack.length <= 1;
    $(this.name + '-next').disabled = !this.next;
    const first = this.stack.length === 1 && !this.next;
    $(this.name + '-page').textContent = 'page ' + this.stack.length;
    // One page of results needs no pager.
    $(this.name + '-pager').hidden = first;
    // A page emptied under us (its devices recovered): start over.
    if (rows === 0 && this.stack.length > 1 && !this.next) this.stack = [''];
  }
  // showTable shows a page of rows in the table named like the pager, with
  // its count and empty note, then the pager itself.
  showTable(rows, data) {
    $(this.name + '-empty').hidden = rows.length > 0 || this.stack.length > 1;
    $(this.name).hidden = rows.length === 0 && this.stack.length === 1;
    $(this.name + '-count').textContent = rows.length ? '(' + rows.length + (data.next ? '+' : '') + ' on this page)' : '';
    this.show(data && data.next, rows.length);
  }
}

const lostPager = new Pager('lost');
const alarmsPager = new Pager('alarms');

// fillPage reads one page of a list from cursor. The API bounds the work of
// each request, so one answer may hold fewer rows than asked for, even none,
// and still have a next cursor: follow it until the page is full or the
// list ends, within a bounded number of requests.
async function fillPage(path, params, key, cursor) {
  const rows = [];
  let next = cursor;
  for (let calls = 0; calls < 40; calls++) {
    const d = await api('GET', path + '?' + query({ ...params, limit: PAGE - rows.length, cursor: next }));
    rows.push(...((d && d[key]) || []));
    next = (d && d.next) || '';
    if (!next || rows.length >= PAGE) break;
  }
  return { [key]: rows, next };
}

function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v) q.set(k, v);
  return q.toString();
}

function renderLost(data) {
  const rows = (data && data.devices) || [];
  const body = $('lost').tBodies[0];
  body.replaceChildren(...rows.map((d) => {
    const tr = el('tr');
    tr.dataset.device = d.device;
    tr.append(
      el('td', d.device, 'id'),
      el('td', d.type || '–'),
      el('td', d.lost_at ? ms(Date.now() - d.lost_at) : '–', 'bad'),
      el('td', ago(d.last_seen)),
      el('td', duration(pick(d, 'threshold_ms'))),
    );
    tr.cells[0].title = d.device; // the whole id where the cell cuts it
    tr.cells[2].title = clockTime(d.lost_at);
    tr.cells[3].title = clockTime(d.last_seen);
    return tr;
  }));
  lostPager.showTable(rows, data);
}

// scopeLabel names a storm's scope: "group gw-17" or "fleet".
function scopeLabel(x) {
  return x.scope === 'fleet' ? 'fleet' : 'group ' + x.group;
}

// ackPath is where an alarm row's ack goes: a device's, a group's or the
// fleet's storm alarm.
function ackPath(row) {
  if (row.scope === 'fleet') return '/v1/fleet/ack';
  if (row.scope === 'group') return '/v1/groups/' + encodeURIComponent(row.group) + '/ack';
  return '/v1/devices/' + encodeURIComponent(row.device) + '/ack';
}

// heldText says how many device alarms storm s holds; the fleet's storm
// leaves those of devices whose group has a storm to that one.
function heldText(s, rows) {
  if (s.state !== 'active' || typeof s.held !== 'number') return '–';
  const groups = rows.some((x) => x.scope === 'group' && x.state === 'active');
  return num(s.held) + (s.scope === 'fleet' && groups ? ' (others under their group’s)' : '');
}

// renderStorms shows the storms going on and the latest ended ones; the
// section stays hidden while there has been none.
function renderStorms(data) {
  const rows = (data && data.storms) || [];
  storms = rows;
  $('storms-section').hidden = rows.length === 0;
  const active = rows.filter((s) => s.state === 'active').length;
  $('storms-count').textContent = rows.length ? '(' + active + ' going on)' : '';
  $('storms').tBodies[0].replaceChildren(...rows.map((s) => {
    const tr = el('tr');
    const acts = el('td', null, 'buttons');
    const al = s.alarm || {};
    // Older servers have only the counts of the storm's last transition.
    const live = typeof s.lost === 'number' && typeof s.size === 'number';
    if (al.state && al.state !== 'idle') {
      const ack = el('button', 'ack', 'ack needs-operator');
      ack.type = 'button';
      ack.dataset.scope = s.scope;
      ack.dataset.group = s.group || '';
      acts.append(ack);
    }
    tr.append(
      el('td', scopeLabel(s), 'id'),
      el('td', s.state, 'state ' + (s.state === 'active' ? 'raised' : 'ended')),
      el('td', num(live ? s.lost : s.devices) + ' / ' + num(live ? s.size : s.watched), 'lost-now'),
      el('td', heldText(s, rows)),
      el('td', ago(s.since)),
      el('td', s.ended ? ago(s.ended) : '–'),
      el('td', al.state || '–'),
      acts,
    );
    tr.dataset.scope = s.scope;
    tr.dataset.group = s.group || '';
    tr.cells[2].title = (live ? 'Lost now of the devices watched now; ' : '') + num(s.devices) + ' / ' + num(s.watched) +
      (s.state === 'active' ? ' when it started' : ' when it ended');
    tr.cells[3].title = 'Device alarms it holds: not sent while it lasts';
    tr.cells[4].title = clockTime(s.since);
    if (s.ended) tr.cells[5].title = clockTime(s.ended);
    return tr;
  }));
}

// renderSinks shows where alarms go and whether they get there; the
// section stays hidden when no sink is configured.
function renderSinks(data) {
  const rows = (data && data.sinks) || [];
  $('sinks-section').hidden = rows.length === 0;
  const bad = rows.filter((s) => s.state !== 'ok').length;
  $('sinks-count').textContent = rows.length ? '(' + (bad ? bad + ' not ok' : 'all ok') + ')' : '';
  $('sinks').tBodies[0].replaceChildren(...rows.map((s) => {
    const tr = el('tr');
    tr.append(
      el('td', s.name, 'id'),
      el('td', s.type),
      el('td', s.state, 'state ' + (s.state === 'ok' ? 'ended' : 'raised')),
      el('td', num(s.queue)),
      el('td', s.rate ? s.rate + '/s' : '–'),
      el('td', ago(s.last_sent)),
      el('td', s.last_error || '–', 'error' + (s.state !== 'ok' ? ' bad' : '')),
    );
    if (s.last_sent) tr.cells[5].title = clockTime(s.last_sent);
    if (s.last_error) tr.cells[6].title = s.last_error;
    return tr;
  }));
}

$('storms').addEventListener('click', async (ev) => {
  const btn = ev.target.closest('button');
  if (!btn) return;
  const row = { scope: btn.dataset.scope, group: btn.dataset.group };
  const msg = $('action-msg');
  const dur = $('ack-for').value.trim();
  try {
    btn.disabled = true;
    await api('POST', ackPath(row), dur ? { for: dur } : {});
    msg.textContent = 'acked the ' + scopeLabel(row) + ' storm alarm' + (dur ? ' for ' + dur : '');
    msg.className = 'action-msg ok';
  } catch (e) {
    if (e.status === 401) askToken('The token was refused; enter it again.');
    msg.textContent = 'ack ' + scopeLabel(row) + ': ' + e.message;
    msg.className = 'action-msg err';
  }
  poll();
});

// storms is the last storm list; held the last count of held alarms, and
// expanded the folds of held alarms the user opened (by key).
let storms = [];
const expanded = new Set();

// heldFolds groups the held alarms by the storm that holds them: one fold
// per storm going on, and one for those not under a storm shown here
// (waiting out the storm hold, or under a storm beyond the list). A fold
// says how to list its alarms: query, and keep for what the query cannot
// filter.
function heldFolds(held) {
  const active = storms.filter((s) => s.state === 'active');
  const stormGroups = new Set(active.filter((s) => s.scope === 'group').map((s) => s.group));
  const outside = (a) => !stormGroups.has(a.group);
  const folds = [];
  let under = 0;
  for (const s of active) {
    const n = typeof s.held === 'number' ? s.held : 0;
    under += n;
    if (n === 0) continue;
    folds.push(s.scope === 'fleet'
      ? { key: 'fleet', scope: 'fleet', n, label: 'held under the fleet storm', query: { state: 'held' }, keep: outside }
      : { key: 'group:' + s.group, scope: 'group', group: s.group, n, label: 'held under the storm of group ' + s.group,
        query: { state: 'held', group: s.group } });
  }
  const rest = (typeof held === 'number' ? held : 0) - under;
  if (rest > 0) {
    // The storm list is cut at STORMS: the rest may be under storms not shown.
    const label = storms.length >= STORMS ? 'held under storms not listed, or waiting out the storm hold'
      : 'held, waiting out the storm hold';
    folds.push({ key: 'waiting', n: rest, label, query: { state: 'held' }, keep: outside });
  }
  return folds;
}

// foldRows lists the first page of an opened fold's alarms.
async function foldRows(f) {
  if (!f.keep) return (await fillPage('/v1/alarms', f.query, 'alarms', '')).alarms;
  const d = await api('GET', '/v1/alarms?' + query({ ...f.query, limit: PAGE }));
  return ((d && d.alarms) || []).filter(f.keep);
}

function alarmRow(a) {
  const tr = el('tr');
  const who = a.scope ? scopeLabel(a) + ' (storm)' : a.device;
  tr.dataset.device = a.device;
  const state = a.muted && a.state !== 'muted' ? a.state + ', muted' : a.state;
  let when = '–';
  if (a.acked_until) when = 'acked ' + until(a.acked_until) + (a.acked_by ? ' by ' + a.acked_by : '');
  else if (a.next_repeat) when = a.next_repeat > Date.now() ? 'repeat ' + until(a.next_repeat) : 'repeat due';
  const ack = el('button', 'ack', 'ack needs-operator');
  ack.type = 'button';
  ack.dataset.device = a.device;
  ack.dataset.scope = a.scope || '';
  ack.dataset.group = a.group || '';
  ack.dataset.action = 'ack';
  const acts = el('td', null, 'buttons');
  acts.append(ack);
  if (!a.scope) {
    // Mutes name a device or a type; a storm alarm is muted by its type.
    const mute = el('button', 'mute', 'mute needs-operator');
    mute.type = 'button';
    mute.dataset.device = a.device;
    mute.dataset.action = 'mute';
    acts.append(mute);
  }
  tr.append(
    el('td', who, 'id'),
    el('td', a.type || '–'),
    el('td', state, 'state ' + String(a.state).replace(/[^a-z]/g, '')),
    el('td', ago(a.since)),
    el('td', num(a.count)),
    el('td', when, 'when'),
    acts,
  );
  tr.cells[0].title = who;
  tr.cells[2].title = a.state === 'held' ? HELD : '';
  tr.cells[3].title = clockTime(a.since);
  return tr;
}

const HELD = 'held: the device is lost but its alarm is not sent: a storm speaks for it, or it waits out the storm hold';

// foldRow is the one row that stands for a fold's held alarms.
function foldRow(f) {
  const tr = el('tr', null, 'fold');
  tr.dataset.fold = f.key;
  const open = expanded.has(f.key);
  const td = el('td', (open ? '▾ ' : '▸ ') + num(f.n) + (f.n === 1 ? ' device alarm ' : ' device alarms ') + f.label, 'fold-label');
  td.colSpan = 6;
  td.title = HELD;
  const btn = el('button', open ? 'hide' : 'show', 'fold-toggle');
  btn.type = 'button';
  btn.dataset.fold = f.key;
  btn.setAttribute('aria-expanded', String(open));
  const acts = el('td', null, 'buttons');
  acts.append(btn);
  tr.append(td, acts);
  return tr;
}

// renderAlarms shows the open alarms that are not held, page by page, and
// the held ones folded under the storm that holds them: one row per storm,
// its alarms listed (first page) only when opened.
function renderAlarms(data, held, opened) {
  const rows = (data && data.alarms) || [];
  // Storm alarms first: the folds of held alarms go under them.
  const scopeKey = (a) => (a.scope === 'fleet' ? '' : '~' + a.group);
  const sorted = [...rows.filter((a) => a.scope).sort((a, b) => scopeKey(a).localeCompare(scopeKey(b))), ...rows.filter((a) => !a.scope)];
  const folds = heldFolds(held);
  const out = sorted.map(alarmRow);
  for (const f of folds.slice().reverse()) {
    const group = [foldRow(f)];
    if (expanded.has(f.key)) {
      const list = opened[f.key] || [];
      for (const a of list) {
        const tr = alarmRow(a);
        tr.classList.add('folded');
        group.push(tr);
      }
      if (f.n > list.length) {
        const more = el('tr', null, 'folded more');
        const q = '/v1/alarms?' + query({ ...f.query });
        const td = el('td', '… ' + num(f.n - list.length) + ' more: GET ' + q);
        td.colSpan = 7;
        more.append(td);
        group.push(more);
      }
    }
    const at = out.findIndex((tr) => f.scope && tr.cells[0].textContent === scopeLabel(f) + ' (storm)');
    out.splice(at >= 0 ? at + 1 : 0, 0, ...group);
  }
  for (const k of [...expanded]) if (!folds.some((f) => f.key === k)) expanded.delete(k);
  $('alarms').tBodies[0].replaceChildren(...out);
  alarmsPager.showTable(rows, data);
  if (folds.length) {
    $('alarms').hidden = false;
    $('alarms-empty').hidden = true;
    const n = folds.reduce((t, f) => t + f.n, 0);
    $('alarms-count').textContent = '(' + num(rows.length) + (data && data.next ? '+' : '') + ' on this page, ' + num(n) + ' held in ' +
      folds.length + ' fold' + (folds.length === 1 ? '' : 's') + ')';
  }
  $('held-legend').hidden = !(typeof held === 'number' && held > 0) && !rows.some((a) => a.state === 'held');
}

$('alarms').addEventListener('click', async (ev) => {
  const fold = ev.target.closest('button[data-fold]');
  if (fold) {
    const k = fold.dataset.fold;
    if (expanded.has(k)) expanded.delete(k);
    else expanded.add(k);
    poll();
    return;
  }
  const btn = ev.target.closest('button[data-action]');
  if (!btn) return;
  const row = { device: btn.dataset.device, scope: btn.dataset.scope, group: btn.dataset.group };
  const id = row.scope ? scopeLabel(row) : row.device;
  const path = ackPath(row);
  const msg = $('action-msg');
  try {
    btn.disabled = true;
    if (btn.dataset.action === 'ack') {
      const dur = $('ack-for').value.trim();
      await api('POST', path, dur ? { for: dur } : {});
      msg.textContent = dur ? 'acked ' + id + ' for ' + dur : 'acked ' + id + ': alarm resolved';
    } else {
      const dur = $('mute-for').value.trim() || '1h';
      await api('POST', '/v1/mutes', { device: id, for: dur });
      msg.textContent = 'muted ' + id + ' for ' + dur;
    }
    msg.className = 'action-msg ok';
  } catch (e) {
    if (e.status === 401) askToken('The token was refused; enter it again.');
    msg.textContent = btn.dataset.action + ' ' + id + ': ' + e.message;
    msg.className = 'action-msg err';
  }
  poll();
});

// --- counters ---

// counter adds a counter to dl; key names it for scripts (data-key), and a
// tip explains it on hover.
function counter(dl, label, value, cls, key, tip) {
  const d = el('div', null, cls ? 'counter ' + cls : 'counter');
  const dd = el('dd');
  if (value instanceof Node) dd.append(value);
  else dd.textContent = value;
  d.append(el('dt', label), dd);
  if (key) d.dataset.key = key;
  if (tip) d.title = tip;
  dl.append(d);
  return d;
}

// Alarm states in the header, in the order shown.
const ALARM_STATES = ['active', 'held', 'acked', 'flapping', 'mutes'];

function renderCounters(s, sh) {
  const dl = $('counters');
  dl.replaceChildren();
  const note = $('counters-note');
  note.hidden = true;
  if (s) {
    $('counters').dataset.at = pick(s, 'at') || '';
    counter(dl, 'watched', num(pick(s, 'watched')), '', 'watched',
      'Devices waiting for their next signal: each has a deadline and is not lost now.').dataset.value = pick(s, 'watched');
    const lost = pick(s, 'lost');
    counter(dl, 'lost', num(lost), lost > 0 ? 'bad' : '', 'lost',
      'Devices lost now: silent past their threshold. Counts devices, each once.').dataset.value = lost;
    const alarms = pick(s, 'alarms');
    if (alarms && typeof alarms === 'object') {
      const dd = document.createDocumentFragment();
      const keys = ALARM_STATES.filter((k) => typeof alarms[k] === 'number')
        .concat(Object.keys(alarms).filter((k) => typeof alarms[k] === 'number' && !ALARM_STATES.includes(k)));
      keys.forEach((k, j) => {
        if (j) dd.append(' · ');
        const part = el('span', k + ' ' + num(alarms[k]), 'part');
        part.dataset.key = k;
        part.dataset.value = alarms[k];
        dd.append(part);
      });
      counter(dl, 'alarms', keys.length ? dd : '0', '', 'alarms',
        'Open alarms by state: counts alarms, not devices. A storm raises one alarm for its group or the fleet, ' +
        'and the alarms of its lost devices are held under it (not sent). mutes: mutes in force.');
      const held = alarms.held || 0;
      if (held > 0) {
        const active = alarms.active || 0;
        note.textContent = 'LOST counts devices, ALARMS counts alarms: ' +
          (held === 1 ? 'the alarm of 1 lost device is held' : 'the alarms of ' + num(held) + ' lost devices are held') +
          ', not sent, while a storm speaks for them (or the storm hold runs); ' +
          num(active) + ' alarm' + (active === 1 ? ' is' : 's are') + ' raised. See “held” under Open alarms.';
        note.hidden = false;
      }
    }
    counter(dl, 'signals/s', num(pick(s, 'signals_per_sec'), 1));
    counter(dl, 'lost / min', num(pick(s, 'last_minute.lost')));
    counter(dl, 'recovered / min', num(pick(s, 'last_minute.recovered')));
    const p50 = pick(s, 'fire_lag.p50_ms');
    const p99 = pick(s, 'fire_lag.p99_ms');
    counter(dl, 'fire lag p50 / p99', ms(p50) + ' / ' + ms(p99));
  }
  const wm = s ? pick(s, 'watermark.age_ms') : undefined;
  const wmAge = wm !== undefined ? wm : sh && sh.watermark_lag_ms;
  // Redis time and this browser's clock differ by a little: never show a negative age.
  if (wmAge !== undefined) counter(dl, 'watermark age', ms(Math.max(0, wmAge)), wmAge > 5000 ? 'bad' : '');
  const outage = s ? outageText(s) : '';
  if (outage) counter(dl, 'outages', outage, outage.startsWith('in progress') ? 'bad' : outage.startsWith('reconnect grace') ? 'warn' : '');
  const procs = s && Array.isArray(s.processes) ? s.processes : null;
  if (procs) {
    counter(dl, 'processes', num(procs.length));
    dl.lastChild.title = procs.map((p) => p.name + ' (' + (p.roles || []).join(', ') + ')').join('\n');
  }
  if (sh) counter(dl, 'shards', num(sh.shards) + (sh.prev ? ' (doubling from ' + sh.prev + ')' : ''));
  if (sh && timersOn(sh)) counter(dl, 'timers', num(sh.timers));
}

// timersOn says whether this sigwatch serves generic timers: some are
// stored, or a replica fires them.
function timersOn(sh) {
  return sh.timers > 0 || (sh.list || []).some((s) => s.timers_owner);
}

// outageText says whether ingest is in an outage now (its watermark stalled,
// or a process lost the MQTT broker), whether devices are in their reconnect
// grace after a broker restart, or when the last recorded outage ended.
function outageText(s) {
  const w = pick(s, 'watermark');
  if (!w || typeof w !== 'object') return '';
  if (w.outage) return Array.isArray(w.broker_down) && w.broker_down.length ? 'in progress: MQTT broker lost' : 'in progress';
  if (typeof w.grace_until === 'number' && w.grace_until > 0) {
    return 'reconnect grace after a broker restart, ends ' + until(w.grace_until);
  }
  const list = Array.isArray(w.outages) ? w.outages : [];
  const total = typeof w.outages_total === 'number' ? w.outages_total : list.length;
  if (list.length === 0) return total ? num(total) + ' recorded' : 'none';
  const last = list[list.length - 1] || {};
  const end = pick(last, 'end');
  const start = pick(last, 'start');
  const grace = pick(last, 'grace_from');
  let len = typeof end === 'number' && typeof start === 'number' ? ' (' + ms(end - start) : '';
  if (len && typeof grace === 'number' && grace > 0) len += ', ' + ms(end - grace) + ' of it reconnect grace';
  if (len) len += ')';
  return num(total) + ', last ended ' + ago(end) + len;
}

// --- fire lag chart ---

const SVG = 'http://www.w3.org/2000/svg';

function svg(tag, attrs, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  if (text !== undefined) e.textContent = text;
  return e;
}

function renderChart(s) {
  const box = $('chart');
  const hist = (s && Array.isArray(s.history) ? s.history : []).filter((p) => p && typeof p === 'object');
  const series = [
    { key: ['p99_ms'], cls: 'p99', name: 'p99' },
    { key: ['p50_ms'], cls: 'p50', name: 'p50' },
  ];
  const pts = series.map((se) => hist.map((p) => pick(p, ...se.key)));
  if (hist.length < 2) {
    box.replaceChildren(el('p', s ? 'Collecting points…' : 'No fire lag history from this sigwatch.', 'empty'));
    return;
  }
  if (!pts.some((arr) => arr.some((v) => typeof v === 'number'))) {
    const span = pick(hist[hist.length - 1], 'at') - pick(hist[0], 'at');
    box.replaceChildren(el('p', 'No device was reported lost in the last ' + ms(span) + '.', 'empty'));
    return;
  }
  const W = 480, H = 120, L = 44, B = 18, T = 8;
  let max = 0;
  for (const arr of pts) for (const v of arr) if (typeof v === 'number' && v > max) max = v;
  max = Math.max(10, niceCeil(max));
  const x = (i) => L + (i * (W - L - 4)) / (hist.length - 1);
  const y = (v) => T + (H - T - B) * (1 - v / max);
  const g = svg('svg', { viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-label': 'fire lag p50 and p99' });
  for (const f of [0, 0.5, 1]) {
    g.append(svg('line', { x1: L, x2: W - 4, y1: y(max * f), y2: y(max * f), class: 'grid' }));
    g.append(svg('text', { x: L - 4, y: y(max * f) + 4, class: 'axis', 'text-anchor': 'end' }, ms(max * f).replace('\u00a0', '')));
  }
  const span = pick(hist[hist.length - 1], 'at') - pick(hist[0], 'at');
  g.append(svg('text', { x: L, y: H - 3, class: 'axis' }, isFinite(span) ? '−' + ms(span) : ''));
  g.append(svg('text', { x: W - 4, y: H - 3, class: 'axis', 'text-anchor': 'end' }, 'now'));
  series.forEach((se, k) => {
    const d = pts[k].map((v, i) => (typeof v === 'number' ? `${x(i).toFixed(1)},${y(v).toFixed(1)}` : null)).filter(Boolean);
    if (d.length > 1) g.append(svg('polyline', { points: d.join(' '), class: 'line ' + se.cls }));
    // Dots show the points a line cannot join (seconds with no loss between them).
    for (const p of d) {
      const [cx, cy] = p.split(',');
      g.append(svg('circle', { cx, cy, r: 1.8, class: 'dot ' + se.cls }));
    }
    // The legend gives the last minute's quantile, as the counters do.
    const q = pick(s, 'fire_lag.' + se.key[0]);
    g.append(svg('text', { x: L + 8 + (1 - k) * 110, y: T + 10, class: 'legend ' + se.cls }, se.name + ' ' + ms(q)));
  });
  box.replaceChildren(g);
}

function niceCeil(v) {
  const p = Math.pow(10, Math.floor(Math.log10(v || 1)));
  for (const m of [1, 2, 5, 10]) if (v <= m * p) return m * p;
  return 10 * p;
}

// --- shard map ---

function hue(s) {
  let h = 0;
  for (const c of s) h = (h * 31 + c.codePointAt(0)) % 360;
  return h;
}

function renderShards(sh) {
  const grid = $('shards');
  const owners = $('owners');
  if (!sh) {
    grid.replaceChildren();
    owners.replaceChildren();
    return;
  }
  const list = sh.list || [];
  const maxSize = Math.max(1, ...list.map((s) => s.size || 0));
  const byOwner = new Map();
  grid.replaceChildren(...list.map((s) => {
    const c = el('div', null, 'shard');
    const owner = s.owner || '';
    byOwner.set(owner, (byOwner.get(owner) || 0) + 1);
    if (owner) c.style.borderColor = `hsl(${hue(owner)} 55% 45%)`;
    else c.classList.add('unowned');
    if (s.head_lag_ms > 2000) c.classList.add('lagging');
    c.append(el('span', s.shard, 'n'), el('span', num(s.size), 'size'));
    const bar = el('span', null, 'bar');
    bar.style.width = Math.round((100 * (s.size || 0)) / maxSize) + '%';
    c.append(bar);
    c.title = `shard ${s.shard}\n${num(s.size)} devices\nhead lag ${ms(s.head_lag_ms)}\nowner ${owner || 'none'}`;
    if (timersOn(sh)) c.title += `\n${num(s.timers)} timers, fired by ${s.timers_owner || 'none'}`;
    return c;
  }));
  owners.replaceChildren(...[...byOwner.entries()].sort().map(([o, n]) => {
    const li = el('li');
    const sw = el('span', null, 'swatch');
    if (o) sw.style.background = `hsl(${hue(o)} 55% 45%)`;
    li.append(sw, el('span', (o || 'no owner') + ': ' + n + ' shard' + (n === 1 ? '' : 's')));
    return li;
  }));
  const lagging = list.filter((s) => s.head_lag_ms > 2000).length;
  $('shards-summary').textContent = `(${num(sh.shards)} shards, epoch ${num(sh.epoch)}, ${num(sh.devices)} devices` +
    (sh.timers > 0 ? `, ${num(sh.timers)} timers` : '') + (lagging ? `, ${lagging} with head lag > 2 s` : '') + ')';
  const dr = sh.drain || {};
  $('drain').textContent = dr.draining
    ? `Doubling ${dr.from} → ${dr.to} since ${ago(dr.since)}: ${num(dr.moved_left)} moved devices left, ${dr.shards_drained} of ${dr.from} old shards drained, ${dr.shards_unchecked} not checked yet.`
    : 'No doubling in progress.';
  $('drain').className = dr.draining ? 'drain busy' : 'drain';
  $('watermark').textContent = sh.watermark
    ? `Watermark ${ms(Math.max(0, sh.watermark_lag_ms))} behind (${clockTime(sh.watermark)}).`
    : 'No watermark yet.';
}

// --- polling ---

async function poll() {
  clearTimeout(timer);
  timer = null;
  if (busy) {
    timer = setTimeout(poll, 100);
    return;
  }
  if (document.hidden) return; // visibilitychange starts it again
  busy = true;
  try {
    await refresh();
  } finally {
    busy = false;
    if (!document.hidden) timer = setTimeout(poll, POLL_MS);
  }
}

async function refresh() {
  const calls = [
    ['stats', api('GET', '/v1/stats')],
    ['shards', api('GET', '/v1/shards')],
    ['lost devices', fillPage('/v1/devices', { state: 'lost' }, 'devices', lostPager.cursor())],
    // Held alarms are folded under their storms, not listed one by one.
    ['alarms', fillPage('/v1/alarms', { state: 'active,acked,flapping' }, 'alarms', alarmsPager.cursor())],
    ['storms', api('GET', '/v1/storms?limit=' + STORMS)],
    ['sinks', api('GET', '/v1/sinks')],
    ['who', api('GET', '/v1/whoami')],
  ];
  const res = await Promise.allSettled(calls.map((c) => c[1]));
  // An older sigwatch has no whoami: its one token may do everything.
  const whoAt = calls.findIndex((c) => c[0] === 'who');
  if (res[whoAt].status === 'rejected' && res[whoAt].reason.status === 404) {
    res[whoAt] = { status: 'fulfilled', value: { name: '', role: 'admin' } };
  }
  if (res.some((r) => r.status === 'rejected' && r.reason.status === 401)) {
    askToken(token ? 'The token was refused; enter the API token again.' : 'This sigwatch needs an API token.');
    showErrors([]);
    $('forget').hidden = true;
    return;
  }
  $('login').hidden = true;
  $('main').hidden = false;
  $('forget').hidden = !token;
  const errs = [];
  const val = {};
  res.forEach((r, i) => {
    const name = calls[i][0];
    if (r.status === 'fulfilled') {
      val[name] = r.value;
      return;
    }
    const e = r.reason;
    let why = e.message;
    if (e.status === 503) why = 'unavailable: ' + e.message;
    if (e.status === 404) why = 'this sigwatch does not serve it (404)';
    errs.push(name + ': ' + why);
  });
  const down = errs.length === calls.length && res.every((r) => r.reason.status === 0);
  if (down) {
    errs.splice(0, errs.length, 'sigwatch is not answering: showing the last data, retrying every ' + POLL_MS / 1000 + ' s.');
  }
  if ('stats' in val || 'shards' in val) renderCounters(val.stats, val.shards);
  // Without an answer the chart keeps its last points, unless this sigwatch
  // has no stats at all.
  if ('stats' in val) renderChart(val.stats);
  else if (res[0].reason.status === 404) renderChart(null);
  if ('shards' in val) renderShards(val.shards);
  if ('lost devices' in val) renderLost(val['lost devices']);
  if ('storms' in val) renderStorms(val.storms);
  if ('sinks' in val) renderSinks(val.sinks);
  if ('who' in val) renderWho(val.who);
  if ('alarms' in val) {
    const held = val.stats ? pick(val.stats, 'alarms.held') : undefined;
    const opened = {};
    for (const f of heldFolds(held)) {
      if (!expanded.has(f.key)) continue;
      try {
        opened[f.key] = await foldRows(f);
      } catch (e) {
        errs.push('held alarms: ' + e.message);
      }
    }
    renderAlarms(val.alarms, held, opened);
  }
  showErrors(errs);
  const live = $('live');
  if (errs.length === 0) {
    live.textContent = 'live · ' + new Date().toLocaleTimeString();
    live.className = 'live on';
  } else {
    live.textContent = (down ? 'not answering · ' : 'degraded · ') + new Date().toLocaleTimeString();
    live.className = 'live off';
  }
}

document.addEventListener('visibilitychange', () => {
  if (!document.hidden) poll();
});

poll();
