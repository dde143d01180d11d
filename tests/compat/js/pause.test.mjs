// Pause and resume with the stock JS SDK (e2b@2.51.0): a full pause (state, lists, calls to a
// paused sandbox, connect resumes it with its files, processes and envs), a filesystem pause
// (`keepMemory: false`: files kept, processes gone), pause at the timeout with and without
// auto-resume, and errors (killed sandboxes, another team, kill of a paused sandbox).
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { existsSync } from 'node:fs'
import { join } from 'node:path'
import { randomInt } from 'node:crypto'

import { Sandbox, SandboxError, SandboxNotFoundError } from 'e2b'

import { startServer, unique, waitFor } from './server.mjs'

// Calls that must fail on a paused sandbox get a short budget: a bug must not hang the test.
const SHORT = { timeoutMs: 10_000, requestTimeoutMs: 10_000 }

let husk
let otherKey
before(async () => {
  husk = await startServer()
  otherKey = husk.createKey('other')
})
after(async () => {
  await husk?.stop()
})

/** { sandboxId: state } of every page. */
async function listed(opts, tag, states) {
  const query = {}
  if (tag) query.metadata = { suite: tag }
  if (states) query.state = states
  const p = Sandbox.list({ ...opts, query })
  const out = {}
  while (p.hasNext) for (const s of await p.nextItems()) out[s.sandboxId] = s.state
  return out
}

async function stateOf(id, opts = husk.opts()) {
  return (await Sandbox.getInfo(id, opts)).state
}

async function waitUntilPaused(id) {
  await waitFor(async () => (await stateOf(id)) === 'paused', 40_000, `sandbox ${id} to be paused`, 250)
}

/** In-sandbox calls to a paused sandbox (no auto-resume) fail; a file read says why. */
async function assertCallsFail(sbx, path) {
  await assert.rejects(sbx.commands.run('true', SHORT), SandboxError)
  await assert.rejects(sbx.files.read(path, SHORT), (e) => {
    assert.ok(e instanceof SandboxError, `${e}`)
    assert.match(e.message, /paused/i)
    return true
  })
}

async function pids(sbx) {
  return new Map((await sbx.commands.list()).map((p) => [p.pid, p]))
}

test('a full pause: paused state and lists, calls fail, connect resumes everything', { timeout: 60_000 }, async (t) => {
  const tag = unique('jspause')
  const sbx = await husk.sandbox(t, { envs: { JS_PAUSE: 'js-env' }, metadata: { suite: tag } })
  const other = await husk.sandbox(t, { metadata: { suite: tag } })
  await sbx.files.write('/home/user/before.txt', 'written before the pause')
  const sleeper = await sbx.commands.run('sleep 1000', { background: true })

  assert.equal(await sbx.pause(), true)
  const info = await sbx.getInfo()
  assert.equal(info.state, 'paused')
  assert.deepEqual(info.metadata, { suite: tag })
  assert.deepEqual(await listed(husk.opts(), tag, ['paused']), { [sbx.sandboxId]: 'paused' })
  assert.deepEqual(await listed(husk.opts(), tag, ['running']), { [other.sandboxId]: 'running' })
  assert.deepEqual(await listed(husk.opts(), tag), { [sbx.sandboxId]: 'paused', [other.sandboxId]: 'running' })
  // Pausing again is a 409: false.
  assert.equal(await Sandbox.pause(sbx.sandboxId, husk.opts()), false)
  assert.equal(await sbx.pause(), false)
  assert.equal(await sbx.isRunning(), false)
  await assertCallsFail(sbx, '/home/user/before.txt')
  assert.equal(await stateOf(sbx.sandboxId), 'paused')

  const same = await Sandbox.connect(sbx.sandboxId, { ...husk.opts(), timeoutMs: 200_000 })
  assert.equal(same.sandboxId, sbx.sandboxId)
  const resumed = await sbx.getInfo()
  assert.equal(resumed.state, 'running')
  const left = (resumed.endAt - Date.now()) / 1000
  assert.ok(left >= 185 && left <= 205, `left ${left}`)
  assert.equal(await sbx.isRunning(), true)
  assert.equal(await sbx.files.read('/home/user/before.txt'), 'written before the pause')
  assert.equal(await same.files.read('/home/user/before.txt'), 'written before the pause')
  const procs = await pids(sbx)
  assert.ok(procs.has(sleeper.pid), `pid ${sleeper.pid} not in ${[...procs.keys()]}`)
  assert.deepEqual(procs.get(sleeper.pid).args, ['-l', '-c', 'sleep 1000'])
  assert.equal((await sbx.commands.run('echo "$JS_PAUSE|$(whoami)"')).stdout, 'js-env|user\n')

  // The instance variant, and a second cycle.
  assert.equal(await sbx.pause(), true)
  assert.equal(await sbx.connect(), sbx)
  assert.equal(await stateOf(sbx.sandboxId), 'running')
  assert.ok((await pids(sbx)).has(sleeper.pid))
  // A background command is reattached to after a resume.
  const waiter = await sbx.commands.run('while [ ! -f /tmp/go ]; do sleep 0.1; done; echo resumed-output', {
    background: true,
  })
  assert.equal(await sbx.pause(), true)
  await sbx.connect()
  const again = await sbx.commands.connect(waiter.pid)
  await sbx.files.write('/tmp/go', '')
  const r = await again.wait()
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, 'resumed-output\n')
})

