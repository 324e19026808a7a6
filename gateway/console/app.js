// Coffer's operator console: every API request is stamped here, in this tab, by the user's own
// credential (a passkey, or an API key held as a non-extractable WebCrypto key). Nothing is kept
// beyond the tab: no storage, no cookies, no cache. Pages are built with DOM nodes and
// textContent only: nothing the API returns is ever parsed as HTML.
'use strict';

const S = { org: null, stamper: null, who: null, session: null };
const enc = new TextEncoder();

// ---- bytes --------------------------------------------------------------------------------

const hex = (b) => Array.from(new Uint8Array(b), (x) => x.toString(16).padStart(2, '0')).join('');
function unhex(s) {
  s = s.trim().toLowerCase().replace(/^0x/, '');
  if (!/^([0-9a-f]{2})*$/.test(s)) throw new Error('not hex');
  return Uint8Array.from(s.match(/../g) || [], (h) => parseInt(h, 16));
}
const b64url = (b) => btoa(String.fromCharCode(...new Uint8Array(b))).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
const sha256 = async (bytes) => new Uint8Array(await crypto.subtle.digest('SHA-256', bytes));
const big = (b) => BigInt('0x' + (hex(b) || '0'));
const bytes32 = (n) => unhex(n.toString(16).padStart(64, '0'));

// ---- P-256 keys and stamps ----------------------------------------------------------------

const P = 0xffffffff00000001000000000000000000000000ffffffffffffffffffffffffn;
const B = 0x5ac635d8aa3a93e7b3ebbd55769886bc651d06b0cc53b0f63bce3c3e27d2604bn;
function modpow(b, e, m) {
  let r = 1n;
  b %= m;
  for (; e > 0n; e >>= 1n, b = (b * b) % m) if (e & 1n) r = (r * b) % m;
  return r;
}

// The (x, y) of a compressed (33 bytes) or uncompressed (65 bytes) P-256 public key.
function pointOf(pub) {
  if (pub.length === 65 && pub[0] === 4) return [pub.slice(1, 33), pub.slice(33)];
  if (pub.length !== 33 || (pub[0] !== 2 && pub[0] !== 3)) throw new Error('a P-256 public key is 33 or 65 bytes');
  const x = big(pub.slice(1));
  const rhs = (((x * x * x - 3n * x + B) % P) + P) % P;
  let y = modpow(rhs, (P + 1n) / 4n, P); // P = 3 (mod 4)
  if ((y * y) % P !== rhs) throw new Error('not a point of P-256');
  if (Number(y & 1n) !== (pub[0] & 1)) y = P - y;
  return [pub.slice(1), bytes32(y)];
}

function compress(raw) {
  const out = raw.slice(0, 33);
  out[0] = 2 | (raw[64] & 1);
  return out;
}

// ECDSA r || s (64 bytes, as WebCrypto signs) to DER.
function der(sig) {
  const int = (b) => {
    let i = 0;
    while (i < b.length - 1 && b[i] === 0) i++;
    b = b.slice(i);
    return b[0] & 0x80 ? [0x02, b.length + 1, 0, ...b] : [0x02, b.length, ...b];
  };
  const body = [...int(sig.slice(0, 32)), ...int(sig.slice(32))];
  return new Uint8Array([0x30, body.length, ...body]);
}

// Stamps as an API key does (`X-Stamp`): a non-extractable WebCrypto key and its public key.
class KeyStamper {
  constructor(publicKeyHex, key) {
    this.publicKey = publicKeyHex;
    this.key = key;
  }
  static async fromHex(publicHex, privateHex) {
    const pub = unhex(publicHex);
    const d = unhex(privateHex);
    if (d.length !== 32) throw new Error('the private key is 32 bytes of hex');
    const [x, y] = pointOf(pub);
    const jwk = { kty: 'EC', crv: 'P-256', x: b64url(x), y: b64url(y), d: b64url(d), ext: false };
    d.fill(0);
    const key = await crypto.subtle.importKey('jwk', jwk, { name: 'ECDSA', namedCurve: 'P-256' }, false, ['sign']);
    jwk.d = '';
    return new KeyStamper(hex(pub.length === 33 ? pub : compress(pub)), key);
  }
  static async generate() {
    const pair = await crypto.subtle.generateKey({ name: 'ECDSA', namedCurve: 'P-256' }, false, ['sign']);
    const raw = new Uint8Array(await crypto.subtle.exportKey('raw', pair.publicKey));
    return new KeyStamper(hex(compress(raw)), pair.privateKey);
  }
  async stamp(body) {
    const sig = new Uint8Array(await crypto.subtle.sign({ name: 'ECDSA', hash: 'SHA-256' }, this.key, enc.encode(body)));
    const stamp = { publicKey: this.publicKey, scheme: 'SIGNATURE_SCHEME_TK_API_P256', signature: hex(der(sig)) };
    return { 'X-Stamp': b64url(enc.encode(JSON.stringify(stamp))) };
  }
}

