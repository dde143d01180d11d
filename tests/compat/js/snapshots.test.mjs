// Snapshots and forks with the stock JS SDK (e2b@2.51.0): `sbx.createSnapshot()` and
// `Sandbox.create(snapshotId)` (files of that moment, the source going on), names and tags (and
// every way to name a snapshot, a name taken over), `listSnapshots` (newest first, filters,
// pages), `Sandbox.deleteSnapshot` (sandboxes standing on a deleted snapshot go on),
// `sbx.fork()` (files, envs, metadata, network, own ids and tokens), the errors (paused,
// unknown, another team, bad names and counts, no key) and forks over the team's quota.
// Every test kills what it made and deletes its snapshots, pass or fail.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { execFileSync } from 'node:child_process'
import { existsSync, readdirSync } from 'node:fs'
import { join } from 'node:path'
import { randomInt } from 'node:crypto'

import {
  AuthenticationError,
  RateLimitError,
  Sandbox,
  SandboxError,
  SandboxNotFoundError,
} from 'e2b'

import { startServer, unique, waitFor } from './server.mjs'

const UNKNOWN_ID = 'nosuchsandbox0000000'
const BAD_KEY = 'e2b_' + '0'.repeat(40)

let husk
let otherKey
before(async () => {
  husk = await startServer()
  otherKey = husk.createKey('other')
})
after(async () => {
  await husk?.stop()
})

/** A key of a new team of the test's own (exact team-wide lists). */
function teamKey(prefix) {
  const team = unique(prefix)
  return { team, key: husk.createKey(team) }
}

/** Deletes the snapshot at the end of the test (with the key that made it). */
function trackSnapshot(t, snapshotId, key) {
  t.after(async () => {
    await Sandbox.deleteSnapshot(snapshotId, husk.opts(key)).catch(() => {})
  })
  return snapshotId
}

/** `sbx.createSnapshot(opts)`, deleted at the end of the test. */
async function snapshot(t, sbx, opts = {}, key) {
  const info = await sbx.createSnapshot(opts)
  trackSnapshot(t, info.snapshotId, key)
  return info
}

function trackSandbox(t, sandboxId, key) {
  t.after(async () => {
    await Sandbox.kill(sandboxId, husk.opts(key)).catch(() => {})
  })
}

/** `Sandbox.create(template)`, killed at the end of the test. */
async function fromSnapshot(t, template, opts = {}) {
  const { apiKey, ...rest } = opts
  const sbx = await Sandbox.create(template, { timeoutMs: 120_000, ...rest, ...husk.opts(apiKey) })
  trackSandbox(t, sbx.sandboxId, apiKey)
  return sbx
}

/** `sbx.fork(opts)`, every fork that started killed at the end of the test. */
async function fork(t, sbx, opts = {}, key) {
  const forks = await sbx.fork(opts)
  for (const f of forks) if (f instanceof Sandbox) trackSandbox(t, f.sandboxId, key)
  return forks
}

async function listed(paginator) {
  const out = []
  while (paginator.hasNext) out.push(...(await paginator.nextItems()).map((s) => s.snapshotId))
  return out
}

async function listedSandboxes(opts, tag) {
  const p = Sandbox.list({ ...opts, query: { metadata: { suite: tag } } })
  const out = new Set()
  while (p.hasNext) for (const s of await p.nextItems()) out.add(s.sandboxId)
  return out
}

function ownId(info) {
  assert.match(info.snapshotId, /^[a-z0-9]+:default$/)
  return info.snapshotId.slice(0, -':default'.length)
}

function snapshotDirs() {
  const root = join(husk.stateDir, 'snapshots')
  return existsSync(root) ? readdirSync(root) : []
}

function raw(method, path, { key = husk.adminKey, body } = {}) {
  const headers = { 'Content-Type': 'application/json' }
  if (key) headers['X-API-KEY'] = key
  return husk.http(method, path, { headers, body: body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body) })
}