test('a filesystem pause (keepMemory: false) keeps files, not processes', { timeout: 60_000 }, async (t) => {
  const marker = `sleep ${randomInt(100_000, 1_000_000)}`
  const sbx = await husk.sandbox(t, { envs: { JS_PAUSE: 'fs' }, metadata: { m: 'fs' } })
  await sbx.files.write('/home/user/fs.txt', 'kept')
  await sbx.files.write('/tmp/tmp.txt', 'tmp kept')
  assert.equal(await sbx.files.exists('/etc/issue'), true)
  await sbx.commands.run('mkdir -p /opt/js && printf root > /opt/js/f && printf etc > /etc/js.conf && rm /etc/issue', {
    user: 'root',
  })
  await sbx.commands.run(marker, { background: true })
  assert.ok((await sbx.commands.run('ps -e -o args=')).stdout.includes(marker))

  assert.equal(await sbx.pause({ keepMemory: false }), true)
  assert.equal(await stateOf(sbx.sandboxId), 'paused')
  assert.equal(await sbx.pause({ keepMemory: false }), false)
  await Sandbox.connect(sbx.sandboxId, husk.opts())

  const info = await sbx.getInfo()
  assert.equal(info.state, 'running')
  assert.deepEqual(info.metadata, { m: 'fs' })
  assert.equal(await sbx.files.read('/home/user/fs.txt'), 'kept')
  assert.equal(await sbx.files.read('/tmp/tmp.txt'), 'tmp kept')
  assert.equal(await sbx.files.read('/opt/js/f'), 'root')
  assert.equal(await sbx.files.read('/etc/js.conf'), 'etc')
  assert.equal(await sbx.files.exists('/etc/issue'), false)
  // Gone (by its command line: a fresh sandbox may hand its pid to something else).
  assert.deepEqual(
    (await sbx.commands.list()).filter((p) => p.args.join(' ').includes(marker)),
    [],
  )
  assert.ok(!(await sbx.commands.run('ps -e -o args=')).stdout.includes(marker))
  assert.equal((await sbx.commands.run('echo "$JS_PAUSE|$(whoami)|$(pwd)"')).stdout, 'fs|user|/home/user\n')
})

