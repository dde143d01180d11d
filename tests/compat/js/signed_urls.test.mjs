// Signed file URLs from the stock JS SDK (e2b@2.51.0): downloadUrl / uploadUrl fetched with plain
// fetch, naming the sandbox with the routing headers only (no access token).
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'

import { startServer, fetchUrl, multipart, waitFor } from './server.mjs'

let husk
before(async () => {
  husk = await startServer()
})
after(async () => {
  await husk?.stop()
})

const EXPIRED = '{"code":401,"message":"signature is already expired"}'

function withQuery(url, changes) {
  const u = new URL(url)
  for (const [k, v] of Object.entries(changes)) {
    if (v === undefined) u.searchParams.delete(k)
    else u.searchParams.set(k, v)
  }
  assert.notEqual(u.toString(), url)
  return u.toString()
}

test('download URL works', async (t) => {
  const sbx = await husk.sandbox(t)
  await sbx.files.write('/home/user/dl.txt', 'signed download')
  const url = await sbx.downloadUrl('/home/user/dl.txt')
  assert.ok(url.startsWith(husk.url + '/files?'), url)
  const u = new URL(url)
  assert.equal(u.searchParams.get('path'), '/home/user/dl.txt')
  assert.match(u.searchParams.get('signature'), /^v1_/)
  const r = await fetchUrl(url, sbx.sandboxId)
  assert.equal(r.status, 200)
  assert.equal(r.body.toString(), 'signed download')
})

test('download URL with expiration, then expired', { timeout: 60_000 }, async (t) => {
  const sbx = await husk.sandbox(t)
  await sbx.files.write('/tmp/exp.txt', 'expiring')
  const url = await sbx.downloadUrl('/tmp/exp.txt', { useSignatureExpiration: 3 })
  const exp = Number(new URL(url).searchParams.get('signature_expiration'))
  assert.ok(Math.abs(exp - (Date.now() / 1000 + 3)) <= 2)
  const ok = await fetchUrl(url, sbx.sandboxId)
  assert.equal(ok.status, 200)
  assert.equal(ok.body.toString(), 'expiring')
  const r = await waitFor(
    async () => {
      const x = await fetchUrl(url, sbx.sandboxId)
      return x.status !== 200 ? x : null
    },
    15_000,
    'the signed URL to expire',
    500,
  )
  assert.equal(r.status, 401)
  assert.equal(r.body.toString().trim(), EXPIRED)
})

test('upload URL works; expired upload URL is refused', async (t) => {
  const sbx = await husk.sandbox(t)
  const url = await sbx.uploadUrl('/home/user/up.txt')
  const { body, headers } = multipart('/home/user/up.txt', 'uploaded via signed url')
  const r = await fetchUrl(url, sbx.sandboxId, { method: 'POST', body, headers })
  assert.equal(r.status, 200, r.body.toString())
  assert.equal(await sbx.files.read('/home/user/up.txt'), 'uploaded via signed url')
  assert.equal((await sbx.files.getInfo('/home/user/up.txt')).owner, 'user')

  const late = await sbx.uploadUrl('/tmp/late.txt', { useSignatureExpiration: -30 })
  const m = multipart('/tmp/late.txt', 'too late')
  const r2 = await fetchUrl(late, sbx.sandboxId, { method: 'POST', body: m.body, headers: m.headers })
  assert.equal(r2.status, 401)
  assert.equal(r2.body.toString().trim(), EXPIRED)
  assert.equal(await sbx.files.exists('/tmp/late.txt'), false)
})