/** Rejects with a SandboxError of this HTTP status. */
function status(code) {
  return (e) => {
    assert.ok(e instanceof SandboxError, `${e?.constructor?.name}: ${e}`)
    assert.equal(e.statusCode, code, `${e}`)
    return true
  }
}

test('createSnapshot, then Sandbox.create from it: the files of that moment; the source goes on', { timeout: 60_000 }, async (t) => {
  const marker = `sleep ${randomInt(100_000, 1_000_000)}`
  const src = await husk.sandbox(t, { envs: { SRC: 'src' }, metadata: { role: 'source' } })
  await src.files.write('/home/user/keep.txt', 'kept')
  await src.files.write('/home/user/changed.txt', 'v1')
  await src.files.write('/home/user/doomed.txt', 'doomed')
  await src.commands.run('mkdir -p /opt/js && printf opt > /opt/js/f && chmod 0600 /opt/js/f && rm /etc/issue', { user: 'root' })
  const sleeper = await src.commands.run(marker, { background: true })

  const info = await snapshot(t, src)
  assert.deepEqual(info.names, [])
  assert.notEqual(ownId(info), src.sandboxId)
  // The source goes on with its id and processes, and its later changes stay its own.
  const srcInfo = await src.getInfo()
  assert.equal(srcInfo.sandboxId, src.sandboxId)
  assert.equal(srcInfo.state, 'running')
  assert.ok((await src.commands.list()).some((p) => p.pid === sleeper.pid))
  await src.files.write('/home/user/changed.txt', 'v2')
  await src.files.remove('/home/user/doomed.txt')
  await src.files.write('/home/user/later.txt', 'later')

  const copy = await fromSnapshot(t, info.snapshotId, { envs: { NEW: 'new' }, metadata: { role: 'copy' } })
  assert.notEqual(copy.sandboxId, src.sandboxId)
  assert.equal(await copy.files.read('/home/user/keep.txt'), 'kept')
  assert.equal(await copy.files.read('/home/user/changed.txt'), 'v1')
  assert.equal(await copy.files.read('/home/user/doomed.txt'), 'doomed')
  assert.equal(await copy.files.exists('/home/user/later.txt'), false)
  assert.equal(await copy.files.exists('/etc/issue'), false)
  assert.equal(await copy.files.read('/opt/js/f', { user: 'root' }), 'opt')
  assert.equal((await copy.commands.run('stat -c "%U %a" /home/user/keep.txt; sudo stat -c "%U %a" /opt/js/f')).stdout, 'user 644\nroot 600\n')
  assert.ok(!(await copy.commands.run('ps -e -o args=')).stdout.includes(marker))
  assert.equal((await copy.commands.run('echo "$NEW|$(whoami)|$(pwd)"')).stdout, 'new|user|/home/user\n')
  assert.deepEqual((await copy.getInfo()).metadata, { role: 'copy' })
  await copy.files.write('/home/user/keep.txt', "the copy's")
  assert.equal(await src.files.read('/home/user/keep.txt'), 'kept')
  // By its bare id too, and the static call.
  const bare = await fromSnapshot(t, ownId(info))
  assert.equal(await bare.files.read('/home/user/keep.txt'), 'kept')
  const again = await Sandbox.createSnapshot(src.sandboxId, husk.opts())
  trackSnapshot(t, again.snapshotId)
  assert.equal(await (await fromSnapshot(t, again.snapshotId)).files.read('/home/user/changed.txt'), 'v2')
  assert.deepEqual(await listed(src.listSnapshots()), [again.snapshotId, info.snapshotId])
})