test('pause at the timeout, with and without auto-resume', { timeout: 75_000 }, async (t) => {
  // Both at once: the waits for their timeouts overlap.
  const plain = await husk.sandbox(t, { timeoutMs: 60_000, lifecycle: { onTimeout: 'pause' } })
  const auto = await husk.sandbox(t, { timeoutMs: 60_000, lifecycle: { onTimeout: 'pause', autoResume: true } })
  assert.deepEqual((await plain.getInfo()).lifecycle, { onTimeout: 'pause', autoResume: false })
  assert.deepEqual((await auto.getInfo()).lifecycle, { onTimeout: 'pause', autoResume: true })
  await plain.files.write('/home/user/f', 'plain')
  await auto.files.write('/home/user/f', 'auto')
  const sleeper = await plain.commands.run('sleep 1000', { background: true })
  await plain.setTimeout(3_000)
  await auto.setTimeout(3_000)
  await Promise.all([waitUntilPaused(plain.sandboxId), waitUntilPaused(auto.sandboxId)])

  // Auto-resume: a command just works, and the sandbox runs again.
  const r = await auto.commands.run('cat /home/user/f', { timeoutMs: 30_000, requestTimeoutMs: 30_000 })
  assert.equal(r.stdout, 'auto')
  assert.equal(await stateOf(auto.sandboxId), 'running')

  // Without: calls fail and leave it paused; connect resumes it, files and processes.
  await assertCallsFail(plain, '/home/user/f')
  assert.equal(await stateOf(plain.sandboxId), 'paused')
  assert.deepEqual((await plain.getInfo()).lifecycle, { onTimeout: 'pause', autoResume: false })
  await Sandbox.connect(plain.sandboxId, { ...husk.opts(), timeoutMs: 60_000 })
  assert.equal(await plain.files.read('/home/user/f'), 'plain')
  assert.ok((await pids(plain)).has(sleeper.pid))
})

test('a sandbox created with a pause timeout pauses at it', { timeout: 60_000 }, async (t) => {
  const sbx = await husk.sandbox(t, { timeoutMs: 3_000, lifecycle: { onTimeout: 'pause' } })
  await sbx.files.write('/home/user/early', 'early')
  await waitUntilPaused(sbx.sandboxId)
  assert.ok(Object.keys(await listed(husk.opts(), undefined, ['paused'])).includes(sbx.sandboxId))
  await sbx.connect({ timeoutMs: 60_000 })
  assert.equal(await sbx.files.read('/home/user/early'), 'early')
})

test('errors: killed sandboxes, another team, kill of a paused sandbox', { timeout: 60_000 }, async (t) => {
  const gone = await husk.sandbox(t)
  assert.equal(await gone.kill(), true)
  await assert.rejects(Sandbox.pause(gone.sandboxId, husk.opts()), SandboxNotFoundError)
  await assert.rejects(gone.pause(), SandboxNotFoundError)
  await assert.rejects(Sandbox.connect(gone.sandboxId, husk.opts()), SandboxNotFoundError)

  const tag = unique('jspauseerr')
  const sbx = await husk.sandbox(t, { metadata: { suite: tag } })
  const theirs = husk.opts(otherKey)
  await assert.rejects(Sandbox.pause(sbx.sandboxId, theirs), SandboxNotFoundError)
  assert.equal(await stateOf(sbx.sandboxId), 'running')
  assert.equal(await sbx.pause(), true)
  await assert.rejects(Sandbox.connect(sbx.sandboxId, theirs), SandboxNotFoundError)
  await assert.rejects(Sandbox.pause(sbx.sandboxId, theirs), SandboxNotFoundError)
  assert.deepEqual(await listed(theirs, tag), {})
  assert.ok(!Object.keys(await listed(theirs, undefined, ['paused'])).includes(sbx.sandboxId))
  assert.equal(await Sandbox.kill(sbx.sandboxId, theirs), false)
  assert.equal(await stateOf(sbx.sandboxId), 'paused')

  assert.equal(await sbx.kill(), true)
  assert.deepEqual(await listed(husk.opts(), tag), {})
  assert.deepEqual(await listed(husk.opts(), tag, ['paused']), {})
  await assert.rejects(Sandbox.connect(sbx.sandboxId, husk.opts()), SandboxNotFoundError)
  await assert.rejects(Sandbox.getInfo(sbx.sandboxId, husk.opts()), SandboxNotFoundError)
  assert.equal(await Sandbox.kill(sbx.sandboxId, husk.opts()), false)
  assert.equal(existsSync(join(husk.stateDir, 'paused', sbx.sandboxId)), false)
})
