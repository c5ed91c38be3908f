// The status page (docs/src/observability.md, "The status page"): reads /api/events (the status
// document, then each second the new samples) over fetch, so the admin token can go in a header;
// falls back to polling /api/status. Every string from the router is set as text (textContent,
// attributes through the DOM), never parsed as markup.
'use strict';

(() => {
  const TOKEN_KEY = 'mrtr-admin-token';
  const WINDOW = 300;
  const $ = (id) => document.getElementById(id);

  const state = {
    doc: null,
    to: null,
    router: { requests: [], errors: [] },
    series: new Map(), // backend name -> { requests: [], errors: [] }
    rows: new Map(), // backend name -> row elements
    updates: 0,
    abort: null,
    polling: false,
    failures: 0,
  };

  // ---- small DOM helpers: text only -------------------------------------------------------
  // Characters that render as nothing or reorder the text around them (controls, bidi
  // overrides and isolates, zero-width ones, separators other than the space) are shown as
  // their code points: a name from a backend cannot pass for another.
  const HIDDEN = /[\u0000-\u0008\u000b-\u001f\u007f-\u00a0\u00ad\u061c\u1680\u180e\u2000-\u200f\u2028-\u202f\u205f-\u206f\u3000\ufeff\ufff9-\ufffb]/g;
  function visible(text) {
    return String(text).replace(HIDDEN, (c) => '\\u{' + c.charCodeAt(0).toString(16).toUpperCase() + '}');
  }
  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = visible(text);
    if (cls) e.className = cls;
    return e;
  }
  function setText(id, text) {
    $(id).textContent = text === undefined || text === null ? '–' : visible(text);
  }
  function fillDl(dl, pairs) {
    dl.replaceChildren();
    for (const [k, v] of pairs) {
      dl.append(el('dt', k), el('dd', v));
    }
  }
  function num(n) {
    if (typeof n !== 'number') return '–';
    if (Number.isInteger(n)) return n.toLocaleString('en-US');
    return n.toLocaleString('en-US', { maximumFractionDigits: 2 });
  }
  function bytes(n) {
    const units = ['B', 'KiB', 'MiB', 'GiB'];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return (i ? n.toFixed(1) : String(n)) + ' ' + units[i];
  }
  function duration(s) {
    const d = Math.floor(s / 86400), h = Math.floor(s / 3600) % 24, m = Math.floor(s / 60) % 60, sec = s % 60;
    const two = (x) => String(x).padStart(2, '0');
    return (d ? d + 'd ' : '') + (d || h ? h + 'h ' : '') + two(m) + 'm ' + two(sec) + 's';
  }
  function clock(ms) {
    return new Date(ms).toISOString().replace('T', ' ').slice(0, 19) + ' UTC';
  }
  function ago(ms, now) {
    return duration(Math.max(0, Math.round((now - ms) / 1000))) + ' ago';
  }

  // ---- the token: this tab's session only --------------------------------------------------
  function token() {
    try { return sessionStorage.getItem(TOKEN_KEY) || ''; } catch (_) { return ''; }
  }
  function authHeaders() {
    const t = token();
    return t ? { Authorization: 'Bearer ' + t } : {};
  }
  function showTokenBox() {
    const has = token() !== '';
    $('token-input').hidden = has;
    $('token-label').hidden = has;
    $('token-save').hidden = has;
    $('token-forget').hidden = !has;
  }
  function saveToken() {
    const v = $('token-input').value.trim();
    if (!v) return;
    try { sessionStorage.setItem(TOKEN_KEY, v); } catch (_) { /* storage off: nothing kept */ }
    $('token-input').value = '';
    showTokenBox();
    reconnect();
  }
  function forgetToken() {
    try { sessionStorage.removeItem(TOKEN_KEY); } catch (_) { /* nothing kept */ }
    showTokenBox();
    reconnect();
  }

  function notice(text, refused) {
    const n = $('notice');
    n.textContent = text;
    n.className = refused ? 'refused' : '';
    n.hidden = false;
  }

  // ---- sparklines and the rounds histogram: canvas, no markup ----------------------------------
  // The canvas's CSS size is its width and height attributes as first set: read once, never
  // from layout (reading layout after writing the DOM would force a layout per sparkline).
  function spark(canvas, values, max, color) {
    if (!canvas.dataset.w) {
      const dpr = window.devicePixelRatio || 1;
      canvas.dataset.w = String(canvas.width);
      canvas.dataset.h = String(canvas.height);
      canvas.dataset.dpr = String(dpr);
      canvas.width = Math.round(canvas.width * dpr);
      canvas.height = Math.round(canvas.height * dpr);
    }
    const w = Number(canvas.dataset.w), h = Number(canvas.dataset.h), dpr = Number(canvas.dataset.dpr);
    const g = canvas.getContext('2d');
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, w, h);
    g.fillStyle = '#eef1f4';
    g.fillRect(0, 0, w, h);
    if (!values.length) return;
    let top = Math.max(max || 0, 1e-9);
    for (const v of values) if (v > top) top = v;
    // The time axis: the whole ring once it is full, at least the last minute before.
    const span = Math.min(WINDOW, Math.max(60, values.length));
    const step = w / (span - 1);
    const x0 = w - (values.length - 1) * step;
    g.beginPath();
    values.forEach((v, i) => {
      const x = x0 + i * step, y = h - 1 - (v / top) * (h - 3);
      if (i === 0) g.moveTo(x, y); else g.lineTo(x, y);
    });
    g.strokeStyle = color;
    g.lineWidth = 1.2;
    g.stroke();
  }
  function rates(s) {
    return s.requests.map((r, i) => (r > 0 ? s.errors[i] / r : 0));
  }
  function histogram(canvas, rounds) {
    const g = canvas.getContext('2d');
    const w = canvas.width, h = canvas.height;
    g.clearRect(0, 0, w, h);
    if (!rounds || !rounds.count) { setText('r-rounds-text', 'no multi-round call finished yet'); return; }
    let prev = 0;
    const bars = rounds.buckets.map((b) => { const n = b.count - prev; prev = b.count; return [b.le, n]; });
    bars.push(['+Inf', rounds.count - prev]);
    const top = Math.max(...bars.map((b) => b[1]), 1);
    const bw = w / bars.length;
    g.fillStyle = '#2457a6';
    bars.forEach(([, n], i) => { const bh = (n / top) * (h - 2); g.fillRect(i * bw + 1, h - bh, bw - 2, bh); });
    const mean = rounds.sum / rounds.count;
    setText('r-rounds-text', 'buckets ≤ ' + bars.map((b) => b[0]).join(', ') + ' · ' + num(rounds.count) + ' calls, mean ' + num(mean));
  }

  // ---- the history: full on a new stream, the new samples after ----------------------------
  function append(arr, more) {
    const out = arr.concat(more);
    return out.length > WINDOW ? out.slice(out.length - WINDOW) : out;
  }
  function takeHistory(doc) {
    const h = doc.history;
    const fresh = state.to === null || h.from !== state.to;
    const take = (old, got) => ({
      requests: fresh ? got.requests.slice() : append(old.requests, got.requests),
      errors: fresh ? got.errors.slice() : append(old.errors, got.errors),
    });
    state.router = take(state.router, doc.router.history);
    const next = new Map();
    for (const b of doc.backends) {
      next.set(b.name, take(state.series.get(b.name) || { requests: [], errors: [] }, b.history));
    }
    state.series = next;
    state.to = h.to;
  }

  // ---- rendering -----------------------------------------------------------------------------
  function render(doc) {
    const t0 = performance.now();
    state.doc = doc;
    takeHistory(doc);
    const now = doc.generated_at_ms;
    setText('build', 'v' + doc.version + ' (' + doc.commit + ')');
    setText('uptime', 'up ' + duration(doc.uptime_seconds));
    renderAccess(doc.access);
    renderRouter(doc.router, now);
    renderBackends(doc.backends, doc.access, now);
    renderQuotas(doc.quotas, doc.access);
    renderAuth(doc.auth, now);
    renderCatalog(doc.catalog);
    if ('config' in doc) renderConfig(doc.config, doc.access);
    state.updates++;
    // For the tests and the curious: what the last update cost this tab.
    document.body.dataset.renderMs = (performance.now() - t0).toFixed(2);
    document.body.dataset.updates = String(state.updates);
    document.body.dataset.seq = String(doc.history.to);
  }

  function renderAccess(access) {
    const mode = $('mode');
    mode.textContent = access.change ? 'controls on' : 'read-only';
    mode.className = 'pill ' + (access.change ? 'live' : 'ro');
    const note = $('access-note');
    note.hidden = !access.why;
    note.textContent = access.why ? 'Read-only: ' + access.why + '.' : '';
  }

  function renderRouter(r, now) {
    setText('r-rps', num(r.requests_per_second));
    setText('r-eps', num(r.errors_per_second));
    spark($('r-rps-spark'), state.router.requests, 0, '#2457a6');
    spark($('r-eps-spark'), state.router.errors, 0, '#c62828');
    fillDl($('r-conns'), [
      ['HTTP/1.1', num(r.connections.http1)],
      ['HTTP/2', num(r.connections.http2)],
      ['pending', num(r.connections.pending)],
      ['parked', num(r.connections_parked)],
    ]);
    setText('r-pins', num(r.pins.total));
    fillDl($('r-pin-kinds'), [
      ['client', num(r.pins.client)],
      ['request_state', num(r.pins.request_state)],
      ['task', num(r.pins.task)],
      ['session', num(r.pins.session)],
      ['lost (total)', num(r.pins_lost)],
    ]);
    fillDl($('r-ring'), [
      ['members', num(r.ring_members)],
      ...Object.entries(r.route_decisions).map(([k, v]) => ['routed by ' + k, num(v)]),
    ]);
    const used = r.body_buffer.limit ? r.body_buffer.bytes / r.body_buffer.limit : 0;
    setText('r-body', bytes(r.body_buffer.bytes) + ' of ' + bytes(r.body_buffer.limit) + ' (' + (used * 100).toFixed(1) + '%)');
    $('r-body-bar').style.width = Math.min(100, used * 100).toFixed(1) + '%';
    const last = r.config_reloads.last;
    fillDl($('r-reloads'), [
      ['ok', num(r.config_reloads.ok)],
      ['error', num(r.config_reloads.error)],
      ['last', last ? last.result + ', ' + ago(last.at_ms, now) : 'none since start'],
    ]);
    histogram($('r-rounds'), r.rounds_per_call);
    const body = $('r-errors').tBodies[0];
    body.replaceChildren();
    const errors = Object.entries(r.errors).filter(([, n]) => n > 0).sort((a, b) => b[1] - a[1]);
    for (const [reason, n] of errors) {
      const tr = el('tr');
      tr.append(el('td', reason), el('td', num(n), 'num'));
      body.append(tr);
    }
    $('r-errors').hidden = errors.length === 0;
    $('r-errors-none').hidden = errors.length !== 0;
  }

  function backendRow(name) {
    const tr = el('tr');
    tr.dataset.backend = name;
    const cells = {};
    for (const f of ['name', 'health', 'incarnation', 'state', 'inflight', 'connections', 'share', 'pins', 'rps', 'errors', 'actions']) {
      cells[f] = el('td', null, ['inflight', 'share'].includes(f) ? 'num' : '');
      cells[f].dataset.field = f;
      tr.append(cells[f]);
    }
    cells.nameText = el('span', name, 'name');
    cells.url = el('span', '', 'url');
    cells.name.append(cells.nameText, cells.url);
    cells.rpsCanvas = el('canvas', null, 'spark');
    cells.rpsCanvas.width = 120; cells.rpsCanvas.height = 24;
    cells.rpsText = el('span', '', 'small');
    cells.rps.append(cells.rpsCanvas, cells.rpsText);
    cells.errCanvas = el('canvas', null, 'spark');
    cells.errCanvas.width = 120; cells.errCanvas.height = 24;
    cells.errText = el('span', '', 'small');
    cells.errors.append(cells.errCanvas, cells.errText);
    cells.drain = el('button', 'Drain');
    cells.drain.type = 'button';
    cells.drain.dataset.action = 'drain';
    cells.drain.addEventListener('click', () => setDrained(name, true));
    cells.undrain = el('button', 'Undrain');
    cells.undrain.type = 'button';
    cells.undrain.dataset.action = 'undrain';
    cells.undrain.addEventListener('click', () => setDrained(name, false));
    cells.actions.append(cells.drain, cells.undrain);
    return { tr, cells };
  }

  function renderBackends(list, access, now) {
    const body = $('backend-table').tBodies[0];
    const seen = new Set();
    list.forEach((b, i) => {
      seen.add(b.name);
      let row = state.rows.get(b.name);
      if (!row) { row = backendRow(b.name); state.rows.set(b.name, row); }
      if (body.children[i] !== row.tr) body.insertBefore(row.tr, body.children[i] || null);
      const c = row.cells;
      c.url.textContent = b.url;
      c.health.replaceChildren();
      c.health.append(el('span', b.up ? 'up' : 'down', b.up ? 'up' : 'down'));
      const why = b.up
        ? (b.health.ejections ? 're-admitted by active checks' : 'never ejected')
        : 'ejected by ' + (b.health.ejected_by === 'active' ? 'active health checks' : 'failed requests (passive)');
      c.health.append(el('span', ' ' + why + ', since ' + ago(b.health.since_ms, now), 'small'));
      c.health.title = 'since ' + clock(b.health.since_ms);
      c.incarnation.textContent = '#' + b.incarnation + (b.health.ejections ? ' (' + b.health.ejections + ' ejection' + (b.health.ejections > 1 ? 's' : '') + ')' : '');
      c.state.replaceChildren();
      const st = b.removed ? 'removed, draining' : b.draining ? 'draining' : b.on_ring ? 'on ring' : 'off ring';
      c.state.append(el('span', st, b.draining ? 'draining' : ''));
      c.inflight.textContent = num(b.inflight);
      const k = b.connections;
      c.connections.textContent = k.protocol === 'http2'
        ? 'HTTP/2'
        : k.open + ' open: ' + k.idle + ' pooled, ' + k.busy + ' busy' + (k.queued ? ', ' + k.queued + ' queued' : '');
      c.share.textContent = (b.ring_share * 100).toFixed(1) + '%';
      const p = b.pins;
      c.pins.textContent = num(p.total) + (p.total ? ' (' + ['client', 'request_state', 'task', 'session'].filter((x) => p[x]).map((x) => x + ' ' + p[x]).join(', ') + ')' : '');
      c.pins.dataset.total = String(p.total);
      const s = state.series.get(b.name) || { requests: [], errors: [] };
      spark(c.rpsCanvas, s.requests, 0, '#2457a6');
      c.rpsText.textContent = num(s.requests.length ? s.requests[s.requests.length - 1] : 0) + '/s';
      const r = rates(s);
      spark(c.errCanvas, r, 1, '#c62828');
      c.errText.textContent = ((r.length ? r[r.length - 1] : 0) * 100).toFixed(1) + '%';
      c.drain.hidden = b.draining;
      c.undrain.hidden = !b.draining || b.removed;
      for (const btn of [c.drain, c.undrain]) {
        btn.title = access.change ? '' : 'read-only: ' + (access.why || 'the admin token is needed');
      }
    });
    for (const [name, row] of state.rows) {
      if (!seen.has(name)) { row.tr.remove(); state.rows.delete(name); }
    }
  }

  async function setDrained(name, drain) {
    const what = drain ? 'drain' : 'undrain';
    try {
      const resp = await fetch('/backends/' + encodeURIComponent(name) + '/' + what, {
        method: 'POST', headers: authHeaders(), cache: 'no-store',
      });
      if (resp.ok) {
        notice(what + ': ' + name + ' done');
      } else {
        const why = (await resp.text()).trim();
        notice(what + ' refused (' + resp.status + '): ' + why, true);
      }
    } catch (e) {
      notice(what + ' failed: ' + e, true);
    }
  }

  function renderQuotas(q, access) {
    $('quotas').hidden = !q;
    if (!q) return;
    setText('q-callers', num(q.callers_tracked));
    setText('q-full', q.tables_full ? q.tables_full + ' table(s) full: new callers share one entry' : 'no table full');
    const refusals = Object.entries(q.refusals).filter(([, n]) => n > 0).sort((a, b) => b[1] - a[1]);
    fillDl($('q-refusals'), refusals.length ? refusals.map(([k, n]) => [k, num(n)]) : [['none', '']]);
    setText('q-top-title', 'Callers refused most, last ' + q.window_minutes + ' minutes');
    const body = $('q-top').tBodies[0];
    body.replaceChildren();
    if (q.top_refused === null) {
      $('q-top').hidden = true;
      setText('q-top-note', 'Hidden: ' + (access.why || 'the admin token is needed') + '.');
      return;
    }
    for (const c of q.top_refused) {
      const tr = el('tr');
      tr.append(el('td', c.caller), el('td', c.quota), el('td', num(c.count), 'num'));
      body.append(tr);
    }
    $('q-top').hidden = q.top_refused.length === 0;
    setText('q-top-note', q.top_refused.length === 0 ? 'no caller refused lately'
      : q.top_refused_others ? num(q.top_refused_others) + ' more refusals of other callers' : '');
  }

  function renderAuth(a, now) {
    $('auth').hidden = !a;
    if (!a) return;
    const last = a.last_refresh;
    fillDl($('a-keys'), [
      ['loaded', a.keys_loaded ? 'yes' : 'no'],
      ['age', a.keys_age_seconds === null ? '–' : duration(a.keys_age_seconds)],
      ['refreshes ok', num(a.refreshes.ok)],
      ['refreshes failed', num(a.refreshes.error)],
      ['last refresh', last ? (last.result === 'ok' ? 'ok' : 'FAILED') + ', ' + ago(last.at_ms, now) : 'none since start'],
    ]);
    fillDl($('a-outcomes'), Object.entries(a.outcomes).map(([k, n]) => [k, num(n)]));
  }

  // The tools catalog: shown once the document has one (tools with more than one definition,
  // and which backends serve which).
  function renderCatalog(catalog) {
    $('catalog').hidden = !catalog;
    if (!catalog || !Array.isArray(catalog.tools)) return;
    const body = $('c-tools').tBodies[0];
    body.replaceChildren();
    for (const t of catalog.tools) {
      const tr = el('tr');
      const name = el('td', t.name);
      if (t.description) name.title = String(t.description);
      tr.append(name, el('td', num(t.definitions), 'num'), el('td', (t.backends || []).join(', ')));
      body.append(tr);
    }
  }

  function renderConfig(config, access) {
    const pre = $('config-text');
    pre.hidden = config === null;
    if (config !== null && pre.textContent !== config) pre.textContent = config;
    $('config-note').hidden = config !== null;
    $('config-note').textContent = config === null ? 'Hidden: ' + (access.why || 'the admin token is needed') + '.' : '';
  }

  // ---- transport: the event stream, else polling ---------------------------------------------
  function link(text, ok) {
    const l = $('link');
    l.textContent = text;
    l.className = 'pill ' + (ok ? 'live' : 'down');
  }

  function refused(status, text) {
    link(status === 401 ? 'token needed' : 'refused', false);
    notice('The router refused the status data (' + status + '): ' + text.trim(), true);
  }

  async function readStream(signal) {
    const resp = await fetch('/api/events', { headers: authHeaders(), cache: 'no-store', signal });
    if (!resp.ok) { refused(resp.status, await resp.text()); return false; }
    if (!resp.body || !resp.body.getReader) throw new Error('no streaming');
    link('live', true);
    state.to = null;
    const reader = resp.body.getReader();
    const dec = new TextDecoder();
    let buf = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return true;
      buf += dec.decode(value, { stream: true });
      let end;
      while ((end = buf.indexOf('\n\n')) >= 0) {
        const event = buf.slice(0, end);
        buf = buf.slice(end + 2);
        const data = event.split('\n').filter((l) => l.startsWith('data: ')).map((l) => l.slice(6)).join('\n');
        if (data) {
          document.body.dataset.eventBytes = String(data.length);
          if (state.to === null) document.body.dataset.firstEventBytes = String(data.length);
          render(JSON.parse(data));
          state.failures = 0;
        }
      }
    }
  }

  async function pollOnce(signal) {
    const q = state.to === null ? '' : '?since=' + state.to;
    const resp = await fetch('/api/status' + q, { headers: authHeaders(), cache: 'no-store', signal });
    if (!resp.ok) { refused(resp.status, await resp.text()); return false; }
    render(await resp.json());
    link('polling', true);
    return true;
  }

  async function run() {
    const ctl = new AbortController();
    state.abort = ctl;
    while (!ctl.signal.aborted) {
      try {
        if (state.polling) {
          await pollOnce(ctl.signal);
        } else {
          await readStream(ctl.signal);
        }
      } catch (e) {
        if (ctl.signal.aborted) return;
        state.failures++;
        link('reconnecting', false);
        // A browser or proxy that cannot stream: poll instead.
        if (String(e).includes('no streaming') || state.failures >= 3) state.polling = true;
      }
      await new Promise((r) => setTimeout(r, 1000));
    }
  }

  function reconnect() {
    if (state.abort) state.abort.abort();
    state.to = null;
    $('notice').hidden = true;
    run();
  }

  document.addEventListener('DOMContentLoaded', () => {
    $('token-save').addEventListener('click', saveToken);
    $('token-input').addEventListener('keydown', (e) => { if (e.key === 'Enter') saveToken(); });
    $('token-forget').addEventListener('click', forgetToken);
    showTokenBox();
    run();
  });
})();