// Stamps with a passkey (`X-Stamp-Webauthn`): the challenge is the hex SHA-256 of the body.
const passkeyStamper = {
  async stamp(body) {
    const challenge = enc.encode(hex(await sha256(enc.encode(body))));
    const cred = await navigator.credentials.get({
      publicKey: { challenge, rpId: location.hostname, userVerification: 'preferred', timeout: 60000 },
    });
    const r = cred.response;
    const stamp = {
      authenticatorData: b64url(r.authenticatorData),
      clientDataJson: b64url(r.clientDataJSON),
      credentialId: b64url(cred.rawId),
      signature: b64url(r.signature),
    };
    return { 'X-Stamp-Webauthn': JSON.stringify(stamp) };
  },
};

// ---- the API ------------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, body, text, path) {
    const msg = (body && (body.message || body.error)) || text || 'no answer';
    const code = body && (body.turnkeyErrorCode || body.code);
    super(`${status}${code !== undefined ? ' ' + code : ''}: ${msg} (${path})`);
    this.body = body;
  }
}

async function call(kind, name, payload, stamper = S.stamper) {
  if (!stamper) throw new Error('not signed in');
  const body = JSON.stringify(payload);
  const headers = { 'Content-Type': 'application/json', ...(await stamper.stamp(body)) };
  const r = await fetch(`/public/v1/${kind}/${name}`, { method: 'POST', headers, body, cache: 'no-store', credentials: 'omit' });
  const text = await r.text();
  let json = null;
  try {
    json = JSON.parse(text);
  } catch (_) {
    /* shown as text */
  }
  if (!r.ok) throw new ApiError(r.status, json, text.slice(0, 500), `${kind}/${name}`);
  return json;
}
const query = (name, params = {}) => call('query', name, { organizationId: S.org, ...params });
const submit = (name, type, parameters, stamper) =>
  call('submit', name, { type, timestampMs: String(Date.now()), organizationId: S.org, parameters }, stamper);

// ---- DOM ----------------------------------------------------------------------------------

const $ = (sel) => document.querySelector(sel);
// Text direction controls in a tenant's words would reorder what the operator reads: shown as
// the replacement character instead.
const BIDI = /[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/g;
function h(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children.flat()) if (c !== null && c !== undefined && c !== false) e.append(c instanceof Node ? c : String(c).replace(BIDI, '\ufffd'));
  return e;
}
const table = (heads, rows, attrs) =>
  rows.length
    ? h('table', attrs, h('thead', {}, h('tr', {}, heads.map((x) => h('th', { scope: 'col' }, x)))), h('tbody', {}, rows.map((r) => h('tr', {}, r.map((c) => h('td', {}, c))))))
    : h('p', { class: 'muted' }, 'None.');
const list = (items) => (items.length ? h('ul', {}, items.map((i) => h('li', {}, i))) : '—');
const mono = (s) => h('code', {}, s);
// At most 20,000 characters of a value are drawn: the API keeps the rest.
const clip = (t) => (t.length > 20000 ? t.slice(0, 20000) + ` … (${t.length - 20000} more characters)` : t);
const pre = (v) => h('pre', {}, clip(typeof v === 'string' ? v : JSON.stringify(v, null, 2)));
const time = (t) => (t && t.seconds ? new Date(Number(t.seconds) * 1000).toISOString().replace('.000Z', 'Z') : '');
const short = (s) => (s && s.length > 20 ? s.slice(0, 10) + '…' + s.slice(-8) : s || '');
const statusOf = (s) => h('span', { class: 'status-' + s }, (s || '').replace('ACTIVITY_STATUS_', ''));
const activityLink = (a) => h('a', { href: '#activity/' + encodeURIComponent(a.id) }, a.id);

function showError(e) {
  const box = $('#error');
  box.textContent = e ? String(e.message || e) : '';
  box.hidden = !e;
}

