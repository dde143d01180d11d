// Bad input against husk with the stock JS SDK (e2b@2.51.0) and plain fetch: wrong keys, wrong
// access tokens, unknown sandboxes, malformed Connect envelopes, paths leaving the sandbox.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { mkdtempSync, writeFileSync, rmSync, existsSync } from 'node:fs'
import { join, basename } from 'node:path'

import { AuthenticationError, FileNotFoundError, Sandbox, SandboxError } from 'e2b'

import { startServer, sandboxHeaders } from './server.mjs'

let husk
before(async () => {
  husk = await startServer()
})
after(async () => {
  await husk?.stop()
})

const WRONG_KEY = 'e2b_' + '1'.repeat(40)

function envelope(payload, flags = 0) {
  const body = Buffer.from(payload)
  const head = Buffer.alloc(5)
  head[0] = flags
  head.writeUInt32BE(body.length, 1)
  return Buffer.concat([head, body])
}

function streamError(r) {
  // Either a 4xx, or a 200 whose last envelope is end-stream (flag 0x02) with an error.
  if (r.status >= 400 && r.status < 500) return true
  assert.equal(r.status, 200, `status ${r.status}: ${r.text}`)
  let i = 0
  let last
  while (i < r.body.length) {
    assert.ok(r.body.length - i >= 5, 'torn envelope')
    const flags = r.body[i]
    const n = r.body.readUInt32BE(i + 1)
    const payload = r.body.subarray(i + 5, i + 5 + n)
    assert.equal(payload.length, n, 'torn envelope')
    assert.ok(!(flags & 0x02) || i + 5 + n === r.body.length, 'end-stream before the end')
    if (!(flags & 0x02)) assert.ok(!('start' in (JSON.parse(payload).event ?? {})), 'a process started')
    last = { flags, json: JSON.parse(payload.toString() || '{}') }
    i += 5 + n
  }
  assert.ok(last && last.flags & 0x02, 'no end-stream envelope')
  assert.ok(last.json.error?.code, JSON.stringify(last.json))
  return true
}

test('wrong API keys', async () => {
  await assert.rejects(Sandbox.create({ ...husk.opts(WRONG_KEY), timeoutMs: 30_000 }), AuthenticationError)
  await assert.rejects(Sandbox.list(husk.opts(WRONG_KEY)).nextItems(), AuthenticationError)
  for (const headers of [{}, { 'X-API-Key': WRONG_KEY }, { 'X-API-Key': 'nope' }]) {
    const r = await husk.http('GET', '/v2/sandboxes', { headers })
    assert.equal(r.status, 401)
    assert.equal(JSON.parse(r.text).code, 401)
  }
})

test('unknown sandbox: 502 not found', async () => {
  const r = await husk.http('GET', '/health', { headers: sandboxHeaders('nosuchsandbox0000000', 'x') })
  assert.equal(r.status, 502)
  const body = JSON.parse(r.text)
  assert.match(body.message, /The sandbox was not found/)
  assert.equal(await Sandbox.kill('nosuchsandbox0000000', husk.opts()), false)
})

test('wrong access token on envd RPC and /files', async (t) => {
  const raw = await husk.rawSandbox(t)
  for (const token of [undefined, 'wrong-token']) {
    const r = await husk.http('POST', '/filesystem.Filesystem/ListDir', {
      headers: {
        ...sandboxHeaders(raw.sandboxID, token),
        'Content-Type': 'application/json',
        'Connect-Protocol-Version': '1',
      },
      body: JSON.stringify({ path: '/', depth: 1 }),
    })
    assert.equal(r.status, 401)
    assert.match(r.text.toLowerCase(), /unauthorized/)
    const f = await husk.http('GET', '/files?path=/etc/hostname', { headers: sandboxHeaders(raw.sandboxID, token) })
    assert.equal(f.status, 401)
  }
  // Control: the right token works.
  const ok = await husk.http('POST', '/filesystem.Filesystem/Stat', {
    headers: { ...sandboxHeaders(raw.sandboxID, raw.envdAccessToken), 'Content-Type': 'application/json', 'Connect-Protocol-Version': '1' },
    body: JSON.stringify({ path: '/home/user' }),
  })
  assert.equal(ok.status, 200, ok.text)
  assert.equal(JSON.parse(ok.text).entry.type, 'FILE_TYPE_DIRECTORY')
})

