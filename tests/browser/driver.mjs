// Drives headless Chromium (Debian's /usr/bin/chromium, through playwright-core) for
// tests/external/status_page.rs: one JSON command per line on stdin, one JSON answer per line on
// stdout. The first line out is {"ready": true} once the browser runs. Exits when stdin closes.
// The browser's profile goes in the folder named by the first argument, which the caller owns
// and removes (it kills the driver when done).
//
// Every request the browser makes, every dialog (alert, confirm, prompt), every uncaught page
// error, console error and Content-Security-Policy violation is collected; {"op": "report"}
// returns them.
//
// Commands: goto {url}; wait_updates {more}; read; token {value}; forget_token;
// click {backend, action}; wait_notice {contains}; screenshot {path}; report.
import { createInterface } from 'node:readline';
import { chromium } from 'playwright-core';

const TIMEOUT = 20000;
const profile = process.argv[2];
if (!profile) throw new Error('usage: node driver.mjs PROFILE_DIR');
const seen = { requests: [], dialogs: [], pageErrors: [], consoleErrors: [], cspViolations: [] };

const context = await chromium.launchPersistentContext(profile, {
  executablePath: '/usr/bin/chromium',
  headless: true,
  args: [
    '--no-sandbox',
    '--disable-gpu',
    '--disable-background-networking',
    '--disable-component-update',
    '--no-first-run',
    '--disable-sync',
    '--headless',
  ],
  viewport: { width: 1400, height: 900 },
  deviceScaleFactor: 1,
});
context.on('request', (r) => seen.requests.push(r.url()));
const page = context.pages()[0] || (await context.newPage());
page.setDefaultTimeout(TIMEOUT);
page.on('dialog', (d) => {
  seen.dialogs.push(d.type() + ': ' + d.message());
  d.dismiss().catch(() => {});
});
page.on('pageerror', (e) => seen.pageErrors.push(String(e)));
page.on('console', (m) => {
  if (m.type() === 'error') seen.consoleErrors.push(m.text());
});
await page.addInitScript(() => {
  document.addEventListener('securitypolicyviolation', (e) => {
    (window.__csp = window.__csp || []).push(e.violatedDirective + ' ' + e.blockedURI);
  });
});

const updates = () => page.evaluate(() => Number(document.body.dataset.updates || 0));

async function waitUpdates(more) {
  const start = await updates();
  await page.waitForFunction((n) => Number(document.body.dataset.updates || 0) >= n, start + more, {
    timeout: TIMEOUT,
  });
  return { updates: await updates() };
}

// What the page shows, read off the DOM as a person would see it.
function read() {
  return page.evaluate(() => {
    const text = (id) => document.getElementById(id).textContent;
    const rows = [...document.querySelectorAll('#backend-table tbody tr')].map((tr) => {
      const cell = (f) => tr.querySelector(`[data-field="${f}"]`);
      return {
        key: tr.dataset.backend,
        name: cell('name').querySelector('.name').textContent,
        health: cell('health').textContent,
        up: cell('health').firstChild.textContent === 'up',
        state: cell('state').textContent,
        inflight: Number(cell('inflight').textContent.replace(/,/g, '')),
        pins: Number(cell('pins').dataset.total),
        pins_text: cell('pins').textContent,
        drain_hidden: tr.querySelector('[data-action="drain"]').hidden,
      };
    });
    const section = (id) => !document.getElementById(id).hidden;
    return {
      seq: Number(document.body.dataset.seq || -1),
      updates: Number(document.body.dataset.updates || 0),
      mode: text('mode'),
      link: text('link'),
      access_note: document.getElementById('access-note').hidden ? '' : text('access-note'),
      notice: document.getElementById('notice').hidden ? '' : text('notice'),
      router_pins: Number(text('r-pins').replace(/,/g, '')),
      backends: rows,
      config: document.getElementById('config-text').hidden ? null : text('config-text'),
      config_note: text('config-note'),
      quotas_shown: section('quotas'),
      top_refused: [...document.querySelectorAll('#q-top tbody tr')].map((tr) =>
        [...tr.children].map((td) => td.textContent),
      ),
      top_refused_note: text('q-top-note'),
      auth_shown: section('auth'),
      catalog_shown: section('catalog'),
      images: document.querySelectorAll('img').length,
      render_ms: Number(document.body.dataset.renderMs || 0),
      event_bytes: Number(document.body.dataset.eventBytes || 0),
      first_event_bytes: Number(document.body.dataset.firstEventBytes || 0),
      csp_violations: window.__csp || [],
      title: document.title,
    };
  });
}

async function click(backend, action) {
  const rows = await page.$$('#backend-table tbody tr');
  for (const row of rows) {
    if ((await row.evaluate((tr) => tr.dataset.backend)) === backend) {
      const button = await row.$(`button[data-action="${action}"]`);
      await button.click();
      return { clicked: true };
    }
  }
  throw new Error('no row for backend ' + JSON.stringify(backend));
}

async function handle(cmd) {
  switch (cmd.op) {
    case 'goto':
      await page.goto(cmd.url, { waitUntil: 'load' });
      await page.waitForFunction(() => Number(document.body.dataset.updates || 0) >= 1, null, { timeout: TIMEOUT });
      return { updates: await updates() };
    case 'wait_updates':
      return waitUpdates(cmd.more || 1);
    case 'read':
      return read();
    case 'token':
      await page.fill('#token-input', cmd.value);
      await page.click('#token-save');
      await page.waitForFunction(() => document.getElementById('mode').textContent === 'controls on', null, {
        timeout: TIMEOUT,
      });
      return read();
    case 'forget_token':
      await page.click('#token-forget');
      await page.waitForFunction(() => document.getElementById('mode').textContent === 'read-only', null, {
        timeout: TIMEOUT,
      });
      return read();
    case 'click':
      return click(cmd.backend, cmd.action);
    case 'wait_notice':
      await page.waitForFunction(
        (s) => {
          const n = document.getElementById('notice');
          return !n.hidden && n.textContent.includes(s);
        },
        cmd.contains,
        { timeout: TIMEOUT },
      );
      return read();
    case 'screenshot':
      await page.screenshot({ path: cmd.path, fullPage: true });
      return { written: cmd.path };
    case 'report':
      return seen;
    default:
      throw new Error('unknown op ' + cmd.op);
  }
}

function answer(v) {
  process.stdout.write(JSON.stringify(v) + '\n');
}

answer({ ready: true, version: context.browser()?.version() ?? null });
const lines = createInterface({ input: process.stdin });
for await (const line of lines) {
  if (!line.trim()) continue;
  let cmd;
  try {
    cmd = JSON.parse(line);
    answer({ ok: await handle(cmd) });
  } catch (e) {
    answer({ error: String(e && e.stack ? e.stack : e) });
  }
}
await context.close();