// A page is built off screen and shown whole once its requests are answered; a page asked for
// later wins over one still loading.
let shown = 0;
async function page(title, build) {
  const main = $('#main');
  const mine = ++shown;
  const section = h('section', { 'aria-labelledby': 'page-title' }, h('h2', { id: 'page-title' }, title));
  main.replaceChildren(h('p', { role: 'status' }, 'Loading…'));
  showError(null);
  let failed = null;
  try {
    await build(section);
  } catch (e) {
    failed = e;
  }
  if (mine !== shown) return;
  main.replaceChildren(section);
  showError(failed);
  section.setAttribute('data-ready', '');
}

// A list page by page: `load(after)` gives the items after the cursor, `cursor(item)` its id.
function paged(load, cursor, render, size = 100) {
  const box = h('div');
  const more = async (after) => {
    const items = await load(after, size);
    box.append(render(items));
    if (items.length === size) {
      const b = h('button', { type: 'button', onclick: async () => { b.remove(); try { await more(cursor(items[items.length - 1])); } catch (e) { showError(e); } } }, 'More');
      box.append(b);
    }
  };
  return { box, start: () => more(undefined) };
}
const pageOpts = (after, size) => ({ paginationOptions: after ? { limit: String(size), after } : { limit: String(size) } });

// ---- pages --------------------------------------------------------------------------------

async function organizationPage(s) {
  const o = (await query('get_organization')).organizationData;
  const users = o.users || [];
  const name = (id) => (users.find((u) => u.userId === id) || {}).userName || id;
  const tagName = (id) => ((o.tags || []).find((t) => t.tagId === id) || {}).tagName || id;
  s.append(
    h('dl', {}, h('dt', {}, 'Name'), h('dd', {}, o.name), h('dt', {}, 'ID'), h('dd', {}, mono(o.organizationId))),
    h('h3', {}, 'Root quorum'),
    h('p', { id: 'quorum' }, `${o.rootQuorum.threshold} of ${o.rootQuorum.userIds.length}: `, o.rootQuorum.userIds.map(name).join(', ')),
    h('h3', {}, 'Users'),
    table(
      ['Name', 'ID', 'Email', 'Tags', 'API keys', 'Passkeys'],
      users.map((u) => [
        u.userName,
        mono(u.userId),
        u.userEmail || '',
        list((u.userTags || []).map(tagName)),
        list((u.apiKeys || []).map((k) => h('span', {}, k.apiKeyName, ' ', mono(short(k.credential.publicKey))))),
        list((u.authenticators || []).map((a) => a.authenticatorName)),
      ]),
      { id: 'users' },
    ),
    h('h3', {}, 'Tags'),
    table(['Name', 'Type', 'ID'], (o.tags || []).map((t) => [t.tagName, t.tagType.replace('TAG_TYPE_', ''), mono(t.tagId)])),
    h('h3', {}, 'Features'),
    table(['Name', 'Value'], (o.features || []).map((f) => [f.name, f.value || ''])),
    h('h3', {}, 'Sub-organizations'),
  );
  const subs = paged(
    async (after, size) => (await query('list_suborgs', pageOpts(after, size))).organizationIds || [],
    (id) => id,
    (ids) => list(ids.map(mono)),
  );
  s.append(subs.box);
  await subs.start();
}

async function walletsPage(s) {
  const wallets = paged(
    async (after, size) => (await query('list_wallets', pageOpts(after, size))).wallets || [],
    (w) => w.walletId,
    (ws) => h('div', {}, ws.map((w) => {
      const box = h('div', { class: 'wallet' }, h('h3', {}, w.walletName, ' ', h('span', { class: 'muted' }, mono(w.walletId))));
      const accounts = paged(
        async (after, size) => (await query('list_wallet_accounts', { walletId: w.walletId, ...pageOpts(after, size) })).accounts || [],
        (a) => a.walletAccountId,
        (as) => table(['Address', 'Path', 'Format', 'Curve'], as.map((a) => [mono(a.address), mono(a.path), a.addressFormat.replace('ADDRESS_FORMAT_', ''), a.curve.replace('CURVE_', '')])),
      );
      box.append(accounts.box);
      box.ready = accounts.start();
      return box;
    })),
  );
  s.append(h('h3', {}, 'Wallets'), wallets.box);
  await wallets.start();
  await Promise.all(Array.from(wallets.box.querySelectorAll('.wallet'), (b) => b.ready));
  const keys = paged(
    async (after, size) => (await query('list_private_keys', pageOpts(after, size))).privateKeys || [],
    (k) => k.privateKeyId,
    (ks) => table(['Name', 'ID', 'Curve', 'Addresses'], ks.map((k) => [k.privateKeyName, mono(k.privateKeyId), k.curve.replace('CURVE_', ''), list((k.addresses || []).map((a) => mono(a.address)))])),
  );
  s.append(h('h3', {}, 'Private keys'), keys.box);
  await keys.start();
}

