// End-to-end test of the warren Viewer in a real (Debian) headless Chromium.
//
//   node crates/warren/tests/viewer/e2e.mjs --config /path/to/config.json
//
// The config names the server, four signed links (valid for projects/a, valid for
// projects/b, expired, tampered) and the fixture files to expect; see README.md. Prints
// `ok: <check>` per check, `FAIL: <check>: <detail>` and exit 1 on the first failure,
// `ALL VIEWER CHECKS PASSED` and exit 0 at the end.

import { chromium } from 'playwright-core';
import { mkdirSync, readFileSync, statSync } from 'node:fs';
import { basename, dirname, join } from 'node:path';

const OVERALL_TIMEOUT_MS = 120_000;
const STEP_TIMEOUT_MS = 15_000;
const COOKIE = 'warren_viewer';

/* ------------------------------------------------------------- plumbing */

function parseArgs(argv) {
  const at = argv.indexOf('--config');
  if (at === -1 || !argv[at + 1]) {
    console.error('usage: node e2e.mjs --config /path/to/config.json');
    process.exit(2);
  }
  return JSON.parse(readFileSync(argv[at + 1], 'utf8'));
}

const config = parseArgs(process.argv.slice(2));
const expect = config.expect || {};
const base = String(config.base).replace(/\/+$/, '');
const SECRET = expect.b_secret || 'TOP-SECRET-B';
const PDF_FILE = expect.pdf_file || '/doc.pdf';
const BIG_DIR = expect.big_dir || '/big';
const UPLOAD = { name: 'hello-upload.txt', content: 'uploaded by the browser test' };

let browser = null;
let current = 'startup';
const problems = []; // CSP violations and uncaught page errors, from every page
const watched = new WeakSet();

class CheckError extends Error {}
const fail = (detail) => {
  throw new CheckError(detail);
};
function assert(condition, detail) {
  if (!condition) fail(detail);
}

async function finish(code, line) {
  console.log(line);
  const closing = browser ? browser.close().catch(() => {}) : Promise.resolve();
  await Promise.race([closing, new Promise((resolve) => setTimeout(resolve, 5000))]);
  process.exit(code);
}

const overall = setTimeout(() => {
  finish(1, `FAIL: ${current}: overall timeout of ${OVERALL_TIMEOUT_MS / 1000} s exceeded`);
}, OVERALL_TIMEOUT_MS);

