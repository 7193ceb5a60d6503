// warren viewer: browse one agent workdir (files and artifacts).
//
// No dependencies. File names, file contents and most server strings are
// attacker-controlled, so every node is built with createElement/textContent;
// the only HTML parsed from a string is the server's already-sanitised Markdown.

const API = '/viewer/api';
const PAGE_SIZE = 500;
const SVG_NS = 'http://www.w3.org/2000/svg';
const RASTER_IMAGE = /\.(png|jpe?g|gif|webp|avif|bmp|ico)$/i;
const HAS_SCHEME = /^[a-z][a-z0-9+.-]*:/i;
const SAFE_LINK_SCHEME = /^(https?|mailto):/i;
const EXPIRED_MESSAGE = 'This link has expired or is invalid; ask for a new one.';

const $ = (selector) => document.querySelector(selector);

const el = {
  app: $('#app'),
  session: $('[data-testid=session]'),
  error: $('[data-testid=error]'),
  tree: $('[data-testid=tree]'),
  filter: $('[data-testid=filter]'),
  filterStatus: $('#filter-status'),
  refresh: $('#refresh'),
  content: $('#content'),
  breadcrumbs: $('[data-testid=breadcrumbs]'),
  details: $('[data-testid=details]'),
  actions: $('#actions'),
  preview: $('#preview'),
  uploadInput: $('[data-testid=upload-input]'),
  uploadStatus: $('[data-testid=upload-status]'),
  artifacts: $('[data-testid=artifacts]'),
  artifactsRefresh: $('#artifacts-refresh'),
  dropzone: $('#dropzone'),
};

const state = {
  session: null,
  dirs: new Map(), // dir path → listing (the entries loaded so far)
  expanded: new Set(), // dir paths expanded in the tree
  selected: null, // tree cursor (a path)
  open: null, // { path, kind } shown in the content pane
  filterDir: '/', // the directory the filter box applies to
  listing: null, // { path, tbody, footer } while the content pane lists a directory
  navToken: 0, // discards responses of superseded navigations
  controller: null,
  dead: false, // the session is gone and the UI has been replaced
};

let rowCounter = 0;

/* ------------------------------------------------------------------ DOM */

function h(tag, props = {}, children = []) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (value === null || value === undefined || value === false) continue;
    if (key === 'class') node.className = value;
    else if (key === 'text') node.textContent = value;
    else if (key === 'dataset') Object.assign(node.dataset, value);
    else if (key === 'onclick') node.addEventListener('click', value);
    else node.setAttribute(key, value === true ? '' : String(value));
  }
  for (const child of [].concat(children)) {
    if (child !== null && child !== undefined && child !== false) node.append(child);
  }
  return node;
}

const ICON_PATHS = new Map([
  ['dir', 'M3 7.5A2.5 2.5 0 0 1 5.5 5H9l2 2h7.5A2.5 2.5 0 0 1 21 9.5v7a2.5 2.5 0 0 1-2.5 2.5h-13A2.5 2.5 0 0 1 3 16.5z'],
  ['file', 'M6.5 3H14l5 5v10.5a2.5 2.5 0 0 1-2.5 2.5h-10A2.5 2.5 0 0 1 4 18.5v-13A2.5 2.5 0 0 1 6.5 3zM14 3v5h5'],
  ['symlink', 'M9 15l6-6M10 6.5l1.5-1.5a4 4 0 0 1 5.7 5.7L15.5 12M14 17.5L12.5 19a4 4 0 0 1-5.7-5.7L8.5 12'],
  ['other', 'M12 3a9 9 0 1 0 0 18a9 9 0 1 0 0-18zM12 8v5M12 16v.5'],
]);

function icon(kind) {
  const name = ICON_PATHS.has(kind) ? kind : 'other';
  const svg = document.createElementNS(SVG_NS, 'svg');
  svg.setAttribute('viewBox', '0 0 24 24');
  svg.setAttribute('class', `icon icon-${name}`);
  svg.setAttribute('aria-hidden', 'true');
  const path = document.createElementNS(SVG_NS, 'path');
  path.setAttribute('d', ICON_PATHS.get(name));
  svg.append(path);
  return svg;
}

/* ----------------------------------------------------------- formatting */

const dateFormat = new Intl.DateTimeFormat(undefined, { dateStyle: 'medium', timeStyle: 'short' });
const relativeFormat = new Intl.RelativeTimeFormat(undefined, { numeric: 'auto' });