function showDryRun(box, r) {
  box.replaceChildren(
    h('p', {}, 'Decision: ', h('span', { class: 'decision', id: 'dry-run-decision' }, r.decision), ` (${r.reason})`),
    table(['Policy', 'Effect', 'Outcome', 'Deciding clause'], (r.policies || []).map((p) => [p.policyName, p.effect.replace('EFFECT_', ''), p.outcome, p.decidingClause ? mono(p.decidingClause) : '']), { id: 'dry-run-policies' }),
    r.transaction ? transactionView(r.transaction) : '',
  );
}

async function policiesPage(s) {
  const policies = paged(
    async (after, size) => (await query('list_policies', pageOpts(after, size))).policies || [],
    (p) => p.policyId,
    (ps) => table(['Name', 'Effect', 'Condition', 'Consensus', 'Notes'], ps.map((p) => [p.policyName, p.effect.replace('EFFECT_', ''), p.condition ? mono(p.condition) : '', p.consensus ? mono(p.consensus) : '', p.notes || '']), { id: 'policies' }),
  );
  s.append(policies.box);
  await policies.start();
  const text = h('textarea', { id: 'dry-run-activity', 'aria-describedby': 'dry-run-help', spellcheck: 'false' },
    JSON.stringify({ type: 'ACTIVITY_TYPE_CREATE_WALLET', parameters: { walletName: 'w', accounts: [] } }, null, 2));
  const out = h('div', { id: 'dry-run-result', 'aria-live': 'polite' });
  const run = async () => {
    showError(null);
    try {
      const activity = JSON.parse(text.value);
      showDryRun(out, await query('coffer_policy_dry_run', { activity }));
    } catch (e) {
      showError(e);
    }
  };
  s.append(
    h('h3', {}, 'Dry run'),
    h('p', { id: 'dry-run-help' }, 'Would this activity be allowed for you now, and by which policy? Nothing is recorded.'),
    h('label', { for: 'dry-run-activity' }, 'Activity (type and parameters, as submitted)'),
    text,
    h('p', {}, h('button', { type: 'button', id: 'dry-run', class: 'primary', onclick: run }, 'Dry run')),
    out,
  );
}

function activityTable(items) {
  return table(
    ['Created', 'Type', 'Status', 'Votes', 'ID'],
    items.map((a) => [time(a.createdAt), a.type.replace('ACTIVITY_TYPE_', ''), statusOf(a.status), String((a.votes || []).length), activityLink(a)]),
    { id: 'activities' },
  );
}

const STATUSES = ['COMPLETED', 'CONSENSUS_NEEDED', 'REJECTED', 'FAILED', 'PENDING', 'CREATED'];

async function activitiesPage(s, params) {
  const status = params.get('status') || '';
  const type = params.get('type') || '';
  const args = { filterByStatus: status ? ['ACTIVITY_STATUS_' + status] : [], filterByType: type ? [type] : [], paginationOptions: { limit: '10' } };
  if (params.get('after')) args.paginationOptions.after = params.get('after');
  if (params.get('before')) args.paginationOptions.before = params.get('before');
  const items = (await query('list_activities', args)).activities || [];
  const statusSel = h('select', { id: 'filter-status' }, h('option', { value: '' }, 'any'), STATUSES.map((x) => h('option', { value: x, selected: x === status }, x)));
  const typeIn = h('input', { id: 'filter-type', value: type, placeholder: 'ACTIVITY_TYPE_…', size: 36, spellcheck: 'false' });
  const go = (extra) => {
    const q = new URLSearchParams();
    if (statusSel.value) q.set('status', statusSel.value);
    if (typeIn.value.trim()) q.set('type', typeIn.value.trim());
    for (const [k, v] of Object.entries(extra || {})) q.set(k, v);
    location.hash = 'activities' + (q.toString() ? '?' + q : '');
  };
  s.append(
    h('div', { class: 'row' },
      h('div', {}, h('label', { for: 'filter-status' }, 'Status'), statusSel),
      h('div', {}, h('label', { for: 'filter-type' }, 'Type'), typeIn),
      h('div', {}, h('button', { type: 'button', id: 'filter', onclick: () => go() }, 'Filter'))),
    activityTable(items),
    h('p', { class: 'row' },
      items.length ? h('button', { type: 'button', id: 'newer', onclick: () => go({ before: items[0].id }) }, 'Newer') : '',
      items.length === 10 ? h('button', { type: 'button', id: 'older', onclick: () => go({ after: items[items.length - 1].id }) }, 'Older') : ''),
  );
}

