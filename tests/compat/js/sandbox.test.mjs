// Sandbox lifecycle with the stock JS SDK (e2b@2.51.0): create, kill, info, list with filters
// and pagination, timeouts, connect, metrics, and configuration through environment variables.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'

import { Sandbox, SandboxError, SandboxNotFoundError } from 'e2b'

import { startServer, unique, waitFor } from './server.mjs'

let husk
before(async () => {
  husk = await startServer()
})
after(async () => {
  await husk?.stop()
})

async function listAll(opts) {
  const p = Sandbox.list(opts)
  const out = []
  while (p.hasNext) out.push(...(await p.nextItems()))
  return out
}

test('create, run, kill', async (t) => {
  const sbx = await husk.sandbox(t)
  assert.match(sbx.sandboxId, /^[a-z0-9]+$/)
  assert.equal(await sbx.isRunning(), true)
  const r = await sbx.commands.run('echo hi')
  assert.equal(r.stdout, 'hi\n')
  assert.equal(r.exitCode, 0)
  assert.equal(await sbx.kill(), true)
  assert.equal(await sbx.isRunning(), false)
  await assert.rejects(Sandbox.getInfo(sbx.sandboxId, husk.opts()), SandboxNotFoundError)
  assert.equal(await Sandbox.kill(sbx.sandboxId, husk.opts()), false)
  await assert.rejects(sbx.commands.run('echo gone', { timeoutMs: 10_000 }), SandboxError)
  const health = await husk.http('GET', '/health', {
    headers: { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '49983' },
  })
  assert.equal(health.status, 502)
  assert.match(JSON.parse(health.text).message, /The sandbox was not found/)
})

test('kill of an unknown id is false', async () => {
  assert.equal(await Sandbox.kill('nosuchsandbox0000000', husk.opts()), false)
})

test('getInfo fields', async (t) => {
  const before = Date.now() - 5000
  const sbx = await husk.sandbox(t, { timeoutMs: 300_000, metadata: { purpose: 'info' } })
  const info = await sbx.getInfo()
  assert.equal(info.sandboxId, sbx.sandboxId)
  assert.ok(info.templateId === 'base' || info.name === 'base', JSON.stringify(info))
  assert.deepEqual(info.metadata, { purpose: 'info' })
  assert.equal(info.state, 'running')
  assert.ok(info.startedAt instanceof Date && info.endAt instanceof Date)
  assert.ok(info.startedAt.getTime() >= before && info.startedAt.getTime() <= Date.now() + 5000)
  const life = (info.endAt - info.startedAt) / 1000
  assert.ok(life >= 290 && life <= 310, `life ${life}`)
  assert.ok(info.cpuCount > 0)
  assert.ok(info.memoryMB > 0)
  assert.match(info.envdVersion, /^\d+\.\d+\.\d+/)
  const same = await Sandbox.getInfo(sbx.sandboxId, husk.opts())
  assert.deepEqual(same.metadata, info.metadata)
})

test('list filters by metadata and state, paginates', async (t) => {
  const tag = unique('jslist')
  const ids = new Set()
  for (let i = 0; i < 3; i++) ids.add((await husk.sandbox(t, { metadata: { suite: tag, i: String(i) } })).sandboxId)
  await husk.sandbox(t, { metadata: { suite: unique('other') } })

  const found = await listAll({ ...husk.opts(), query: { metadata: { suite: tag } } })
  assert.deepEqual(new Set(found.map((s) => s.sandboxId)), ids)
  assert.ok(found.every((s) => s.state === 'running' && s.metadata.suite === tag))

  const one = await listAll({ ...husk.opts(), query: { metadata: { suite: tag, i: '1' } } })
  assert.equal(one.length, 1)
  assert.equal(one[0].metadata.i, '1')

  const paused = await listAll({ ...husk.opts(), query: { metadata: { suite: tag }, state: ['paused'] } })
  assert.deepEqual(paused, [])
  const running = await listAll({ ...husk.opts(), query: { metadata: { suite: tag }, state: ['running'] } })
  assert.equal(running.length, 3)

  const p = Sandbox.list({ ...husk.opts(), query: { metadata: { suite: tag } }, limit: 1 })
  const pages = []
  while (p.hasNext) {
    const items = await p.nextItems()
    assert.ok(items.length <= 1)
    pages.push(items.map((s) => s.sandboxId))
    assert.ok(pages.length <= 5, `pagination does not end: ${JSON.stringify(pages)}`)
  }
  assert.deepEqual(new Set(pages.flat()), ids)
  assert.equal(pages.flat().length, 3)
  assert.ok(!p.nextToken)
})

test('metadata with reserved characters', async (t) => {
  const tag = unique('jsenc')
  const odd = { 'a b': 'c&d=e', suite: tag }
  const sbx = await husk.sandbox(t, { metadata: odd })
  await husk.sandbox(t, { metadata: { suite: tag, 'a b': 'other' } })
  const found = await listAll({ ...husk.opts(), query: { metadata: { 'a b': 'c&d=e', suite: tag } } })
  assert.deepEqual(
    found.map((s) => s.sandboxId),
    [sbx.sandboxId],
  )
  assert.deepEqual(found[0].metadata, odd)
})

test('timeout at create sets the end', async (t) => {
  const sbx = await husk.sandbox(t, { timeoutMs: 45_000 })
  const info = await sbx.getInfo()
  const life = (info.endAt - info.startedAt) / 1000
  assert.ok(life >= 40 && life <= 50, `life ${life}`)
})

