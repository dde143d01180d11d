// Tenancy with the stock JS SDK (e2b@2.51.0): a second team sees nothing of the first team's
// sandboxes; one sandbox's credentials open no other sandbox.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'

import { Sandbox, SandboxNotFoundError } from 'e2b'

import { startServer, fetchUrl, sandboxHeaders, unique } from './server.mjs'

let husk
let otherKey
before(async () => {
  husk = await startServer()
  otherKey = husk.createKey('other')
})
after(async () => {
  await husk?.stop()
})

async function listIds(opts) {
  const p = Sandbox.list(opts)
  const ids = new Set()
  while (p.hasNext) for (const s of await p.nextItems()) ids.add(s.sandboxId)
  return ids
}

test('the other team cannot see or touch a sandbox', async (t) => {
  assert.notEqual(otherKey, husk.adminKey)
  const tag = unique('jstenant')
  const mine = await husk.sandbox(t, { metadata: { suite: tag } })
  const theirs = husk.opts(otherKey)

  assert.ok(!(await listIds(theirs)).has(mine.sandboxId))
  assert.equal((await listIds({ ...theirs, query: { metadata: { suite: tag } } })).size, 0)
  await assert.rejects(Sandbox.getInfo(mine.sandboxId, theirs), SandboxNotFoundError)
  await assert.rejects(Sandbox.connect(mine.sandboxId, theirs), SandboxNotFoundError)
  await assert.rejects(Sandbox.setTimeout(mine.sandboxId, 5_000, theirs), SandboxNotFoundError)
  await assert.rejects(Sandbox.getMetrics(mine.sandboxId, theirs), SandboxNotFoundError)
  assert.equal(await Sandbox.kill(mine.sandboxId, theirs), false)

  assert.equal(await mine.isRunning(), true)
  const info = await mine.getInfo()
  assert.ok(info.endAt - info.startedAt > 60_000)
  assert.equal((await mine.commands.run('echo still mine')).stdout, 'still mine\n')
})

test('each team lists and drives its own', async (t) => {
  const tag = unique('jsboth')
  const mine = await husk.sandbox(t, { metadata: { suite: tag } })
  const theirs = await husk.sandbox(t, { metadata: { suite: tag }, apiKey: otherKey })
  const q = { query: { metadata: { suite: tag } } }
  assert.deepEqual([...(await listIds({ ...husk.opts(otherKey), ...q }))], [theirs.sandboxId])
  assert.ok((await listIds({ ...husk.opts(), ...q })).has(mine.sandboxId))
  await mine.files.write('/tmp/team-file', 'a')
  assert.equal(await theirs.files.exists('/tmp/team-file'), false)
  await theirs.files.write('/tmp/team-file', 'b')
  assert.equal(await mine.files.read('/tmp/team-file'), 'a')
})

test('access tokens and signatures are per sandbox', async (t) => {
  const a = await husk.rawSandbox(t)
  const b = await husk.rawSandbox(t, otherKey)
  assert.notEqual(a.envdAccessToken, b.envdAccessToken)
  const aSbx = await Sandbox.connect(a.sandboxID, husk.opts())
  await aSbx.files.write('/tmp/a-secret', 'only a')

  const stat = await husk.http('POST', '/filesystem.Filesystem/Stat', {
    headers: {
      ...sandboxHeaders(a.sandboxID, b.envdAccessToken),
      'Content-Type': 'application/json',
      'Connect-Protocol-Version': '1',
    },
    body: JSON.stringify({ path: '/tmp/a-secret' }),
  })
  assert.equal(stat.status, 401)
  assert.match(stat.text.toLowerCase(), /unauthorized/)
  const files = await husk.http('GET', '/files?path=/tmp/a-secret', { headers: sandboxHeaders(a.sandboxID, b.envdAccessToken) })
  assert.equal(files.status, 401)
  assert.ok(!files.text.includes('only a'))

  const url = await aSbx.downloadUrl('/tmp/a-secret')
  assert.equal((await fetchUrl(url, a.sandboxID)).status, 200)
  const cross = await fetchUrl(url, b.sandboxID)
  assert.equal(cross.status, 401)
})