async function pendingPage(s) {
  const pending = paged(
    async (after, size) => (await query('list_activities', { filterByStatus: ['ACTIVITY_STATUS_CONSENSUS_NEEDED'], ...pageOpts(after, size) })).activities || [],
    (a) => a.id,
    (items) => table(
      ['Created', 'Type', 'Votes', 'Yours to cast', 'Activity'],
      items.map((a) => [time(a.createdAt), a.type.replace('ACTIVITY_TYPE_', ''), String((a.votes || []).length), a.canApprove ? 'yes' : 'no', activityLink(a)]),
      { class: 'pending' },
    ),
  );
  s.append(h('p', {}, 'Activities waiting for approval votes. Open one to read it in full before you vote.'), h('div', { id: 'pending' }, pending.box));
  await pending.start();
}

// A transaction as the transaction policies see it (the enclave's own facts of it).
// Every fact is shown; what changes who controls the account, or what no interface decodes, is
// called out above them.
function transactionView(t) {
  const tx = t.tx || {};
  const show = (v) => mono(clip(typeof v === 'string' ? v : JSON.stringify(v)));
  const first = ['chain_id', 'from', 'to', 'value', 'function_signature'];
  const args = tx.contract_call_args;
  const argsShown = args && typeof args === 'object' && !Array.isArray(args);
  const keys = first.filter((k) => k in tx).concat(Object.keys(tx).filter((k) => !first.includes(k) && k !== 'function_name' && !(k === 'contract_call_args' && argsShown)));
  const warnings = [];
  const al = tx.authorization_list;
  if ((Array.isArray(al) && al.length) || typeof al === 'string') warnings.push("It carries an EIP-7702 authorization list: it delegates the signer's account to other code.");
  const hexData = typeof tx.data === 'string' && /^0x[0-9a-f]*$/.test(tx.data);
  if (hexData && tx.data.length > 2 && !tx.function_signature) warnings.push('Its call data is not decoded: no contract interface of the organization matches it.');
  if (tx.function_signature && hexData) warnings.push(`Decoded with the organization's interface for selector ${tx.data.slice(0, 10)}.`);
  const hidden = Object.keys(tx).filter((k) => typeof tx[k] === 'string' && tx[k].startsWith('(not shown:'));
  if (argsShown) hidden.push(...Object.keys(args).filter((k) => typeof args[k] === 'string' && args[k].startsWith('(not shown:')).map((k) => 'argument ' + k));
  if (hidden.length) warnings.push(`Too large to show here: ${hidden.join(', ')}. Read them through the API before you vote.`);
  const argRows = argsShown ? Object.entries(args).map(([k, v]) => [k, show(v)]) : [];
  return h('div', { id: 'transaction' },
    h('h3', {}, 'Transaction (', t.root, ')'),
    warnings.length ? h('ul', { class: 'warnings' }, warnings.map((w) => h('li', {}, w))) : '',
    table(['Fact', 'Value'], keys.map((k) => [k, show(tx[k])])),
    argRows.length ? h('div', {}, h('h3', {}, 'Arguments'), table(['Name', 'Value'], argRows, { id: 'call-args' })) : '');
}