test('tampered, re-pathed, re-dated, wrong-operation and unsigned URLs get 401', async (t) => {
  const sbx = await husk.sandbox(t)
  await sbx.files.write('/tmp/a.txt', 'a')
  await sbx.files.write('/tmp/b.txt', 'b')
  const url = await sbx.downloadUrl('/tmp/a.txt', { useSignatureExpiration: 60 })
  const sig = new URL(url).searchParams.get('signature')
  const exp = Number(new URL(url).searchParams.get('signature_expiration'))
  const bad = [
    withQuery(url, { signature: sig.slice(0, -2) + (sig.endsWith('AA') ? 'BB' : 'AA') }),
    withQuery(url, { path: '/tmp/b.txt' }),
    withQuery(url, { signature_expiration: String(exp + 3600) }),
    withQuery(url, { signature_expiration: undefined }),
    withQuery(url, { signature: undefined, signature_expiration: undefined }),
    withQuery(url, { username: 'root' }),
  ]
  for (const u of bad) {
    const r = await fetchUrl(u, sbx.sandboxId)
    assert.equal(r.status, 401, u)
    assert.notEqual(r.body.toString(), 'a')
    assert.notEqual(r.body.toString(), 'b')
  }
  // A read signature cannot write; a write signature cannot read.
  const m = multipart('/tmp/a.txt', 'overwritten')
  assert.equal((await fetchUrl(url, sbx.sandboxId, { method: 'POST', body: m.body, headers: m.headers })).status, 401)
  assert.equal(await sbx.files.read('/tmp/a.txt'), 'a')
  const up = await sbx.uploadUrl('/tmp/a.txt')
  assert.equal((await fetchUrl(up, sbx.sandboxId)).status, 401)
})

test('signed URL for root; dies with the sandbox', async (t) => {
  const sbx = await husk.sandbox(t)
  await sbx.files.write('/root/r.txt', 'root only', { user: 'root' })
  await sbx.commands.run('chmod 600 /root/r.txt', { user: 'root' })
  const url = await sbx.downloadUrl('/root/r.txt', { user: 'root' })
  assert.equal(new URL(url).searchParams.get('username'), 'root')
  const r = await fetchUrl(url, sbx.sandboxId)
  assert.equal(r.status, 200)
  assert.equal(r.body.toString(), 'root only')
  await sbx.kill()
  const gone = await fetchUrl(url, sbx.sandboxId)
  assert.equal(gone.status, 502)
  assert.match(gone.body.toString(), /was not found/)
})

/** Opens a URL as a browser or curl would: no routing header, no token. */
async function fetchPlain(url, { method = 'GET', body, headers = {} } = {}) {
  if (!url.startsWith('http://127.0.0.1:')) throw new Error(`refusing to fetch ${url}`)
  const res = await fetch(url, { method, body, headers, signal: AbortSignal.timeout(20_000) })
  return { status: res.status, body: Buffer.from(await res.arrayBuffer()) }
}

test('signed URLs work for a client that names no sandbox', async (t) => {
  const a = await husk.sandbox(t)
  const b = await husk.sandbox(t)
  await a.files.write('/tmp/same.txt', 'from a')
  await b.files.write('/tmp/same.txt', 'from b')
  for (const [sbx, want] of [
    [a, 'from a'],
    [b, 'from b'],
  ]) {
    const r = await fetchPlain(await sbx.downloadUrl('/tmp/same.txt'))
    assert.equal(r.status, 200)
    assert.equal(r.body.toString(), want)
  }
  const up = await a.uploadUrl('/home/user/plain-up.txt')
  const { body, headers } = multipart('/home/user/plain-up.txt', 'uploaded plainly')
  assert.equal((await fetchPlain(up, { method: 'POST', body, headers })).status, 200)
  assert.equal(await a.files.read('/home/user/plain-up.txt'), 'uploaded plainly')
  assert.equal(await b.files.exists('/home/user/plain-up.txt'), false)

  const expired = await a.downloadUrl('/tmp/same.txt', { useSignatureExpiration: -30 })
  const r = await fetchPlain(expired)
  assert.equal(r.status, 401)
  assert.equal(r.body.toString().trim(), EXPIRED)
  const url = await a.downloadUrl('/tmp/same.txt')
  const bad = await fetchPlain(withQuery(url, { path: '/tmp/other.txt' }))
  assert.equal(bad.status, 401)
  assert.equal(JSON.parse(bad.body.toString()).message, 'invalid signature')
})