test('setTimeout shortens, then the sandbox disappears', { timeout: 90_000 }, async (t) => {
  const sbx = await husk.sandbox(t, { timeoutMs: 300_000 })
  await sbx.setTimeout(120_000)
  const left = ((await sbx.getInfo()).endAt - Date.now()) / 1000
  assert.ok(left >= 110 && left <= 125, `left ${left}`)
  await sbx.setTimeout(2_000)
  await waitFor(async () => !(await sbx.isRunning()), 40_000, 'the sandbox to expire', 500)
  await assert.rejects(Sandbox.getInfo(sbx.sandboxId, husk.opts()), SandboxNotFoundError)
  assert.equal(await Sandbox.kill(sbx.sandboxId, husk.opts()), false)
})

test('a sandbox expires after its own timeout', { timeout: 90_000 }, async (t) => {
  const sbx = await husk.sandbox(t, { timeoutMs: 3_000 })
  assert.equal(await sbx.isRunning(), true)
  await waitFor(async () => !(await sbx.isRunning()), 40_000, 'the sandbox to expire', 500)
  await assert.rejects(sbx.getInfo(), SandboxNotFoundError)
})

test('connect extends, never shortens', async (t) => {
  const sbx = await husk.sandbox(t, { timeoutMs: 60_000 })
  const end0 = (await sbx.getInfo()).endAt
  const same = await Sandbox.connect(sbx.sandboxId, { ...husk.opts(), timeoutMs: 600_000 })
  assert.equal(same.sandboxId, sbx.sandboxId)
  const end1 = (await same.getInfo()).endAt
  assert.ok(end1 - end0 >= 500_000, `${end0} -> ${end1}`)
  await Sandbox.connect(sbx.sandboxId, { ...husk.opts(), timeoutMs: 10_000 })
  const end2 = (await sbx.getInfo()).endAt
  assert.ok(end2 - end1 >= -1000, `${end1} -> ${end2}`)
  await sbx.files.write('/tmp/connected', 'via first')
  assert.equal(await same.files.read('/tmp/connected'), 'via first')
  // Instance variant.
  assert.equal(await sbx.connect({ timeoutMs: 900_000 }), sbx)
  assert.ok((await sbx.getInfo()).endAt - Date.now() >= 880_000)
})

test('connect to unknown or killed sandbox', async (t) => {
  await assert.rejects(Sandbox.connect('nosuchsandbox0000000', husk.opts()), SandboxNotFoundError)
  const sbx = await husk.sandbox(t)
  await sbx.kill()
  await assert.rejects(Sandbox.connect(sbx.sandboxId, husk.opts()), SandboxNotFoundError)
})

test('metrics', async (t) => {
  const sbx = await husk.sandbox(t)
  const found = await waitFor(
    async () => (await sbx.getMetrics()).filter((m) => m.memTotal > 0),
    30_000,
    'a metric with memTotal > 0',
    500,
  )
  const m = found.at(-1)
  assert.ok(m.cpuCount > 0)
  assert.ok(m.memUsed > 0 && m.memUsed <= m.memTotal)
  assert.ok(m.diskTotal > 0 && m.diskUsed <= m.diskTotal)
  assert.ok(m.timestamp instanceof Date)
  const stat = await Sandbox.getMetrics(sbx.sandboxId, { ...husk.opts(), start: new Date(Date.now() - 300_000), end: new Date(Date.now() + 60_000) })
  assert.ok(stat.some((x) => x.memTotal > 0))
  // A range before the sandbox existed has no samples.
  const before = await Sandbox.getMetrics(sbx.sandboxId, {
    ...husk.opts(),
    start: new Date(Date.now() - 7_200_000),
    end: new Date(Date.now() - 3_600_000),
  })
  assert.deepEqual(before, [])
  await assert.rejects(Sandbox.getMetrics('nosuchsandbox0000000', husk.opts()), SandboxNotFoundError)
})

test('sandbox envs at create', async (t) => {
  const sbx = await husk.sandbox(t, { envs: { JS_A: 'alpha', JS_B: 'with space' } })
  assert.equal((await sbx.commands.run('echo "$JS_A|$JS_B"')).stdout, 'alpha|with space\n')
})

test('configuration from environment variables only', async (t) => {
  const saved = { ...process.env }
  process.env.E2B_API_URL = husk.url
  process.env.E2B_SANDBOX_URL = husk.url
  process.env.E2B_API_KEY = husk.adminKey
  let sbx
  try {
    sbx = await Sandbox.create({ timeoutMs: 60_000 })
    assert.equal((await sbx.commands.run('echo from-env')).stdout, 'from-env\n')
    await sbx.files.write('/tmp/env.txt', 'env')
    assert.equal(await sbx.files.read('/tmp/env.txt'), 'env')
    const listed = await listAll({})
    assert.ok(listed.some((s) => s.sandboxId === sbx.sandboxId))
    const again = await Sandbox.connect(sbx.sandboxId)
    assert.equal((await again.commands.run('echo again')).stdout, 'again\n')
    assert.equal(await sbx.kill(), true)
    assert.equal(await sbx.isRunning(), false)
  } finally {
    if (sbx) await Sandbox.kill(sbx.sandboxId, husk.opts()).catch(() => {})
    for (const k of ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_API_KEY']) {
      if (saved[k] === undefined) delete process.env[k]
      else process.env[k] = saved[k]
    }
  }
})