async function activityPage(s, id) {
  const a = (await query('get_activity', { activityId: id })).activity;
  const intentKey = Object.keys(a.intent || {})[0];
  s.append(
    h('dl', { id: 'activity' },
      h('dt', {}, 'ID'), h('dd', {}, mono(a.id)),
      h('dt', {}, 'Type'), h('dd', {}, a.type),
      h('dt', {}, 'Status'), h('dd', { id: 'activity-status' }, statusOf(a.status)),
      h('dt', {}, 'Created'), h('dd', {}, time(a.createdAt)),
      h('dt', {}, 'Fingerprint'), h('dd', {}, mono(a.fingerprint))),
  );
  s.append(h('h3', {}, 'Intent'), pre(a.intent));
  if (/^ACTIVITY_TYPE_SIGN_TRANSACTION/.test(a.type) && intentKey) {
    try {
      const r = await query('coffer_policy_dry_run', { activity: { type: a.type, parameters: a.intent[intentKey] } });
      s.append(r.transaction ? transactionView(r.transaction) : h('p', {}, 'No transaction facts: it does not parse, or a parent organization\'s credential reads it.'));
    } catch (e) {
      s.append(h('p', {}, 'The transaction could not be decoded: ' + e.message));
    }
  }
  s.append(
    h('h3', {}, 'Votes'),
    table(['User ID', 'Name', 'Selection', 'Credential', 'At'], (a.votes || []).map((v) => [mono(v.userId), v.user ? v.user.userName : '', (v.selection || '').replace('VOTE_SELECTION_', ''), mono(short(v.publicKey || '')), time(v.createdAt)]), { id: 'votes' }),
  );
  const evals = (await query('get_policy_evaluations', { activityId: a.id })).policyEvaluations || [];
  s.append(
    h('h3', {}, 'Policy evaluation'),
    evals.length ? evals.map((e) => pre(e)) : h('p', { class: 'muted' }, 'None recorded.'),
    h('h3', {}, 'Result'),
    a.result && Object.keys(a.result).length ? pre(a.result) : h('p', { class: 'muted' }, 'None.'),
  );
  if (a.failure) s.append(h('h3', {}, 'Failure'), pre(a.failure));
  if ((a.appProofs || []).length) s.append(h('h3', {}, 'App proofs'), table(['Scheme', 'Payload', 'Signature'], a.appProofs.map((p) => [p.scheme, pre(p.proofPayload), mono(short(p.signature))]), { id: 'app-proofs' }));
  // The vote comes last, once everything it is about is on the page.
  if (a.status === 'ACTIVITY_STATUS_CONSENSUS_NEEDED' && a.canApprove) s.append(h('h3', {}, 'Your vote'), voteControls(a));
}

// Approve or reject, each after a confirmation naming the fingerprint the vote is bound to.
function voteControls(a) {
  const box = h('div', { class: 'confirm', id: 'vote' });
  const ask = (approve) => {
    const verb = approve ? 'Approve' : 'Reject';
    box.replaceChildren(
      h('p', {}, `${verb} this ${a.type.replace('ACTIVITY_TYPE_', '')} activity? Your vote is bound to fingerprint `, mono(a.fingerprint), '.'),
      h('button', { type: 'button', id: 'confirm-vote', class: approve ? 'primary' : 'danger', onclick: () => vote(approve) }, `Confirm: ${verb.toLowerCase()}`),
      ' ',
      h('button', { type: 'button', id: 'cancel-vote', onclick: () => box.replaceChildren(...buttons()) }, 'Cancel'),
    );
  };
  const vote = async (approve) => {
    showError(null);
    box.replaceChildren(h('p', { role: 'status' }, 'Voting…'));
    try {
      const [name, type] = approve ? ['approve_activity', 'ACTIVITY_TYPE_APPROVE_ACTIVITY'] : ['reject_activity', 'ACTIVITY_TYPE_REJECT_ACTIVITY'];
      await submit(name, type, { fingerprint: a.fingerprint });
      await route();
    } catch (e) {
      box.replaceChildren(...buttons());
      showError(e);
    }
  };
  const buttons = () => [
    h('p', {}, 'Your vote is needed.'),
    h('button', { type: 'button', id: 'approve', class: 'primary', onclick: () => ask(true) }, 'Approve'),
    ' ',
    h('button', { type: 'button', id: 'reject', class: 'danger', onclick: () => ask(false) }, 'Reject'),
  ];
  box.append(...buttons());
  return box;
}

async function webhooksPage(s) {
  const endpoints = paged(
    async (after, size) => (await query('list_webhook_endpoints', pageOpts(after, size))).webhookEndpoints || [],
    (e) => e.endpointId,
    (es) => h('div', {}, es.map((e) => {
      const out = h('div');
      const show = async () => {
        try {
          const ds = (await query('coffer_list_webhook_deliveries', { endpointId: e.endpointId, limit: '50' })).deliveries || [];
          out.replaceChildren(table(['Event', 'Activity', 'Status', 'Attempts', 'Last answer', 'Last error', 'Next attempt'],
            ds.map((d) => [d.eventType, d.activityId ? mono(d.activityId) : '', d.status, String(d.attempts), d.lastStatusCode ? String(d.lastStatusCode) : '', d.lastError || '', d.nextAttemptAt ? String(d.nextAttemptAt) : '']), { class: 'deliveries' }));
        } catch (err) {
          showError(err);
        }
      };
      return h('div', {},
        h('h3', {}, e.name, ' ', h('span', { class: 'muted' }, mono(e.endpointId))),
        h('dl', {}, h('dt', {}, 'URL'), h('dd', {}, mono(e.url)), h('dt', {}, 'Active'), h('dd', {}, e.isActive ? 'yes' : 'no'),
          h('dt', {}, 'Events'), h('dd', {}, list((e.subscriptions || []).map((x) => x.eventType || JSON.stringify(x))))),
        h('button', { type: 'button', class: 'deliveries-button', onclick: show }, 'Deliveries'),
        out);
    })),
  );
  s.append(endpoints.box);
  await endpoints.start();
}