test('names, tags, every way to name a snapshot, and a name taken over', { timeout: 60_000 }, async (t) => {
  const { team, key } = teamKey('jsnames')
  const a = await husk.sandbox(t, { apiKey: key })
  const b = await husk.sandbox(t, { apiKey: key })
  const name = unique('web')
  await a.files.write('/home/user/which', 'a')
  await b.files.write('/home/user/which', 'b')

  const web = await snapshot(t, a, { name }, key)
  assert.equal(web.snapshotId, `${team}/${name}:default`)
  assert.deepEqual(web.names, [web.snapshotId])
  await a.files.write('/home/user/which', 'a2')
  const tagged = await snapshot(t, a, { name: `${name}:v2` }, key)
  assert.equal(tagged.snapshotId, `${team}/${name}:v2`)
  for (const [ref, want] of [
    [web.snapshotId, 'a'],
    [`${team}/${name}`, 'a'],
    [name, 'a'],
    [tagged.snapshotId, 'a2'],
    [`${name}:v2`, 'a2'],
  ]) {
    const s = await fromSnapshot(t, ref, { apiKey: key })
    assert.equal(await s.files.read('/home/user/which'), want, ref)
  }
  const fromFirst = await fromSnapshot(t, name, { apiKey: key })

  // b takes the name over: one live snapshot of it, b's.
  const second = await snapshot(t, b, { name }, key)
  assert.equal(second.snapshotId, web.snapshotId)
  assert.deepEqual(await listed(Sandbox.listSnapshots({ ...husk.opts(key), name: `${name}:default` })), [second.snapshotId])
  assert.deepEqual(await listed(a.listSnapshots()), [tagged.snapshotId])
  assert.deepEqual(await listed(b.listSnapshots()), [second.snapshotId])
  assert.equal(await (await fromSnapshot(t, name, { apiKey: key })).files.read('/home/user/which'), 'b')
  // What was made from the first goes on.
  assert.equal(await fromFirst.files.read('/home/user/which'), 'a')

  // Bad names: 400, nothing made.
  for (const bad of ['Web', '-web', 'a:b:c', 'team/web', 'a b', 'a'.repeat(65)]) {
    await assert.rejects(a.createSnapshot({ name: bad }), status(400), bad)
  }
  assert.deepEqual(await listed(a.listSnapshots()), [tagged.snapshotId])
})

test('listSnapshots: newest first, filters, pages; another team sees none', { timeout: 60_000 }, async (t) => {
  const { team, key } = teamKey('jslist')
  const opts = husk.opts(key)
  const a = await husk.sandbox(t, { apiKey: key })
  const b = await husk.sandbox(t, { apiKey: key })
  assert.deepEqual(await listed(Sandbox.listSnapshots(opts)), [])
  const n = unique('app')
  const made = [
    await snapshot(t, a, {}, key),
    await snapshot(t, a, { name: `${n}:v1` }, key),
    await snapshot(t, b, { name: `${n}:v2` }, key),
    await snapshot(t, b, {}, key),
  ]
  const ids = made.map((m) => m.snapshotId)
  const newestFirst = [...ids].reverse()

  const p = Sandbox.listSnapshots(opts)
  const all = await p.nextItems()
  assert.equal(p.hasNext, false)
  assert.deepEqual(all, [...made].reverse().map((m) => ({ snapshotId: m.snapshotId, names: m.names })))
  assert.deepEqual(await listed(a.listSnapshots()), [ids[1], ids[0]])
  assert.deepEqual(await listed(Sandbox.listSnapshots({ ...opts, sandboxId: b.sandboxId })), [ids[3], ids[2]])
  assert.deepEqual(await listed(Sandbox.listSnapshots({ ...opts, name: n })), [ids[2], ids[1]])
  assert.deepEqual(await listed(Sandbox.listSnapshots({ ...opts, name: `${team}/${n}:v1` })), [ids[1]])
  assert.deepEqual(await listed(Sandbox.listSnapshots({ ...opts, name: ownId(made[3]) })), [ids[3]])
  assert.deepEqual(await listed(Sandbox.listSnapshots({ ...opts, name: 'nosuch' })), [])

  // Pages.
  const pages = []
  const paged = Sandbox.listSnapshots({ ...opts, limit: 3 })
  while (paged.hasNext) pages.push((await paged.nextItems()).map((s) => s.snapshotId))
  assert.deepEqual(pages, [newestFirst.slice(0, 3), newestFirst.slice(3)])
  const first = Sandbox.listSnapshots({ ...opts, limit: 1 })
  await first.nextItems()
  assert.ok(first.nextToken)
  assert.deepEqual(await listed(Sandbox.listSnapshots({ ...opts, limit: 2, nextToken: first.nextToken })), newestFirst.slice(1))

  // Another team: nothing, whatever the filter.
  const theirs = husk.opts(otherKey)
  assert.ok(!(await listed(Sandbox.listSnapshots(theirs))).some((id) => ids.includes(id)))
  assert.deepEqual(await listed(Sandbox.listSnapshots({ ...theirs, sandboxId: a.sandboxId })), [])
  assert.deepEqual(await listed(Sandbox.listSnapshots({ ...theirs, name: ownId(made[0]) })), [])
  assert.deepEqual(await listed(Sandbox.listSnapshots({ ...theirs, name: `${team}/${n}` })), [])
  // Without a key.
  await assert.rejects(Sandbox.listSnapshots(husk.opts(BAD_KEY)).nextItems(), AuthenticationError)
  const r = await raw('GET', '/snapshots', { key: null })
  assert.equal(r.status, 401, r.text)
})