function formatBytes(bytes) {
  if (!Number.isFinite(bytes)) return '—';
  if (bytes < 1024) return `${bytes} B`;
  const units = ['KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
  let value = bytes / 1024;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${value < 10 ? value.toFixed(1) : Math.round(value)} ${units[unit]}`;
}

function describeSize(bytes) {
  if (!Number.isFinite(bytes)) return 'Unknown';
  const exact = `${bytes} ${bytes === 1 ? 'byte' : 'bytes'}`;
  return bytes < 1024 ? exact : `${formatBytes(bytes)} (${exact})`;
}

function formatTime(iso) {
  const date = new Date(iso);
  return Number.isNaN(date.getTime()) ? String(iso) : dateFormat.format(date);
}

function relativeTime(date) {
  const seconds = Math.round((date.getTime() - Date.now()) / 1000);
  const steps = [['year', 31536000], ['month', 2592000], ['day', 86400], ['hour', 3600], ['minute', 60]];
  for (const [unit, size] of steps) {
    if (Math.abs(seconds) >= size) return relativeFormat.format(Math.round(seconds / size), unit);
  }
  return relativeFormat.format(seconds, 'second');
}

function timeElement(iso) {
  if (!iso) return '—';
  return h('time', { datetime: iso, title: iso, text: formatTime(iso) });
}

function describeType(meta) {
  const kinds = { dir: 'Folder', file: 'File', symlink: 'Symbolic link', other: 'Special file' };
  const kind = kinds[meta.kind] || String(meta.kind || 'Unknown');
  return meta.media_type ? `${kind} · ${meta.media_type}` : kind;
}

/* ---------------------------------------------------------------- paths */

// Paths are workdir-relative with a leading slash; "/" is the workdir itself.
function normalizePath(value) {
  const parts = [];
  for (const segment of String(value || '').split('/')) {
    if (segment === '' || segment === '.') continue;
    if (segment === '..') parts.pop();
    else parts.push(segment);
  }
  return `/${parts.join('/')}`;
}

const parentPath = (path) => (path === '/' ? '/' : normalizePath(path.slice(0, path.lastIndexOf('/'))));
const baseName = (path) => path.slice(path.lastIndexOf('/') + 1);
const depth = (path) => (path === '/' ? 0 : path.split('/').length - 1);
const isInside = (path, dir) => path !== dir && (dir === '/' || path.startsWith(`${dir}/`));

function ancestorsOf(path) {
  const result = [];
  for (let dir = parentPath(path); dir !== '/'; dir = parentPath(dir)) result.unshift(dir);
  return result;
}

function safeDecode(text) {
  try {
    return decodeURIComponent(text);
  } catch {
    return text;
  }
}

const pathToHash = (path) => `#${path.split('/').map(encodeURIComponent).join('/')}`;
const hashToPath = (hash) => normalizePath(hash.replace(/^#/, '').split('/').map(safeDecode).join('/'));

// Links inside Markdown are relative to the document, or absolute within the workdir.
function resolveWorkdirLink(href, baseDir) {
  const target = safeDecode(href.split(/[?#]/)[0]);
  return normalizePath(target.startsWith('/') ? target : `${baseDir}/${target}`);
}

function safeLinkUrl(value) {
  if (typeof value !== 'string' || value === '') return null;
  try {
    const url = new URL(value, window.location.href);
    return url.protocol === 'http:' || url.protocol === 'https:' ? url.href : null;
  } catch {
    return null;
  }
}

const rootLabel = () => (state.session && state.session.workdir) || 'workdir';

/* ------------------------------------------------------------------ API */

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.name = 'ApiError';
    this.status = status;
    this.code = code;
  }
}

function apiUrl(endpoint, params = {}) {
  const query = Object.entries(params)
    .map(([key, value]) => `${encodeURIComponent(key)}=${encodeURIComponent(value)}`)
    .join('&');
  return `${API}/${endpoint}${query ? `?${query}` : ''}`;
}

const rawUrl = (path, download = false) => apiUrl('raw', download ? { path, download: 1 } : { path });

function parseResponse(status, body) {
  let data = null;
  try {
    data = body ? JSON.parse(body) : null;
  } catch {
    data = null;
  }
  if (status >= 200 && status < 300) {
    if (data === null || typeof data !== 'object') {
      throw new ApiError(status, 'bad_response', 'The server sent an unexpected response.');
    }
    return data;
  }
  const error = (data && data.error) || {};
  throw new ApiError(status, error.code || `http_${status}`, error.message || `Request failed (HTTP ${status}).`);
}

async function getJson(url, signal) {
  let response;
  try {
    response = await fetch(url, { credentials: 'same-origin', signal, headers: { Accept: 'application/json' } });
  } catch (err) {
    if (err.name === 'AbortError') throw err;
    throw new ApiError(0, 'network', 'Could not reach warren. Check the connection and try again.');
  }
  return parseResponse(response.status, await response.text());
}

// XMLHttpRequest rather than fetch: fetch cannot report upload progress.
function postUpload(file, overwrite, onProgress) {
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    xhr.open('POST', apiUrl('upload', { name: file.name, overwrite: overwrite ? 1 : 0 }));
    xhr.setRequestHeader('X-Warren-Viewer', '1');
    xhr.setRequestHeader('Content-Type', 'application/octet-stream');
    xhr.upload.addEventListener('progress', (event) => {
      if (event.lengthComputable) onProgress(event.loaded, event.total);
    });
    xhr.addEventListener('load', () => {
      try {
        resolve(parseResponse(xhr.status, xhr.responseText));
      } catch (err) {
        reject(err);
      }
    });
    xhr.addEventListener('error', () => reject(new ApiError(0, 'network', 'The upload failed: could not reach warren or read the file.')));
    xhr.addEventListener('abort', () => reject(new ApiError(0, 'aborted', 'The upload was cancelled.')));
    xhr.send(file);
  });
}

/* ------------------------------------------------------------- listings */

function newListing(path) {
  return { path, entries: [], byPath: new Map(), total: 0, more: false, capped: false, loaded: false, ready: null, loadingMore: null };
}

function addPage(listing, page) {
  const added = [];
  for (const raw of page.entries || []) {
    const entry = { ...raw, path: normalizePath(raw.path || `${listing.path}/${raw.name}`) };
    if (listing.byPath.has(entry.path)) continue; // the directory may change between pages
    listing.byPath.set(entry.path, entry);
    listing.entries.push(entry);
    added.push(entry);
  }
  const total = Number(page.total);
  listing.total = Number.isFinite(total) ? Math.max(total, listing.entries.length) : listing.entries.length;
  // Requiring progress guards against a "Show more" that never ends.
  const remaining = Number.isFinite(total) ? listing.entries.length < total : Boolean(page.truncated);
  listing.more = remaining && added.length > 0;
  // Everything is loaded yet the server says truncated: it stopped reading a huge directory.
  listing.capped = Boolean(page.truncated) && !listing.more;
  listing.loaded = true;
  return added;
}

const fetchPage = (path, offset, limit) => getJson(apiUrl('list', { path, offset, limit }));

function ensureListing(path) {
  const existing = state.dirs.get(path);
  if (existing) return existing.ready;
  const listing = newListing(path);
  listing.ready = fetchPage(path, 0, PAGE_SIZE).then(
    (page) => {
      addPage(listing, page);
      return listing;
    },
    (err) => {
      state.dirs.delete(path);
      throw err;
    },
  );
  state.dirs.set(path, listing);
  return listing.ready;
}

const loadedListing = (path) => {
  const listing = state.dirs.get(path);
  return listing && listing.loaded ? listing : null;
};

function findEntry(path) {
  const listing = loadedListing(parentPath(path));
  return listing ? listing.byPath.get(path) : undefined;
}

function loadMore(path) {
  const listing = loadedListing(path);
  if (!listing || !listing.more) return Promise.resolve();
  if (listing.loadingMore) return listing.loadingMore;
  setMoreBusy(path, true);
  listing.loadingMore = fetchPage(path, listing.entries.length, PAGE_SIZE)
    .then((page) => {
      if (state.dirs.get(path) !== listing) return; // refreshed meanwhile
      const added = addPage(listing, page);
      appendTreeEntries(listing, added);
      appendListingEntries(listing, added);
      applyFilter();
    })
    .catch(showError)
    .finally(() => {
      listing.loadingMore = null;
      setMoreBusy(path, false);
    });
  return listing.loadingMore;
}

// Re-reads a directory, keeping as many entries as were loaded before.
async function refreshDir(path) {
  const previous = loadedListing(path);
  const limit = Math.max(PAGE_SIZE, previous ? previous.entries.length : 0);
  const page = await fetchPage(path, 0, limit);
  const listing = newListing(path);
  addPage(listing, page);
  listing.ready = Promise.resolve(listing);
  state.dirs.set(path, listing);
  rerenderTreeDir(path);
  if (state.listing && state.listing.path === path) renderListing(listing);
  applyFilter();
  return listing;
}

/* ----------------------------------------------------------------- tree */

// The tree is a flat list of rows carrying aria-level: a row's descendants are the
// rows after it with a deeper level. Flat rows keep a click on a directory landing
// on that directory rather than on one of its children.

const rowLevel = (node) => Number(node.dataset.level) || 0;
const rowFor = (path) => el.tree.querySelector(`.tree-row[data-path="${CSS.escape(path)}"]`);
const moreRowFor = (path) => el.tree.querySelector(`.tree-more[data-more-for="${CSS.escape(path)}"]`);

function treeRow(entry, level, position, setSize) {
  const isDir = entry.kind === 'dir';
  const row = h('div', {
    id: `tree-node-${++rowCounter}`,
    class: 'tree-row',
    role: 'treeitem',
    'aria-level': level,
    'aria-posinset': position,
    'aria-setsize': setSize,
    'aria-selected': String(entry.path === state.selected),
    'aria-expanded': isDir ? String(state.expanded.has(entry.path)) : null,
    title: entry.name,
    dataset: { testid: 'tree-item', path: entry.path, kind: String(entry.kind), level },
  }, [
    h('span', { class: 'twisty', 'aria-hidden': 'true' }),
    icon(entry.kind),
    h('span', { class: 'name', text: entry.name }),
  ]);
  row.style.setProperty('--level', level);
  if (state.open && entry.path === state.open.path) row.classList.add('is-open');
  if (entry.path === state.selected) el.tree.setAttribute('aria-activedescendant', row.id);
  return row;
}

const moreLabel = (listing) => `Show more (${listing.entries.length} of ${listing.total})`;

function moreRow(listing, level) {
  const row = h('div', {
    id: `tree-node-${++rowCounter}`,
    class: 'tree-row tree-more',
    role: 'treeitem',
    'aria-level': level,
    'aria-selected': 'false',
    dataset: { testid: 'tree-show-more', moreFor: listing.path, level },
  }, [h('span', { class: 'twisty', 'aria-hidden': 'true' }), h('span', { class: 'name', text: moreLabel(listing) })]);
  row.style.setProperty('--level', level);
  return row;
}

function noteRow(text, level) {
  const row = h('div', { class: 'tree-note', role: 'none', dataset: { level }, text });
  row.style.setProperty('--level', level);
  return row;
}

function appendBranch(fragment, entry, level, position, setSize) {
  fragment.append(treeRow(entry, level, position, setSize));
  if (entry.kind === 'dir' && state.expanded.has(entry.path)) renderChildren(entry.path, level + 1, fragment);
}

function renderChildren(dirPath, level, fragment = document.createDocumentFragment()) {
  const listing = loadedListing(dirPath);
  if (!listing) return fragment;
  if (!listing.entries.length) fragment.append(noteRow('Empty folder', level));
  listing.entries.forEach((entry, index) => appendBranch(fragment, entry, level, index + 1, listing.total));
  if (listing.more) fragment.append(moreRow(listing, level));
  return fragment;
}

function removeDescendants(row) {
  const level = rowLevel(row);
  while (row.nextElementSibling && rowLevel(row.nextElementSibling) > level) row.nextElementSibling.remove();
}

const childrenRendered = (row) => Boolean(row.nextElementSibling) && rowLevel(row.nextElementSibling) > rowLevel(row);

function rerenderTreeDir(path) {
  if (path === '/') {
    el.tree.replaceChildren(renderChildren('/', 1));
    return;
  }
  const row = rowFor(path);
  if (!row || !state.expanded.has(path)) return;
  removeDescendants(row);
  row.after(renderChildren(path, rowLevel(row) + 1));
}

function appendTreeEntries(listing, added) {
  const more = moreRowFor(listing.path);
  if (!more) return;
  const level = rowLevel(more);
  const fragment = document.createDocumentFragment();
  const start = listing.entries.length - added.length;
  added.forEach((entry, index) => appendBranch(fragment, entry, level, start + index + 1, listing.total));
  const firstAdded = fragment.firstElementChild;
  more.before(fragment);
  if (listing.more) {
    more.querySelector('.name').textContent = moreLabel(listing);
  } else {
    const wasSelected = more.getAttribute('aria-selected') === 'true';
    more.remove();
    if (wasSelected && firstAdded) selectRow(firstAdded);
  }
}

async function expand(path) {
  state.expanded.add(path);
  const row = rowFor(path);
  if (row) row.setAttribute('aria-expanded', 'true');
  if (!loadedListing(path)) {
    if (row) row.setAttribute('aria-busy', 'true');
    try {
      await ensureListing(path);
    } catch (err) {
      state.expanded.delete(path);
      const current = rowFor(path);
      if (current) current.setAttribute('aria-expanded', 'false');
      throw err;
    } finally {
      const current = rowFor(path);
      if (current) current.removeAttribute('aria-busy');
    }
  }
  if (!state.expanded.has(path)) return; // collapsed while loading
  const current = rowFor(path);
  if (current && !childrenRendered(current)) current.after(renderChildren(path, rowLevel(current) + 1));
  applyFilter();
}

function collapse(path) {
  state.expanded.delete(path);
  const row = rowFor(path);
  if (!row) return;
  row.setAttribute('aria-expanded', 'false');
  removeDescendants(row);
  if (state.selected && isInside(state.selected, path)) selectRow(row);
}

function toggle(path) {
  if (state.expanded.has(path)) collapse(path);
  else expand(path).catch(showError);
}

function scrollRowIntoView(row) {
  const tree = el.tree;
  const top = row.offsetTop;
  const bottom = top + row.offsetHeight;
  if (top < tree.scrollTop) tree.scrollTop = top;
  else if (bottom > tree.scrollTop + tree.clientHeight) tree.scrollTop = bottom - tree.clientHeight;
}

function clearTreeSelection() {
  for (const row of el.tree.querySelectorAll('[aria-selected="true"]')) row.setAttribute('aria-selected', 'false');
}

function selectRow(row, { scroll = true } = {}) {
  if (!row) return;
  clearTreeSelection();
  row.setAttribute('aria-selected', 'true');
  state.selected = row.dataset.path || null;
  el.tree.setAttribute('aria-activedescendant', row.id);
  if (scroll) scrollRowIntoView(row);
}

function selectPath(path) {
  const row = rowFor(path);
  if (row) {
    selectRow(row);
    return;
  }
  clearTreeSelection();
  state.selected = path;
  el.tree.removeAttribute('aria-activedescendant');
}

function markOpen(path) {
  for (const row of el.tree.querySelectorAll('.is-open')) row.classList.remove('is-open');
  const row = rowFor(path);
  if (row) row.classList.add('is-open');
}

function setMoreBusy(path, busy) {
  const row = moreRowFor(path);
  if (row) row.toggleAttribute('aria-busy', busy);
  if (state.listing && state.listing.path === path) {
    const button = state.listing.footer.querySelector('[data-testid=show-more]');
    if (button) {
      button.disabled = busy;
      button.textContent = busy ? 'Loading…' : 'Show more';
    }
  }
}

const visibleRows = () => Array.from(el.tree.querySelectorAll('.tree-row:not([hidden])'));

function activateRow(row) {
  if (row.classList.contains('tree-more')) loadMore(row.dataset.moreFor);
  else open(row.dataset.path);
}

function stepIn(row, next) {
  if (row.dataset.kind !== 'dir') return;
  if (row.getAttribute('aria-expanded') !== 'true') expand(row.dataset.path).catch(showError);
  else if (next && rowLevel(next) > rowLevel(row)) selectRow(next);
}

function stepOut(row, rows, index) {
  if (row.dataset.kind === 'dir' && row.getAttribute('aria-expanded') === 'true') {
    collapse(row.dataset.path);
    return;
  }
  const level = rowLevel(row);
  for (let i = index - 1; i >= 0; i -= 1) {
    if (rowLevel(rows[i]) < level) {
      selectRow(rows[i]);
      return;
    }
  }
}

function onTreeKeydown(event) {
  if (event.altKey || event.ctrlKey || event.metaKey) return;
  const rows = visibleRows();
  if (!rows.length) return;
  const current = el.tree.querySelector('.tree-row[aria-selected="true"]:not([hidden])');
  const index = rows.indexOf(current);
  switch (event.key) {
    case 'ArrowDown': selectRow(rows[Math.min(index + 1, rows.length - 1)]); break;
    case 'ArrowUp': selectRow(rows[Math.max(index - 1, 0)]); break;
    case 'Home': selectRow(rows[0]); break;
    case 'End': selectRow(rows[rows.length - 1]); break;
    case 'ArrowRight': if (current) stepIn(current, rows[index + 1]); break;
    case 'ArrowLeft': if (current) stepOut(current, rows, index); break;
    case 'Enter': if (current) activateRow(current); break;
    default: return;
  }
  event.preventDefault();
}

function onTreeClick(event) {
  const row = event.target.closest('.tree-row');
  if (!row) return;
  if (row.classList.contains('tree-more')) {
    selectRow(row);
    loadMore(row.dataset.moreFor);
    return;
  }
  const path = row.dataset.path;
  if (row.dataset.kind === 'dir') {
    toggle(path);
    open(path, { fromTree: true });
    return;
  }
  open(path, { fromTree: true });
  // On a phone the preview is below the tree: bring it into view.
  if (window.matchMedia('(max-width: 720px)').matches) el.content.scrollIntoView({ block: 'start' });
}

// Focus arrives on mousedown too: scrolling here could move another row under the
// pointer before the click lands.
function onTreeFocus() {
  const selected = el.tree.querySelector('.tree-row[aria-selected="true"]:not([hidden])');
  if (!selected) selectRow(visibleRows()[0], { scroll: false });
}

/* --------------------------------------------------------------- filter */

const matchesFilter = (name, needle) => !needle || name.toLowerCase().includes(needle);
const filterNeedle = () => el.filter.value.trim().toLowerCase();

function setFilterDir(dir) {
  if (dir === state.filterDir) return;
  state.filterDir = dir;
  el.filter.value = '';
  updateFilterPlaceholder();
}

function updateFilterPlaceholder() {
  const dir = state.filterDir;
  el.filter.placeholder = `Filter ${dir === '/' ? baseName(normalizePath(rootLabel())) : baseName(dir)}/ (/)`;
}

function filterTreeRows(dir, needle) {
  for (const node of el.tree.querySelectorAll('[data-filtered]')) {
    node.hidden = false;
    delete node.dataset.filtered;
  }
  if (!needle) return;
  const childLevel = depth(dir) + 1;
  const dirRow = dir === '/' ? null : rowFor(dir);
  let node = dir === '/' ? el.tree.firstElementChild : dirRow && dirRow.nextElementSibling;
  let hideBranch = false;
  for (; node && rowLevel(node) >= childLevel; node = node.nextElementSibling) {
    if (rowLevel(node) === childLevel) {
      hideBranch = node.dataset.testid === 'tree-item' && !matchesFilter(baseName(node.dataset.path), needle);
    }
    if (hideBranch) {
      node.hidden = true;
      node.dataset.filtered = '1';
    }
  }
}

function filterListingRows(dir, needle) {
  if (!state.listing || state.listing.path !== dir) return;
  for (const row of state.listing.tbody.rows) row.hidden = !matchesFilter(baseName(row.dataset.path), needle);
}

function updateFilterStatus(dir, needle) {
  const listing = loadedListing(dir);
  if (!needle || !listing) {
    el.filterStatus.textContent = '';
    return;
  }
  const count = listing.entries.filter((entry) => matchesFilter(entry.name, needle)).length;
  const scope = listing.more ? 'loaded entries' : 'entries';
  el.filterStatus.textContent = `${count} of ${listing.entries.length} ${scope} match`;
}

function applyFilter() {
  const needle = filterNeedle();
  filterTreeRows(state.filterDir, needle);
  filterListingRows(state.filterDir, needle);
  updateFilterStatus(state.filterDir, needle);
}

function focusFirstMatch() {
  const dir = state.filterDir;
  const row = visibleRows().find((node) => node.dataset.path && parentPath(node.dataset.path) === dir);
  el.tree.focus();
  if (row) selectRow(row);
}

function onFilterKeydown(event) {
  if (event.key === 'Escape') {
    event.preventDefault();
    el.filter.value = '';
    applyFilter();
    el.tree.focus();
  } else if (event.key === 'ArrowDown' || event.key === 'Enter') {
    event.preventDefault();
    focusFirstMatch();
  }
}

/* -------------------------------------------------------------- content */

function renderBreadcrumbs(path) {
  const crumbs = [['/', rootLabel()], ...ancestorsOf(path).map((dir) => [dir, baseName(dir)])];
  if (path !== '/') crumbs.push([path, baseName(path)]);
  const items = crumbs.map(([target, label], index) => {
    const current = index === crumbs.length - 1;
    return h('li', {}, h('a', { href: pathToHash(target), 'aria-current': current ? 'page' : null, text: label }));
  });
  el.breadcrumbs.replaceChildren(h('ol', {}, items));
}

function renderDetails(meta) {
  const rows = [['Path', meta.path], ['Type', describeType(meta)]];
  if (meta.kind !== 'dir') rows.push(['Size', describeSize(meta.size)]);
  if (meta.modified) rows.push(['Modified', timeElement(meta.modified)]);
  el.details.replaceChildren(
    h('h2', { class: 'entry-name' }, [icon(meta.kind), h('span', { text: meta.name })]),
    h('dl', {}, rows.flatMap(([term, value]) => [h('dt', { text: term }), h('dd', {}, value)])),
  );
}

function downloadLink(meta) {
  return h('a', {
    class: 'button primary',
    href: rawUrl(meta.path, true),
    download: meta.name,
    dataset: { testid: 'download' },
    text: 'Download',
  });
}

function showLoading() {
  el.details.replaceChildren();
  el.actions.replaceChildren();
  el.preview.replaceChildren(h('p', { class: 'loading', text: 'Loading…' }));
}

function lineNumbers(text) {
  let count = 1;
  for (let i = text.indexOf('\n'); i !== -1; i = text.indexOf('\n', i + 1)) count += 1;
  if (count > 1 && text.endsWith('\n')) count -= 1;
  return Array.from({ length: count }, (_, i) => i + 1).join('\n');
}

// Two <pre>s in one scroller: a single text node each keeps a megabyte of text fast.
function textView(text, truncated) {
  const view = h('div', { class: 'code', dataset: { testid: 'preview-text' } }, [
    h('pre', { class: 'gutter', 'aria-hidden': 'true', text: lineNumbers(text) }),
    h('pre', { class: 'code-text', tabindex: 0, 'aria-label': 'File contents', text }),
  ]);
  const note = truncated ? h('p', { class: 'note', text: 'The preview is truncated; download the file to see all of it.' }) : null;
  return [view, note].filter(Boolean);
}

function rewriteMarkdown(root, filePath) {
  const baseDir = parentPath(filePath);
  for (const link of root.querySelectorAll('a[href]')) {
    const href = link.getAttribute('href').trim();
    if (href.startsWith('#')) {
      // In-page anchors would fight the hash router: scroll instead (see onMarkdownClick).
      link.dataset.anchor = safeDecode(href.slice(1));
      link.setAttribute('href', pathToHash(filePath));
    } else if (HAS_SCHEME.test(href) || href.startsWith('//')) {
      if (SAFE_LINK_SCHEME.test(href)) {
        link.setAttribute('target', '_blank');
        link.setAttribute('rel', 'noopener noreferrer');
      } else {
        link.removeAttribute('href');
      }
    } else {
      link.setAttribute('href', pathToHash(resolveWorkdirLink(href, baseDir)));
    }
  }
  for (const image of root.querySelectorAll('img')) {
    const src = (image.getAttribute('src') || '').trim();
    const local = src && !HAS_SCHEME.test(src) && !src.startsWith('//') ? resolveWorkdirLink(src, baseDir) : null;
    image.removeAttribute('srcset');
    // Only raster images from the workdir: remote ones are blocked by the CSP, and SVG is never rendered.
    if (local && RASTER_IMAGE.test(local)) {
      image.setAttribute('src', rawUrl(local));
    } else {
      const alt = image.getAttribute('alt');
      image.replaceWith(h('span', { class: 'blocked-image', title: src ? `Not loaded: ${src}` : null, text: `[image${alt ? `: ${alt}` : ''}]` }));
    }
  }
}

function sanitisedMarkdown(html, filePath) {
  const template = document.createElement('template');
  // The server sanitised this HTML. A template's content is inert, so no image
  // starts loading before rewriteMarkdown has fixed its address.
  template.innerHTML = html;
  rewriteMarkdown(template.content, filePath);
  return template.content;
}

function onMarkdownClick(event) {
  const link = event.target.closest('a[data-anchor]');
  if (!link) return;
  event.preventDefault();
  const id = link.dataset.anchor;
  const container = event.currentTarget;
  const target = container.querySelector(`[id="${CSS.escape(id)}"], [id="user-content-${CSS.escape(id)}"], [name="${CSS.escape(id)}"]`);
  if (target) target.scrollIntoView({ block: 'start' });
}

function markdownView(meta, preview) {
  const rendered = h('div', { class: 'markdown', dataset: { testid: 'preview-markdown' } });
  rendered.append(sanitisedMarkdown(preview.html || '', meta.path));
  rendered.addEventListener('click', onMarkdownClick);
  const source = h('div', { class: 'markdown-source', hidden: true });
  const button = h('button', { type: 'button', class: 'button small', 'aria-pressed': 'false', text: 'Show source' });
  button.addEventListener('click', () => {
    const showSource = source.hidden;
    if (showSource && !source.hasChildNodes()) source.append(...textView(preview.text || '', false));
    source.hidden = !showSource;
    rendered.hidden = showSource;
    button.setAttribute('aria-pressed', String(showSource));
    button.textContent = showSource ? 'Show rendered' : 'Show source';
  });
  return [h('div', { class: 'preview-tools' }, button), rendered, source];
}

function imageView(meta) {
  const image = h('img', { class: 'preview-image', src: rawUrl(meta.path), alt: meta.name, dataset: { testid: 'preview-image' } });
  const caption = h('figcaption', { class: 'note' });
  image.addEventListener('load', () => {
    caption.textContent = `${image.naturalWidth} × ${image.naturalHeight} px`;
  });
  image.addEventListener('error', () => {
    caption.textContent = 'The image could not be displayed; download it instead.';
  });
  return h('figure', { class: 'image-frame' }, [image, caption]);
}

function pdfView(meta) {
  return h('iframe', { class: 'preview-pdf', src: rawUrl(meta.path), title: `PDF: ${meta.name}`, dataset: { testid: 'preview-pdf' } });
}

function noPreview(reason) {
  return h('p', { class: 'preview-none', dataset: { testid: 'preview-none' }, text: reason || 'No preview is available.' });
}

function previewNodes(meta) {
  const preview = meta.preview || { type: 'none', reason: 'No preview is available.' };
  switch (preview.type) {
    case 'text': return textView(preview.text || '', preview.truncated);
    case 'markdown': return markdownView(meta, preview);
    // Defence in depth: the server never sends active content as an image.
    case 'image': return /svg|html|xml/i.test(meta.media_type || '') ? [noPreview('Active content is offered as a download only.')] : [imageView(meta)];
    case 'pdf': return [pdfView(meta)];
    case 'none': return [noPreview(preview.reason)];
    default: return [noPreview(`No preview for this kind of file (${preview.type}).`)];
  }
}

function showFile(meta) {
  el.actions.replaceChildren(meta.kind === 'file' ? downloadLink(meta) : '');
  el.preview.replaceChildren(...previewNodes(meta));
}

function listingRow(entry) {
  const isDir = entry.kind === 'dir';
  return h('tr', { dataset: { testid: 'listing-item', path: entry.path, kind: String(entry.kind) } }, [
    h('td', { class: 'name' }, h('a', { href: pathToHash(entry.path), title: entry.name }, [icon(entry.kind), h('span', { text: entry.name })])),
    h('td', { class: 'num', title: isDir ? null : describeSize(entry.size), text: isDir ? '—' : formatBytes(entry.size) }),
    h('td', { class: 'when' }, timeElement(entry.modified)),
  ]);
}

function updateListingFooter(listing) {
  const footer = state.listing.footer;
  const summary = listing.entries.length
    ? `${listing.entries.length} of ${listing.total} ${listing.total === 1 ? 'entry' : 'entries'}`
    : 'This folder is empty.';
  const capped = listing.capped ? '; warren lists no more of this folder' : '';
  const more = listing.more
    ? h('button', { type: 'button', class: 'button', dataset: { testid: 'show-more' }, text: 'Show more', onclick: () => loadMore(listing.path) })
    : null;
  footer.replaceChildren(h('span', { class: 'note', text: summary + capped }), more || '');
}

function renderListing(listing) {
  const tbody = h('tbody', {}, listing.entries.map(listingRow));
  const footer = h('div', { class: 'listing-footer' });
  const head = h('thead', {}, h('tr', {}, [
    h('th', { scope: 'col', text: 'Name' }),
    h('th', { scope: 'col', class: 'num', text: 'Size' }),
    h('th', { scope: 'col', class: 'when', text: 'Modified' }),
  ]));
  state.listing = { path: listing.path, tbody, footer };
  el.preview.replaceChildren(h('div', { class: 'listing-wrap', dataset: { testid: 'dir-listing', path: listing.path } }, [
    h('table', { class: 'listing' }, [head, tbody]),
    footer,
  ]));
  updateListingFooter(listing);
}

function appendListingEntries(listing, added) {
  if (!state.listing || state.listing.path !== listing.path) return;
  state.listing.tbody.append(...added.map(listingRow));
  updateListingFooter(listing);
}

async function showDirectory(path, token, fromTree) {
  el.actions.replaceChildren();
  if (!fromTree) await expand(path);
  const listing = await ensureListing(path);
  if (token === state.navToken) renderListing(listing);
}

/* ----------------------------------------------------------- navigation */

function setHash(path, replace) {
  if (hashToPath(window.location.hash) === path) return;
  if (replace) window.history.replaceState(null, '', pathToHash(path));
  else window.location.hash = pathToHash(path);
}

// The tree only helps here; real errors are reported by the preview request.
async function revealAncestors(path) {
  for (const dir of ancestorsOf(path)) {
    try {
      await expand(dir);
    } catch {
      return;
    }
  }
}

async function describe(path, signal) {
  if (path === '/') return { name: rootLabel(), path: '/', kind: 'dir' };
  const entry = findEntry(path);
  if (entry && entry.kind === 'dir') return entry;
  const data = await getJson(apiUrl('preview', { path }), signal);
  return { ...data, path: normalizePath(data.path || path), name: data.name || baseName(path) };
}

async function open(target, { fromTree = false, replace = false } = {}) {
  if (state.dead) return;
  const path = normalizePath(target);
  const token = ++state.navToken;
  if (state.controller) state.controller.abort();
  const controller = new AbortController();
  state.controller = controller;
  state.open = { path, kind: null };
  state.listing = null;
  setHash(path, replace);
  clearError();
  renderBreadcrumbs(path);
  selectPath(path);
  markOpen(path);
  showLoading();
  try {
    if (!fromTree) await revealAncestors(path);
    const meta = await describe(path, controller.signal);
    if (token !== state.navToken) return;
    state.open.kind = meta.kind;
    setFilterDir(meta.kind === 'dir' ? path : parentPath(path));
    document.title = `${meta.name} · warren viewer`;
    renderDetails(meta);
    if (meta.kind === 'dir') await showDirectory(path, token, fromTree);
    else showFile(meta);
    if (token !== state.navToken) return;
    selectPath(path); // its row may only exist now
    markOpen(path);
  } catch (err) {
    if (token !== state.navToken || err.name === 'AbortError') return;
    el.details.replaceChildren();
    el.actions.replaceChildren();
    el.preview.replaceChildren();
    showError(err);
  } finally {
    if (token === state.navToken) applyFilter();
  }
}

function goToParent() {
  const path = state.open ? state.open.path : '/';
  if (path !== '/') open(parentPath(path));
}

function onHashChange() {
  const path = hashToPath(window.location.hash);
  if (!state.open || path !== state.open.path) open(path);
}

async function refreshOpen() {
  try {
    await refreshDir(state.filterDir);
  } catch (err) {
    showError(err);
    return;
  }
  if (state.open && state.open.kind !== 'dir') open(state.open.path, { fromTree: true });
}

/* --------------------------------------------------------------- errors */

function clearError() {
  if (state.dead) return;
  el.error.hidden = true;
  el.error.replaceChildren();
}

function showSessionExpired(err) {
  state.dead = true;
  el.app.hidden = true;
  el.dropzone.hidden = true;
  el.session.replaceChildren();
  el.error.classList.add('fatal');
  el.error.replaceChildren(
    h('p', { class: 'fatal-title', text: EXPIRED_MESSAGE }),
    h('p', { class: 'fatal-detail', text: err.message }),
  );
  el.error.hidden = false;
  document.title = 'Link expired · warren viewer';
}

function showError(err) {
  if (!err || err.name === 'AbortError' || state.dead) return;
  if (err instanceof ApiError && err.status === 401) {
    showSessionExpired(err);
    return;
  }
  el.error.textContent = err.message || String(err);
  el.error.hidden = false;
}

/* --------------------------------------------------------------- upload */

function statusLine(file) {
  const text = h('span', { class: 'upload-text', text: `Waiting: ${file.name}` });
  const progress = h('progress', { max: Math.max(file.size, 1), value: 0, 'aria-label': `Upload progress of ${file.name}` });
  const actions = h('span', { class: 'upload-actions' });
  const item = h('li', { class: 'upload-line' }, [text, progress, actions]);
  el.uploadStatus.append(item);
  return { item, text, progress, actions };
}

function setLine(line, message, outcome) {
  line.text.textContent = message;
  line.item.classList.remove('ok', 'failed', 'pending');
  if (outcome) line.item.classList.add(outcome);
  line.progress.hidden = outcome !== 'pending';
}

function offerOverwrite(line, file) {
  setLine(line, `${file.name} already exists in uploads/.`, 'failed');
  const overwrite = h('button', { type: 'button', class: 'button small', dataset: { testid: 'upload-overwrite' }, text: 'Overwrite' });
  const keep = h('button', { type: 'button', class: 'button small', text: 'Keep existing' });
  overwrite.addEventListener('click', async () => {
    line.actions.replaceChildren();
    const path = await uploadOne(file, true, line);
    if (path) await refreshAfterUpload([path]);
  });
  keep.addEventListener('click', () => {
    line.actions.replaceChildren();
    setLine(line, `${file.name} skipped; the existing file was kept.`, null);
  });
  line.actions.replaceChildren(overwrite, keep);
}

async function uploadOne(file, overwrite, line = statusLine(file)) {
  setLine(line, `Uploading ${file.name}…`, 'pending');
  line.progress.value = 0;
  try {
    const result = await postUpload(file, overwrite, (loaded, total) => {
      line.progress.max = Math.max(total, 1);
      line.progress.value = loaded;
      line.text.textContent = `Uploading ${file.name}… ${Math.floor((loaded / Math.max(total, 1)) * 100)}%`;
    });
    const path = normalizePath(result.path || `/uploads/${file.name}`);
    setLine(line, `${file.name} uploaded to ${path} (${describeSize(Number(result.size))})`, 'ok');
    return path;
  } catch (err) {
    if (err.code === 'already_exists' || err.status === 409) {
      offerOverwrite(line, file);
    } else {
      setLine(line, `${file.name} failed: ${err.message}`, 'failed');
      showError(err);
    }
    return null;
  }
}

async function refreshAfterUpload(paths) {
  for (const dir of new Set(paths.map(parentPath))) {
    try {
      if (dir !== '/' && !findEntry(dir)) await refreshDir(parentPath(dir)); // the first upload creates uploads/
      await refreshDir(dir);
      await expand(dir);
    } catch (err) {
      showError(err);
    }
  }
  if (state.open && paths.includes(state.open.path)) open(state.open.path, { fromTree: true });
}

async function uploadFiles(fileList) {
  const files = Array.from(fileList || []);
  if (!files.length || state.dead) return;
  el.uploadStatus.replaceChildren();
  const uploaded = [];
  for (const file of files) {
    const path = await uploadOne(file, false);
    if (path) uploaded.push(path);
  }
  if (uploaded.length) await refreshAfterUpload(uploaded);
}

function onUploadInput() {
  const files = Array.from(el.uploadInput.files || []);
  el.uploadInput.value = ''; // choosing the same file again must fire "change"
  uploadFiles(files);
}

function bindDragAndDrop() {
  let depthCounter = 0; // dragenter/dragleave fire for every child element crossed
  const carriesFiles = (event) => Boolean(event.dataTransfer) && Array.from(event.dataTransfer.types || []).includes('Files');
  window.addEventListener('dragenter', (event) => {
    if (!carriesFiles(event) || state.dead) return;
    event.preventDefault();
    depthCounter += 1;
    el.dropzone.hidden = false;
  });
  window.addEventListener('dragover', (event) => {
    if (!carriesFiles(event) || state.dead) return;
    event.preventDefault();
    event.dataTransfer.dropEffect = 'copy';
  });
  window.addEventListener('dragleave', (event) => {
    if (!carriesFiles(event)) return;
    depthCounter = Math.max(0, depthCounter - 1);
    if (depthCounter === 0) el.dropzone.hidden = true;
  });
  window.addEventListener('drop', (event) => {
    if (!carriesFiles(event)) return;
    event.preventDefault();
    depthCounter = 0;
    el.dropzone.hidden = true;
    uploadFiles(event.dataTransfer.files);
  });
}

/* ------------------------------------------------------------ artifacts */

function artifactItem(artifact) {
  const name = String(artifact.name || artifact.artifact_id || 'artifact');
  const href = safeLinkUrl(artifact.download_url);
  return h('li', { class: 'artifact', dataset: { testid: 'artifact', id: String(artifact.artifact_id || '') } }, [
    h('div', { class: 'artifact-name', title: artifact.path || name, text: name }),
    h('div', { class: 'artifact-meta' }, [
      formatBytes(Number(artifact.size)), ' · ', artifact.media_type || 'unknown type', ' · ', timeElement(artifact.created_at),
    ]),
    href
      ? h('a', { class: 'button small', href, download: name, 'aria-label': `Download ${name}`, text: 'Download' })
      : h('span', { class: 'note', text: 'No download available' }),
  ]);
}

async function loadArtifacts() {
  el.artifactsRefresh.disabled = true;
  try {
    const data = await getJson(apiUrl('artifacts'));
    const artifacts = Array.isArray(data.artifacts) ? data.artifacts : [];
    el.artifacts.replaceChildren(...(artifacts.length
      ? artifacts.map(artifactItem)
      : [h('li', { class: 'note', text: 'No artifacts yet.' })]));
  } catch (err) {
    el.artifacts.replaceChildren(h('li', { class: 'note', text: 'Artifacts could not be loaded.' }));
    showError(err);
  } finally {
    el.artifactsRefresh.disabled = false;
  }
}

/* -------------------------------------------------------------- session */

function chip(label, value, title) {
  return h('span', { class: 'chip', title }, [h('span', { class: 'chip-label', text: label }), h('span', { text: value })]);
}

function renderSession(session) {
  const expiry = h('span', { class: 'expiry' });
  el.session.replaceChildren(
    chip('uid', String(session.uid ?? ''), null),
    chip('workdir', String(session.workdir ?? ''), session.workdir_path || null),
    expiry,
  );
  const expiresAt = new Date(session.expires_at);
  if (Number.isNaN(expiresAt.getTime())) return;
  expiry.title = `Expires ${expiresAt.toLocaleString()}`;
  const update = () => {
    const expired = expiresAt.getTime() <= Date.now();
    expiry.textContent = expired ? 'Link expired' : `Link expires ${relativeTime(expiresAt)}`;
    expiry.classList.toggle('expired', expired);
  };
  update();
  window.setInterval(update, 30000);
}

/* ----------------------------------------------------------------- init */

function isEditable(target) {
  return target instanceof HTMLElement
    && (target.isContentEditable || target.matches('input:not([type=file]):not([type=button]):not([type=checkbox]), textarea, select'));
}

function onGlobalKeydown(event) {
  if (state.dead || event.defaultPrevented || event.ctrlKey || event.metaKey || event.altKey) return;
  if (isEditable(event.target)) return;
  if (event.key === '/') {
    event.preventDefault();
    el.filter.focus();
    el.filter.select();
  } else if (event.key === 'Backspace') {
    event.preventDefault();
    goToParent();
  }
}

function bindEvents() {
  el.tree.addEventListener('click', onTreeClick);
  el.tree.addEventListener('keydown', onTreeKeydown);
  el.tree.addEventListener('focus', onTreeFocus);
  el.filter.addEventListener('input', applyFilter);
  el.filter.addEventListener('keydown', onFilterKeydown);
  el.refresh.addEventListener('click', refreshOpen);
  el.uploadInput.addEventListener('change', onUploadInput);
  el.artifactsRefresh.addEventListener('click', loadArtifacts);
  document.addEventListener('keydown', onGlobalKeydown);
  window.addEventListener('hashchange', onHashChange);
  bindDragAndDrop();
}

// A generated icon keeps the browser from asking for /favicon.ico (a 404) and
// needs no data: URL, which the CSP forbids; blob: images are allowed.
function installFavicon() {
  const svg = '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24"><rect width="24" height="24" rx="6" fill="#0969da"/>'
    + '<path d="M5 9.5A2 2 0 0 1 7 7.5h3l1.5 1.5H17a2 2 0 0 1 2 2v5a2 2 0 0 1-2 2H7a2 2 0 0 1-2-2z" fill="#fff"/></svg>';
  const link = h('link', { rel: 'icon', type: 'image/svg+xml', href: URL.createObjectURL(new Blob([svg], { type: 'image/svg+xml' })) });
  document.head.append(link);
}

async function init() {
  installFavicon();
  bindEvents();
  try {
    state.session = await getJson(apiUrl('session'));
    renderSession(state.session);
    updateFilterPlaceholder();
    loadArtifacts();
    await ensureListing('/');
    el.tree.replaceChildren(renderChildren('/', 1));
  } catch (err) {
    showError(err);
    document.body.dataset.ready = 'error';
    return;
  }
  await open(hashToPath(window.location.hash), { replace: true });
  document.body.dataset.ready = '1';
}

init();