async function check(name, body) {
  current = name;
  let note;
  try {
    note = await body();
  } catch (err) {
    const detail = (err instanceof CheckError ? err.message : (err && err.stack) || String(err))
      .replace(/\x1b\[[0-9;]*m/g, ''); // Playwright's call logs carry colours
    await finish(1, `FAIL: ${name}: ${detail.split('\n').slice(0, 6).join(' | ')}`);
  }
  if (problems.length) {
    await finish(1, `FAIL: ${name}: browser reported: ${problems.join(' | ')}`);
  }
  console.log(`ok: ${name}${note ? ` (${note})` : ''}`);
}

function watch(page) {
  if (watched.has(page)) return page;
  watched.add(page);
  page.on('console', (message) => {
    const text = message.text();
    if (process.env.VIEWER_E2E_VERBOSE) console.log(`  [console ${message.type()}] ${page.url()}: ${text}`);
    if (/Refused to|Content[- ]Security[- ]Policy/i.test(text)) problems.push(`CSP on ${page.url()}: ${text}`);
  });
  page.on('pageerror', (error) => problems.push(`page error on ${page.url()}: ${error.message}`));
  return page;
}

async function newContext(options = {}) {
  const context = await browser.newContext({ acceptDownloads: true, ...options });
  context.setDefaultTimeout(STEP_TIMEOUT_MS);
  context.setDefaultNavigationTimeout(STEP_TIMEOUT_MS);
  context.on('page', watch);
  return context;
}

async function newPage(context) {
  return watch(await context.newPage());
}

const pathToHash = (path) => `#${path.split('/').map(encodeURIComponent).join('/')}`;
const treeItem = (page, path) => page.locator(`[data-testid=tree-item][data-path="${path}"]`);
const ancestorsOf = (path) => {
  const parts = path.split('/').filter(Boolean);
  return parts.slice(0, -1).map((_, i) => `/${parts.slice(0, i + 1).join('/')}`);
};

async function waitReady(page, value = '1') {
  await page.waitForFunction(() => document.body && ['1', 'error'].includes(document.body.dataset.ready));
  const ready = await page.evaluate(() => document.body.dataset.ready);
  if (ready !== value) {
    const error = await page.locator('[data-testid=error]').textContent().catch(() => '');
    fail(`body[data-ready] is "${ready}", expected "${value}" (error shown: ${JSON.stringify(error)})`);
  }
}

// Opens a link in a fresh page and waits for the Viewer to be ready.
async function openLink(context, link) {
  const page = await newPage(context);
  await page.goto(base + link);
  await page.waitForURL((url) => url.pathname === '/viewer/');
  await waitReady(page);
  return page;
}

// Waits until the content pane shows `path` (details loaded, no "Loading…").
async function waitOpen(page, path) {
  try {
    await page.waitForFunction((p) => {
      const dd = document.querySelector('[data-testid=details] dd');
      return dd && dd.textContent === p && !document.querySelector('#preview .loading');
    }, path);
  } catch {
    const shown = await page.locator('[data-testid=details] dd').first().textContent().catch(() => null);
    const error = await page.locator('[data-testid=error]').textContent().catch(() => '');
    fail(`the content pane never showed ${path} (details path: ${JSON.stringify(shown)}, error: ${JSON.stringify(error)})`);
  }
}

// Expands the file's ancestors in the tree (if needed), then clicks the file.
async function openInTree(page, path) {
  for (const dir of ancestorsOf(path)) {
    const row = treeItem(page, dir);
    await row.waitFor({ state: 'visible' });
    if ((await row.getAttribute('aria-expanded')) !== 'true') {
      await row.click();
      await page.waitForFunction((d) => {
        const r = document.querySelector(`[data-testid=tree-item][data-path="${d}"]`);
        return r && r.getAttribute('aria-expanded') === 'true' && !r.hasAttribute('aria-busy');
      }, dir);
    }
  }
  const row = treeItem(page, path);
  await row.waitFor({ state: 'visible' }).catch(() => fail(`tree item ${path} never became visible`));
  await row.click();
  await waitOpen(page, path);
}

async function downloadTo(page, trigger, name) {
  const [download] = await Promise.all([page.waitForEvent('download'), trigger()]);
  const failure = await download.failure();
  assert(!failure, `download of ${name} failed: ${failure}`);
  const target = join(config.download_dir, `${Date.now()}-${basename(download.suggestedFilename() || name)}`);
  await download.saveAs(target);
  return { target, suggested: download.suggestedFilename(), bytes: readFileSync(target) };
}

/* --------------------------------------------------------------- checks */

async function main() {
  mkdirSync(config.download_dir, { recursive: true });
  browser = await chromium.launch({
    executablePath: config.chromium || '/usr/bin/chromium',
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
      '--disable-component-update', '--disable-sync'],
  });

  const ctxA = await newContext({ viewport: { width: 1280, height: 800 } });
  let page;

  await check('1 open link: session page, HttpOnly cookie', async () => {
    page = await openLink(ctxA, config.link);
    const url = new URL(page.url());
    assert(url.pathname === '/viewer/', `landed on ${page.url()}`);
    assert(!url.search.includes('t=') && !page.url().includes('?t='), `URL still carries the token: ${page.url()}`);
    const session = await page.locator('[data-testid=session]').textContent();
    assert(session.includes('alice') && session.includes('projects/a'), `session shows ${JSON.stringify(session)}`);
    for (const path of [expect.text_file, `/${expect.markdown_file.split('/')[1]}`, BIG_DIR]) {
      await treeItem(page, path).waitFor({ state: 'visible' }).catch(() => fail(`tree does not list ${path}`));
    }
    const cookies = (await ctxA.cookies(`${base}/viewer/`)).filter((c) => c.name === COOKIE);
    assert(cookies.length === 1, `expected one ${COOKIE} cookie, got ${JSON.stringify(cookies)}`);
    const [cookie] = cookies;
    assert(cookie.httpOnly === true, `cookie not HttpOnly: ${JSON.stringify(cookie)}`);
    assert(cookie.sameSite === 'Strict', `cookie sameSite ${cookie.sameSite}`);
    assert(cookie.path === '/viewer', `cookie path ${cookie.path}`);
    const documentCookie = await page.evaluate(() => document.cookie);
    assert(!documentCookie.includes(COOKIE), `document.cookie exposes the session: ${documentCookie}`);
  });

  await check('2 tree browsing: sanitised Markdown preview', async () => {
    await openInTree(page, expect.markdown_file);
    const h1 = page.locator('[data-testid=preview-markdown] h1');
    await h1.waitFor({ state: 'visible' });
    const heading = (await h1.textContent()).trim();
    assert(heading === expect.markdown_heading, `h1 is ${JSON.stringify(heading)}`);
    const scripts = await page.locator('#preview script, [data-testid=preview-markdown] script').count();
    assert(scripts === 0, `${scripts} script element(s) inside the preview`);
    const handlers = await page.evaluate(() => Array.from(document.querySelectorAll('#preview *'))
      .flatMap((node) => Array.from(node.attributes).map((a) => a.name)).filter((n) => n.startsWith('on')));
    assert(handlers.length === 0, `event handler attributes in the preview: ${handlers}`);
    await page.waitForTimeout(200); // give a broken image's onerror a chance to run
    const pwned = await page.evaluate(() => typeof window.__pwned);
    assert(pwned === 'undefined', `window.__pwned is set (${pwned})`);
    const crumbs = await page.locator('[data-testid=breadcrumbs]').textContent();
    const dir = expect.markdown_file.split('/')[1];
    assert(crumbs.includes(dir), `breadcrumbs ${JSON.stringify(crumbs)} lack ${dir}`);
  });

  await check('3 text preview with line numbers and size', async () => {
    await openInTree(page, expect.text_file);
    const view = page.locator('[data-testid=preview-text]');
    await view.waitFor({ state: 'visible' });
    const text = await view.locator('.code-text').textContent();
    assert(text.includes(expect.text_content), `preview text ${JSON.stringify(text)}`);
    const gutter = (await view.locator('.gutter').textContent()).split('\n');
    assert(gutter[0] === '1' && gutter[1] === '2', `line numbers ${JSON.stringify(gutter)}`);
    const size = expect.text_size ?? (expect.download_file === expect.text_file
      ? Buffer.byteLength(expect.download_content) : null);
    if (size !== null) {
      const details = await page.locator('[data-testid=details]').textContent();
      assert(details.includes(`${size} bytes`), `details ${JSON.stringify(details)} lack "${size} bytes"`);
      return `${size} bytes`;
    }
    return undefined;
  });

  await check('4 image preview', async () => {
    await openInTree(page, expect.image_file);
    const image = page.locator('[data-testid=preview-image]');
    await image.waitFor({ state: 'visible' });
    await page.waitForFunction(() => {
      const img = document.querySelector('[data-testid=preview-image]');
      return img && img.complete;
    });
    const width = await image.evaluate((img) => img.naturalWidth);
    assert(width > 0, 'the image did not load (naturalWidth 0)');
    return `naturalWidth ${width}`;
  });

  await check('5 PDF preview', async () => {
    await openInTree(page, PDF_FILE);
    const frame = page.locator('[data-testid=preview-pdf]');
    await frame.waitFor({ state: 'attached' });
    const src = await frame.getAttribute('src');
    assert(src && new URL(src, base).pathname === '/viewer/api/raw', `PDF frame src ${src}`);
    const tag = await frame.evaluate((node) => node.tagName.toLowerCase());
    assert(['iframe', 'embed', 'object'].includes(tag), `PDF preview is a <${tag}>`);
    const response = await page.request.get(new URL(src, base).href);
    const headers = response.headers();
    assert(response.status() === 200, `GET ${src}: HTTP ${response.status()}`);
    assert(headers['content-type'] === 'application/pdf', `PDF served as ${headers['content-type']}`);
    assert((headers['content-disposition'] || '').startsWith('inline'), `PDF disposition ${headers['content-disposition']}`);
    assert((await response.body()).subarray(0, 5).toString() === '%PDF-', 'the raw PDF does not start with %PDF-');
    await page.waitForTimeout(500); // let the frame load; any CSP complaint shows up in the console
  });

  await check('6 active content is never rendered', async () => {
    await openInTree(page, expect.html_file);
    await page.locator('[data-testid=preview-none]').waitFor({ state: 'visible' });
    assert(await page.locator('#preview iframe, #preview script').count() === 0, 'HTML rendered in the preview');
    const rawUrl = `${base}/viewer/api/raw?path=${expect.html_file}`;
    const response = await page.request.get(rawUrl);
    assert(response.status() === 200, `GET raw ${expect.html_file}: HTTP ${response.status()}`);
    const headers = response.headers();
    assert((headers['content-disposition'] || '').startsWith('attachment'),
      `content-disposition ${JSON.stringify(headers['content-disposition'])}`);
    assert((headers['content-security-policy'] || '').startsWith('sandbox'),
      `content-security-policy ${JSON.stringify(headers['content-security-policy'])}`);
    assert(!/^text\/html/i.test(headers['content-type'] || ''), `content-type ${headers['content-type']}`);
    assert(headers['x-content-type-options'] === 'nosniff', `x-content-type-options ${headers['x-content-type-options']}`);

    const tab = await newPage(ctxA);
    const downloaded = tab.waitForEvent('download', { timeout: 5000 }).then((d) => d, () => null);
    let outcome = 'navigated';
    try {
      await tab.goto(rawUrl);
    } catch (err) {
      if (/Download is starting|net::ERR_ABORTED/.test(err.message)) outcome = 'download';
      else throw err;
    }
    const download = await downloaded;
    if (download) {
      outcome = 'download';
      await download.delete().catch(() => {});
    }
    const pwned = await tab.evaluate(() => window.__pwned);
    const title = await tab.title();
    assert(pwned !== 3, 'the raw HTML ran its script (window.__pwned === 3)');
    assert(title !== 'pwned', 'the raw HTML ran its script (title "pwned")');
    await tab.close();
    return `direct navigation → ${outcome}`;
  });

  await check('7 download a file', async () => {
    await openInTree(page, expect.download_file);
    const { bytes, suggested } = await downloadTo(page, () => page.locator('[data-testid=download]').click(),
      basename(expect.download_file));
    assert(bytes.toString('utf8') === expect.download_content,
      `downloaded ${JSON.stringify(bytes.toString('utf8'))}, expected ${JSON.stringify(expect.download_content)}`);
    return `${suggested}, ${bytes.length} bytes`;
  });

  await check('8 upload from the browser', async () => {
    await page.setInputFiles('[data-testid=upload-input]', {
      name: UPLOAD.name, mimeType: 'text/plain', buffer: Buffer.from(UPLOAD.content),
    });
    const status = page.locator('[data-testid=upload-status]');
    const outcome = () => page.waitForFunction(() => {
      const text = document.querySelector('[data-testid=upload-status]').textContent;
      if (/uploaded/.test(text)) return 'uploaded';
      return document.querySelector('[data-testid=upload-overwrite]') ? 'exists' : false;
    }).then((handle) => handle.jsonValue(), async () => fail(`upload status: ${JSON.stringify(await status.textContent())}`));
    // Against a server that already has the file (a rerun), the page offers to overwrite it.
    if ((await outcome()) === 'exists') {
      await page.locator('[data-testid=upload-overwrite]').click();
      assert((await outcome()) === 'uploaded', 'overwriting the earlier upload failed');
    }
    await treeItem(page, '/uploads').waitFor({ state: 'visible' }).catch(() => fail('tree does not show uploads'));
    // The page expands uploads/ itself once its refresh after the upload is done. Until
    // then a click of ours could land before that expansion and be undone by it (or the
    // other way round), the row collapsing for good: wait for the page's own.
    await page.waitForFunction(() => {
      const r = document.querySelector('[data-testid=tree-item][data-path="/uploads"]');
      return r && r.getAttribute('aria-expanded') === 'true' && !r.hasAttribute('aria-busy');
    }).catch(() => fail('the page never expanded uploads/ after the upload'));
    await openInTree(page, `/uploads/${UPLOAD.name}`);
    const view = page.locator('[data-testid=preview-text]');
    await view.waitFor({ state: 'visible' });
    const text = await view.locator('.code-text').textContent();
    assert(text.includes(UPLOAD.content), `uploaded file previews as ${JSON.stringify(text)}`);
    return (await status.textContent()).trim();
  });

  await check('9 artifacts panel and download', async () => {
    const panel = page.locator('[data-testid=artifacts]');
    await panel.scrollIntoViewIfNeeded();
    const item = panel.locator('[data-testid=artifact]', { hasText: expect.artifact_name });
    await item.first().waitFor({ state: 'visible' }).catch(async () => {
      fail(`no artifact ${expect.artifact_name}; panel shows ${JSON.stringify(await panel.textContent())}`);
    });
    const link = item.first().locator('a[href]');
    assert(await link.count() === 1, 'the artifact has no download link');
    const href = await link.getAttribute('href');
    const { bytes, suggested } = await downloadTo(page, () => link.click(), expect.artifact_name);
    assert(bytes.length > 0, 'the artifact download is empty');
    assert(suggested === expect.artifact_name, `artifact downloads as ${suggested}`);
    return `${new URL(href, base).pathname}, ${bytes.length} bytes`;
  });

  await check('10 large directory is paged', async () => {
    const row = treeItem(page, BIG_DIR);
    const listingItems = page.locator(`[data-testid=dir-listing][data-path="${BIG_DIR}"] [data-testid=listing-item]`);
    const started = Date.now();
    await row.click();
    await listingItems.first().waitFor({ state: 'visible' });
    const elapsed = Date.now() - started;
    console.log(`big-directory listing visible ${elapsed} ms after the click`);
    const first = await listingItems.count();
    const more = page.locator('[data-testid=show-more]');
    await more.waitFor({ state: 'visible' }).catch(() => fail(`no show-more after ${first} entries`));
    await more.click();
    try {
      await page.waitForFunction(([sel, n]) => document.querySelectorAll(sel).length > n,
        [`[data-testid=dir-listing][data-path="${BIG_DIR}"] [data-testid=listing-item]`, first]);
    } catch {
      fail(`show-more did not load more entries (still ${await listingItems.count()})`);
    }
    const after = await listingItems.count();
    const footer = await page.locator('.listing-footer .note').textContent().catch(() => '');
    return `${first} entries, then ${after} after show-more; ${footer.trim()}; first page in ${elapsed} ms`;
  });

  await check('11 keyboard navigation in the tree', async () => {
    await openInTree(page, expect.text_file);
    const tree = page.locator('[data-testid=tree]');
    await tree.focus();
    const selected = () => page.evaluate(() => {
      const row = document.querySelector('[data-testid=tree] .tree-row[aria-selected="true"]');
      return row ? { path: row.dataset.path || null, kind: row.dataset.kind || null } : null;
    });
    const start = await selected();
    assert(start && start.path === expect.text_file, `selection starts at ${JSON.stringify(start)}`);
    await page.keyboard.press('ArrowDown');
    const down = await selected();
    assert(down && down.path !== start.path, `ArrowDown did not move the selection (${JSON.stringify(down)})`);
    await page.keyboard.press('ArrowUp');
    const up = await selected();
    assert(up && up.path === start.path, `ArrowUp went to ${JSON.stringify(up)}, expected ${start.path}`);
    // Move down to the next file and open it with Enter.
    let target = up;
    for (let i = 0; i < 20; i += 1) {
      await page.keyboard.press('ArrowDown');
      target = await selected();
      if (target && target.kind === 'file' && target.path !== start.path) break;
    }
    assert(target && target.kind === 'file' && target.path !== start.path, `no file below ${start.path} to open`);
    await page.keyboard.press('Enter');
    await waitOpen(page, target.path);
    const hash = await page.evaluate(() => window.location.hash);
    assert(hash === pathToHash(target.path), `hash ${hash} after Enter on ${target.path}`);
    const preview = await page.locator('#preview').evaluate((node) => node.children.length);
    assert(preview > 0, `Enter on ${target.path} left the preview empty`);
    return `${start.path} → ↓ ${down.path} → ↑ ${up.path} → Enter opened ${target.path}`;
  });

  await check('12 screenshot', async () => {
    await page.setViewportSize({ width: 1280, height: 800 });
    const big = treeItem(page, BIG_DIR); // fold the 2,000 entries away for a readable picture
    if ((await big.getAttribute('aria-expanded')) === 'true') {
      await big.click();
      await page.waitForFunction((d) => document.querySelector(`[data-testid=tree-item][data-path="${d}"]`)
        .getAttribute('aria-expanded') === 'false', BIG_DIR);
    }
    await openInTree(page, expect.markdown_file);
    await page.locator('[data-testid=preview-markdown] h1').waitFor({ state: 'visible' });
    await page.locator('[data-testid=preview-markdown] h1').scrollIntoViewIfNeeded();
    mkdirSync(dirname(config.screenshot), { recursive: true });
    await page.screenshot({ path: config.screenshot, fullPage: false });
    const size = statSync(config.screenshot).size;
    assert(size > 1000, `screenshot is only ${size} bytes`);
    return `${config.screenshot}, ${size} bytes`;
  });

  await check('13a expired link is refused (401), no cookie', async () => {
    const context = await newContext();
    const tab = await newPage(context);
    const response = await tab.goto(base + config.expired_link);
    assert(response && response.status() === 401, `HTTP ${response && response.status()}`);
    await tab.locator('[data-testid=error]').waitFor({ state: 'visible' });
    const message = (await tab.locator('[data-testid=error]').textContent()).trim();
    await tab.waitForTimeout(300); // a refresh to the page, if any, would have started
    assert(new URL(tab.url()).pathname === '/viewer/open', `moved on to ${tab.url()}`);
    const cookies = (await context.cookies()).filter((c) => c.name === COOKIE);
    assert(cookies.length === 0, `a ${COOKIE} cookie was set: ${JSON.stringify(cookies)}`);
    await context.close();
    return message;
  });

  await check('13b tampered link is refused (403), no cookie', async () => {
    const context = await newContext();
    const tab = await newPage(context);
    const response = await tab.goto(base + config.tampered_link);
    assert(response && response.status() === 403, `HTTP ${response && response.status()}`);
    await tab.locator('[data-testid=error]').waitFor({ state: 'visible' });
    const message = (await tab.locator('[data-testid=error]').textContent()).trim();
    await tab.waitForTimeout(300);
    assert(new URL(tab.url()).pathname === '/viewer/open', `moved on to ${tab.url()}`);
    const cookies = (await context.cookies()).filter((c) => c.name === COOKIE);
    assert(cookies.length === 0, `a ${COOKIE} cookie was set: ${JSON.stringify(cookies)}`);
    await context.close();
    return message;
  });

  await check('13c a link for another workdir shows only that workdir', async () => {
    const context = await newContext();
    const tab = await openLink(context, config.other_link);
    const session = await tab.locator('[data-testid=session]').textContent();
    assert(session.includes('projects/b'), `session shows ${JSON.stringify(session)}`);
    await treeItem(tab, expect.b_only_file).waitFor({ state: 'visible' })
      .catch(() => fail(`tree does not list ${expect.b_only_file}`));
    assert(await treeItem(tab, expect.text_file).count() === 0, `tree of projects/b lists ${expect.text_file}`);
    // The marker the next check looks for really is in that file.
    const own = await tab.request.get(`${base}/viewer/api/raw?path=${expect.b_only_file}`);
    assert(own.status() === 200 && (await own.text()).includes(SECRET),
      `projects/b's own raw ${expect.b_only_file}: HTTP ${own.status()}, no ${SECRET}`);
    await context.close();
  });

  await check('13d path escapes from projects/a are refused', async () => {
    const name = expect.b_only_file.replace(/^\//, '');
    const attempts = [`/../b/${name}`, `%2e%2e/b/${name}`, `/..%2fb%2f${name}`, `..%2F..%2Fb%2F${name}`];
    const seen = [];
    for (const attempt of attempts) {
      for (const endpoint of ['raw', 'preview']) {
        const response = await page.request.get(`${base}/viewer/api/${endpoint}?path=${attempt}`);
        const body = await response.text();
        assert(response.status() >= 400 && response.status() < 500, `${endpoint} ${attempt}: HTTP ${response.status()}`);
        assert(!body.includes(SECRET), `${endpoint} ${attempt}: body contains the secret`);
        if (endpoint === 'raw') seen.push(`${attempt} → ${response.status()}`);
      }
    }
    const tab = await newPage(ctxA);
    await tab.goto(`${base}/viewer/#/../b/${name}`);
    await waitReady(tab);
    await tab.locator('[data-testid=error]').waitFor({ state: 'visible' })
      .catch(() => fail('navigating to #/../b/… shows no error'));
    const text = await tab.locator('body').innerText();
    assert(!text.includes(SECRET), 'the page shows the secret');
    assert(await tab.locator('[data-testid=preview-text]').count() === 0, 'a text preview is shown');
    const error = (await tab.locator('[data-testid=error]').textContent()).trim();
    await tab.close();
    return `${seen.join(', ')}; hash route error: ${error}`;
  });

  await check('14 phone layout', async () => {
    const context = await newContext({ viewport: { width: 390, height: 844 }, isMobile: true, hasTouch: true });
    const phone = await openLink(context, config.link);
    const overflow = () => phone.evaluate(() => document.documentElement.scrollWidth);
    const before = await overflow();
    assert(before <= 391, `horizontal overflow: scrollWidth ${before} > 390`);
    const tree = treeItem(phone, expect.text_file);
    await tree.scrollIntoViewIfNeeded();
    assert(await tree.isVisible(), 'the tree is not reachable');
    const box = await tree.boundingBox();
    assert(box && box.x >= 0 && box.x < 390 && box.width > 0, `tree item off screen: ${JSON.stringify(box)}`);
    await tree.tap();
    await waitOpen(phone, expect.text_file);
    const preview = phone.locator('[data-testid=preview-text]');
    await preview.scrollIntoViewIfNeeded();
    assert(await preview.isVisible(), 'the preview is not reachable');
    const previewBox = await preview.boundingBox();
    assert(previewBox && previewBox.x >= 0 && previewBox.x + previewBox.width <= 391,
      `preview outside the screen: ${JSON.stringify(previewBox)}`);
    const after = await overflow();
    assert(after <= 391, `horizontal overflow with a preview: scrollWidth ${after} > 390`);
    await context.close();
    return `scrollWidth ${before}/${after}`;
  });

  await ctxA.close();
  clearTimeout(overall);
  await finish(0, 'ALL VIEWER CHECKS PASSED');
}

main().catch((err) => finish(1, `FAIL: ${current}: ${(err && err.stack) || err}`));