// What a submitted activity came to: its status, and its result or why it waits.
function outcome(box, r) {
  const a = r.activity;
  box.replaceChildren(
    h('p', {}, 'Activity ', activityLink(a), ': ', statusOf(a.status),
      a.status === 'ACTIVITY_STATUS_CONSENSUS_NEEDED' ? ' — it waits for approval votes.' : ''),
    a.result && Object.keys(a.result).length ? pre(a.result) : '',
  );
}

function form(id, title, fields, onsubmit) {
  const out = h('div', { role: 'status', id: id + '-outcome' });
  const inputs = {};
  const body = fields.map(([name, label, el]) => {
    el.id = id + '-' + name;
    inputs[name] = el;
    return h('div', {}, h('label', { for: el.id }, label), el);
  });
  const go = async () => {
    showError(null);
    out.replaceChildren(h('p', {}, 'Submitting…'));
    try {
      outcome(out, await onsubmit(inputs));
    } catch (e) {
      out.replaceChildren();
      showError(e);
    }
  };
  return h('section', { 'aria-labelledby': id + '-title' }, h('h3', { id: id + '-title' }, title), ...body,
    h('p', {}, h('button', { type: 'button', class: 'primary', id: id + '-submit', onclick: go }, title)), out);
}
const input = (attrs) => h('input', { autocomplete: 'off', spellcheck: 'false', size: 60, ...attrs });
const val = (el) => el.value.trim();

async function createPage(s) {
  const users = (await query('list_users')).users || [];
  s.append(
    form('user', 'Create user', [['name', 'Name', input({})], ['email', 'Email (optional)', input({ type: 'email' })]], (f) =>
      submit('create_users', 'ACTIVITY_TYPE_CREATE_USERS_V4', {
        users: [{ userName: val(f.name), ...(val(f.email) ? { userEmail: val(f.email) } : {}), apiKeys: [], authenticators: [], oauthProviders: [], userTags: [] }],
      })),
    form('apikey', 'Create API key', [
      ['user', 'User', h('select', {}, users.map((u) => h('option', { value: u.userId }, `${u.userName} (${u.userId})`)))],
      ['name', 'Name', input({})],
      ['public', 'Public key (compressed P-256, hex)', input({})],
      ['expiration', 'Expires after (seconds, optional)', input({ inputmode: 'numeric', size: 12 })],
    ], (f) =>
      submit('create_api_keys', 'ACTIVITY_TYPE_CREATE_API_KEYS_V2', {
        userId: f.user.value,
        apiKeys: [{ apiKeyName: val(f.name), publicKey: val(f.public), curveType: 'API_KEY_CURVE_P256', ...(val(f.expiration) ? { expirationSeconds: val(f.expiration) } : {}) }],
      })),
    form('policy', 'Create policy', [
      ['name', 'Name', input({})],
      ['effect', 'Effect', h('select', {}, h('option', { value: 'EFFECT_ALLOW' }, 'Allow'), h('option', { value: 'EFFECT_DENY' }, 'Deny'))],
      ['condition', 'Condition', h('textarea', { spellcheck: 'false' })],
      ['consensus', 'Consensus', h('textarea', { spellcheck: 'false' })],
      ['notes', 'Notes', input({})],
    ], (f) =>
      submit('create_policy', 'ACTIVITY_TYPE_CREATE_POLICY_V3', {
        policyName: val(f.name), effect: f.effect.value, notes: val(f.notes),
        ...(val(f.condition) ? { condition: val(f.condition) } : {}),
        ...(val(f.consensus) ? { consensus: val(f.consensus) } : {}),
      })),
  );
}

// ---- routing and signing in ---------------------------------------------------------------