test('deleteSnapshot: true, then false; sandboxes on it go on; no new ones from it', { timeout: 60_000 }, async (t) => {
  const { key } = teamKey('jsdel')
  const opts = husk.opts(key)
  const src = await husk.sandbox(t, { apiKey: key })
  await src.files.write('/home/user/f', 'snap')
  const info = await snapshot(t, src, {}, key)
  const user = await fromSnapshot(t, info.snapshotId, { apiKey: key })
  await user.files.write('/home/user/mine', "user's")

  assert.equal(await Sandbox.deleteSnapshot(info.snapshotId, husk.opts(otherKey)), false)
  await assert.rejects(Sandbox.deleteSnapshot(info.snapshotId, husk.opts(BAD_KEY)), AuthenticationError)
  assert.deepEqual(await listed(Sandbox.listSnapshots(opts)), [info.snapshotId])
  assert.equal(await Sandbox.deleteSnapshot(info.snapshotId, opts), true)
  assert.equal(await Sandbox.deleteSnapshot(info.snapshotId, opts), false)
  assert.equal(await Sandbox.deleteSnapshot(ownId(info), opts), false)
  assert.deepEqual(await listed(Sandbox.listSnapshots(opts)), [])
  await assert.rejects(fromSnapshot(t, info.snapshotId, { apiKey: key }), status(404))

  // The sandbox made from it goes on, pauses to disk and resumes.
  assert.equal((await user.commands.run('cat /home/user/f /home/user/mine')).stdout, "snapuser's")
  assert.equal(await user.pause({ keepMemory: false }), true)
  await Sandbox.connect(user.sandboxId, opts)
  assert.equal(await user.files.read('/home/user/f'), 'snap')
  assert.equal(await user.files.read('/home/user/mine'), "user's")
  const forks = await fork(t, user, {}, key)
  assert.ok(forks[0] instanceof Sandbox, `${forks[0]}`)
  assert.equal(await forks[0].files.read('/home/user/f'), 'snap')
})