test('malformed Connect envelopes get errors, and the server keeps serving', async (t) => {
  const raw = await husk.rawSandbox(t)
  const sbx = await Sandbox.connect(raw.sandboxID, husk.opts())
  const start = JSON.stringify({ process: { cmd: '/bin/bash', args: ['-l', '-c', 'echo ran > /tmp/ran'] }, stdin: false })
  const headers = {
    ...sandboxHeaders(raw.sandboxID, raw.envdAccessToken),
    'Content-Type': 'application/connect+json',
    'Connect-Protocol-Version': '1',
    'Connect-Timeout-Ms': '10000',
  }
  const truncatedHeader = Buffer.from([0, 0, 0])
  const beyond = Buffer.concat([Buffer.from([0, 0, 0, 1, 0]), Buffer.from(start.slice(0, 20))])
  const compressed = envelope(start, 0x01)
  const notJson = envelope('{"process": ')
  const oversize = Buffer.concat([Buffer.from([0, 0x06, 0x40, 0, 0]), Buffer.from(start)])
  for (const body of [truncatedHeader, beyond, compressed, notJson, oversize]) {
    const t0 = Date.now()
    const r = await husk.http('POST', '/process.Process/Start', { headers, body })
    assert.ok(Date.now() - t0 < 12_000)
    assert.ok(streamError(r))
  }
  const unary = await husk.http('POST', '/filesystem.Filesystem/Stat', {
    headers: { ...headers, 'Content-Type': 'application/json' },
    body: '{not json',
  })
  assert.equal(unary.status, 400)
  assert.equal(JSON.parse(unary.text).code, 'invalid_argument')
  assert.equal((await sbx.commands.run('echo alive')).stdout, 'alive\n')
  assert.equal(await sbx.files.exists('/tmp/ran'), false)
})

test('paths cannot leave the sandbox', async (t) => {
  const hostDir = mkdtempSync('/tmp/husk-compat-js-hostonly-')
  const hostFile = join(hostDir, 'secret.txt')
  writeFileSync(hostFile, 'HOST ONLY\n')
  t.after(() => rmSync(hostDir, { recursive: true, force: true }))
  const sbx = await husk.sandbox(t)
  await sbx.commands.run('echo inside > /tmp/marker')
  assert.equal(await sbx.files.read('../../tmp/marker'), 'inside\n')
  await assert.rejects(sbx.files.read(hostFile), FileNotFoundError)
  await assert.rejects(sbx.files.read('../../../..' + hostFile), FileNotFoundError)

  await sbx.commands.run(`ln -s / /home/user/to-root && ln -s /etc /home/user/to-etc && ln -s ${hostDir} /home/user/to-host`)
  const insideHostname = (await sbx.commands.run('cat /etc/hostname 2>/dev/null || echo "<missing>"')).stdout
  if (insideHostname === '<missing>\n') {
    await assert.rejects(sbx.files.read('/home/user/to-etc/hostname'), FileNotFoundError)
  } else {
    assert.equal(await sbx.files.read('/home/user/to-etc/hostname'), insideHostname)
    assert.equal(await sbx.files.read('/home/user/to-root/etc/hostname'), insideHostname)
  }
  await assert.rejects(sbx.files.read('/home/user/to-host/secret.txt'), FileNotFoundError)
  await assert.rejects(sbx.files.read('/home/user/to-root' + hostFile), FileNotFoundError)
  for (const p of ['/proc/1/root', '/proc/self/root']) {
    await assert.rejects(sbx.files.read(p + hostFile, { user: 'root' }), (e) => e instanceof SandboxError || e instanceof AuthenticationError)
  }

  const name = `husk-compat-js-escape-${process.pid}-${Date.now()}`
  await sbx.files.write(`/home/user/to-root/tmp/${name}`, 'through a link')
  assert.equal((await sbx.commands.run(`cat /tmp/${name}`)).stdout, 'through a link')
  assert.equal(existsSync(`/tmp/${name}`), false, 'a sandbox write landed on the host')
  assert.ok(!(await sbx.files.list('/home/user/to-root/tmp')).some((e) => e.name === basename(hostDir)))
})