async function route() {
  if (!S.stamper) return;
  const [path, q] = (location.hash.slice(1) || 'organization').split('?');
  const params = new URLSearchParams(q || '');
  const [name, arg] = path.split('/');
  for (const a of document.querySelectorAll('nav a')) {
    if (a.getAttribute('href') === '#' + name) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  const pages = {
    organization: ['Organization', organizationPage],
    wallets: ['Wallets and keys', walletsPage],
    policies: ['Policies', policiesPage],
    activities: ['Activities', (s) => activitiesPage(s, params)],
    activity: ['Activity', (s) => activityPage(s, decodeURIComponent(arg || ''))],
    pending: ['Pending approvals', pendingPage],
    webhooks: ['Webhook endpoints', webhooksPage],
    create: ['Create', createPage],
  };
  const [title, build] = pages[name] || ['Not found', async () => { throw new Error('no such page'); }];
  document.title = title + ' — Coffer console';
  await page(title, build);
}

async function signedIn(stamper, how) {
  const who = await call('query', 'whoami', { organizationId: S.org }, stamper);
  S.stamper = stamper;
  S.who = who;
  $('#who').textContent = `${who.username} (${who.userId}) in ${who.organizationName}, signing with ${how}`;
  $('#who').hidden = false;
  $('#signout').hidden = false;
  $('#nav').hidden = false;
  await route();
}

async function signIn(kind) {
  showError(null);
  const status = $('#signin-status');
  S.org = $('#org-id').value.trim();
  if (!S.org) return showError(new Error('enter the organization ID'));
  status.textContent = 'Signing in…';
  try {
    if (kind === 'key') {
      const priv = $('#api-private');
      let stamper;
      try {
        stamper = await KeyStamper.fromHex($('#api-public').value, priv.value);
      } finally {
        priv.value = '';
      }
      await signedIn(stamper, 'an API key');
    } else {
      // Where the organization's rules let the user log in alone, the passkey signs one login
      // that certifies a key made in this tab (non-extractable, 15 minutes), which stamps the
      // requests after it. Where a login would wait for approvals (a root quorum above one),
      // none is submitted: the passkey stamps every request itself, votes included.
      const session = await KeyStamper.generate();
      const params = { publicKey: session.publicKey, expirationSeconds: '900', invalidateExisting: false };
      const activity = { type: 'ACTIVITY_TYPE_STAMP_LOGIN', parameters: params };
      const d = await call('query', 'coffer_policy_dry_run', { organizationId: S.org, activity }, passkeyStamper);
      if (d.decision === 'DECISION_ALLOW') {
        const r = await submit('stamp_login', 'ACTIVITY_TYPE_STAMP_LOGIN', params, passkeyStamper);
        if (r.activity.status !== 'ACTIVITY_STATUS_COMPLETED') throw new Error('the login did not complete: ' + r.activity.status);
        S.session = session;
        await signedIn(session, 'a session key for 15 minutes');
      } else {
        await signedIn(passkeyStamper, 'your passkey for every request');
      }
    }
  } catch (e) {
    status.textContent = '';
    showError(e);
  }
}

document.addEventListener('DOMContentLoaded', () => {
  $('#passkey-signin').addEventListener('click', () => signIn('passkey'));
  $('#apikey-signin').addEventListener('click', () => signIn('key'));
  // The private key's field is masked without being a password field (which password managers
  // offer to save); where a browser cannot mask it so, it is a password field after all.
  if (!CSS.supports('-webkit-text-security', 'disc')) $('#api-private').type = 'password';
  $('#signout').addEventListener('click', async () => {
    // A session key this tab made is deleted by itself before it is dropped, so that it is
    // no credential of the user's past the sign-out. Signed out even if that fails.
    try {
      if (S.session && S.stamper === S.session) {
        const keys = (await query('get_api_keys', { userId: S.who.userId })).apiKeys || [];
        const mine = keys.find((k) => k.credential.publicKey === S.session.publicKey);
        if (mine) await submit('delete_api_keys', 'ACTIVITY_TYPE_DELETE_API_KEYS', { userId: S.who.userId, apiKeyIds: [mine.apiKeyId] });
      }
    } catch (_) {
      /* it expires within 15 minutes anyway */
    }
    S.stamper = null;
    S.session = null;
    location.hash = '';
    location.reload();
  });
  window.addEventListener('hashchange', route);
  // Leaving the page drops the key; a page brought back from the browser's cache starts over.
  window.addEventListener('pagehide', () => {
    S.stamper = null;
  });
  window.addEventListener('pageshow', (e) => {
    if (e.persisted) location.reload();
  });
});