test('fork: files, envs, metadata, network, own ids and tokens; the source goes on', { timeout: 60_000 }, async (t) => {
  const tag = unique('jsfork')
  const network = { allowPublicTraffic: false, maskRequestHost: '${PORT}-forked.example.com' }
  const src = await husk.sandbox(t, { timeoutMs: 150_000, envs: { FORK_ENV: 'from-source' }, metadata: { suite: tag }, network })
  await src.files.write('/home/user/f', 'at fork')
  const sleeper = await src.commands.run('sleep 987654', { background: true })
  const srcInfo = await src.getInfo()

  const forks = await fork(t, src, { count: 3 })
  assert.equal(forks.length, 3)
  assert.ok(forks.every((f) => f instanceof Sandbox), `${forks}`)
  const ids = new Set(forks.map((f) => f.sandboxId))
  assert.equal(ids.size, 3)
  assert.ok(!ids.has(src.sandboxId))
  assert.equal(new Set([src, ...forks].map((s) => s.envdAccessToken)).size, 4)
  assert.equal(new Set([src, ...forks].map((s) => s.trafficAccessToken)).size, 4)
  assert.ok(forks.every((f) => f.trafficAccessToken))

  assert.equal((await src.getInfo()).state, 'running')
  assert.ok((await src.commands.list()).some((p) => p.pid === sleeper.pid))
  await src.files.write('/home/user/f', 'after fork')
  for (const f of forks) {
    const info = await f.getInfo()
    assert.equal(info.state, 'running')
    assert.deepEqual(info.metadata, { suite: tag })
    assert.deepEqual(info.network, srcInfo.network)
    const left = (info.endAt - Date.now()) / 1000
    assert.ok(left >= 135 && left <= 155, `left ${left}`)
    assert.equal(await f.files.read('/home/user/f'), 'at fork')
    assert.equal((await f.commands.run('echo "$FORK_ENV|$(whoami)"')).stdout, 'from-source|user\n')
  }
  await forks[0].files.write('/home/user/f', 'fork 0')
  assert.equal(await forks[1].files.read('/home/user/f'), 'at fork')
  assert.deepEqual(await listedSandboxes(husk.opts(), tag), new Set([...ids, src.sandboxId]))
  assert.deepEqual(await listed(src.listSnapshots()), [])

  // The static call, with a timeout; count omitted: one.
  const more = await Sandbox.fork(src.sandboxId, { ...husk.opts(), timeoutMs: 200_000, count: 2 })
  for (const f of more) if (f instanceof Sandbox) trackSandbox(t, f.sandboxId)
  assert.equal(more.length, 2)
  for (const f of more) {
    assert.ok(f instanceof Sandbox, `${f}`)
    const left = ((await f.getInfo()).endAt - Date.now()) / 1000
    assert.ok(left >= 185 && left <= 205, `left ${left}`)
    assert.equal(await f.files.read('/home/user/f'), 'after fork')
  }
  const one = await fork(t, forks[0])
  assert.equal(one.length, 1)
  assert.equal(await one[0].files.read('/home/user/f'), 'fork 0')
})

test('errors: paused (409), unknown and another team (404), bad counts and bodies (400), no key (401)', { timeout: 60_000 }, async (t) => {
  const tag = unique('jserr')
  const src = await husk.sandbox(t, { metadata: { suite: tag } })
  const theirs = husk.opts(otherKey)

  await assert.rejects(Sandbox.createSnapshot(UNKNOWN_ID, husk.opts()), SandboxNotFoundError)
  await assert.rejects(Sandbox.createSnapshot(src.sandboxId, theirs), SandboxNotFoundError)
  await assert.rejects(Sandbox.fork(UNKNOWN_ID, husk.opts()), SandboxNotFoundError)
  await assert.rejects(Sandbox.fork(src.sandboxId, theirs), SandboxNotFoundError)
  await assert.rejects(Sandbox.createSnapshot(src.sandboxId, husk.opts(BAD_KEY)), AuthenticationError)
  await assert.rejects(Sandbox.fork(src.sandboxId, husk.opts(BAD_KEY)), AuthenticationError)
  // The JS SDK sends any count: the server refuses those out of range.
  for (const count of [0, 21, -1]) {
    await assert.rejects(fork(t, src, { count }), status(400), `count ${count}`)
  }
  for (const body of ['{not json', '{"count": "2"}', '{"timeout": -1}', '[1]']) {
    const r = await raw('POST', `/sandboxes/${src.sandboxId}/fork`, { body })
    assert.equal(r.status, 400, `${body}: ${r.status} ${r.text}`)
  }
  for (const body of ['{not json', '{"name": 5}', '{"memory": "yes"}']) {
    const r = await raw('POST', `/sandboxes/${src.sandboxId}/snapshots`, { body })
    assert.equal(r.status, 400, `${body}: ${r.status} ${r.text}`)
  }
  for (const [method, path] of [
    ['POST', `/sandboxes/${src.sandboxId}/snapshots`],
    ['POST', `/sandboxes/${src.sandboxId}/fork`],
    ['GET', '/snapshots'],
    ['DELETE', '/templates/nosuch'],
  ]) {
    const r = await raw(method, path, { key: null, body: method === 'POST' ? '{}' : undefined })
    assert.equal(r.status, 401, `${method} ${path}: ${r.status}`)
  }
  for (const keepMemory of [true, false]) {
    assert.equal(await src.pause({ keepMemory }), true)
    await assert.rejects(src.createSnapshot(), status(409))
    await assert.rejects(src.fork({ count: 2 }), status(409))
    await Sandbox.connect(src.sandboxId, husk.opts())
  }
  // Nothing was made by any of it; now it works.
  assert.deepEqual(await listed(src.listSnapshots()), [])
  assert.deepEqual(await listedSandboxes(husk.opts(), tag), new Set([src.sandboxId]))
  const info = await snapshot(t, src)
  await assert.rejects(fromSnapshot(t, info.snapshotId, { apiKey: otherKey }), status(404))
  assert.equal((await (await fromSnapshot(t, info.snapshotId)).commands.run('echo ok')).stdout, 'ok\n')
})

test('forks over the team quota come back as RateLimitError entries; the others start', { timeout: 60_000 }, async (t) => {
  const { team, key } = teamKey('jsquota')
  execFileSync(husk.bin, ['key', 'quota', '--team', team, '3', '--state-dir', husk.stateDir], { timeout: 30_000 })
  const src = await husk.sandbox(t, { apiKey: key })
  await src.files.write('/home/user/q', 'q')
  const forks = await fork(t, src, { count: 4 }, key)
  assert.equal(forks.length, 4)
  const started = forks.filter((f) => f instanceof Sandbox)
  const refused = forks.filter((f) => !(f instanceof Sandbox))
  assert.equal(started.length, 2, `${forks}`)
  assert.ok(refused.every((e) => e instanceof RateLimitError), `${refused}`)
  for (const f of started) assert.equal(await f.files.read('/home/user/q'), 'q')
  for (const f of started) assert.equal(await f.kill(), true)
  // With them gone there is room for two again (which two of three start is not ordered).
  const again = await fork(t, src, { count: 3 }, key)
  assert.equal(again.length, 3)
  assert.equal(again.filter((f) => f instanceof Sandbox).length, 2, `${again}`)
  assert.equal(again.filter((f) => f instanceof RateLimitError).length, 1, `${again}`)
})

test('once everything is killed and deleted, STATE_DIR/snapshots holds nothing of it', { timeout: 60_000 }, async (t) => {
  const { key } = teamKey('jsclean')
  const opts = husk.opts(key)
  const before = new Set(snapshotDirs())
  const src = await Sandbox.create({ timeoutMs: 60_000, ...opts })
  trackSandbox(t, src.sandboxId, key)
  const s1 = await snapshot(t, src, {}, key)
  const b = await fromSnapshot(t, s1.snapshotId, { apiKey: key })
  const s2 = await snapshot(t, b, { name: 'stacked' }, key)
  const forks = await fork(t, b, { count: 2 }, key)
  assert.ok(forks.every((f) => f instanceof Sandbox))
  assert.ok(snapshotDirs().filter((d) => !before.has(d)).length >= 3)
  assert.equal(await Sandbox.deleteSnapshot(s1.snapshotId, opts), true)
  assert.ok(snapshotDirs().includes(ownId(s1)), 'a deleted snapshot something stands on keeps its files')
  assert.equal(await Sandbox.deleteSnapshot(s2.snapshotId, opts), true)
  for (const s of [src, b, ...forks]) assert.equal(await Sandbox.kill(s.sandboxId, opts), true)
  await waitFor(
    () => snapshotDirs().every((d) => before.has(d)),
    10_000,
    `the new snapshot files to go (left: ${snapshotDirs().filter((d) => !before.has(d))})`,
  )
})
