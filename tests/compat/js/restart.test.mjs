// Restarts of the server with the stock JS SDK (e2b@2.51.0): a running sandbox outlives a
// `husk serve` stopped with SIGTERM (started with `keep`), and the next server on the same
// state directory takes it up (files, metadata, envs, its running processes, reattached by
// pid); that server, started without `keep` (`--destroy-on-exit`), destroys it at its stop, and
// nothing of it is left on the host.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { existsSync, readFileSync, readdirSync, realpathSync } from 'node:fs'
import { join } from 'node:path'

import { Sandbox, SandboxNotFoundError } from 'e2b'

import { startServer, unique, waitFor } from './server.mjs'

// An in-memory counter: each tick appends "i epoch" to /tmp/ticks and prints "tick i".
const TICKER = 'i=0\nwhile :; do\n  i=$((i+1))\n  echo "$i $(date +%s.%N)" >> /tmp/ticks\n  echo "tick $i"\n  sleep 0.2\ndone\n'

// --- the host's view: a sandbox's PID 1 (a `husk-init` child of the server's spawner) ---

function read(path) {
  try {
    return readFileSync(path, 'utf8')
  } catch {
    return null
  }
}

function children(pid) {
  let tasks = []
  try {
    tasks = readdirSync(`/proc/${pid}/task`)
  } catch {
    return []
  }
  return tasks.flatMap((t) => (read(`/proc/${pid}/task/${t}/children`) ?? '').split(/\s+/).filter(Boolean).map(Number))
}

/** [state, start time] of /proc/PID/stat, or null. */
function stat(pid) {
  const s = read(`/proc/${pid}/stat`)
  if (s === null) return null
  const f = s.slice(s.lastIndexOf(')') + 2).split(' ')
  return [f[0], f[19]]
}

/** Runs (a zombie, dead but not yet reaped, does not), and is the process that started then. */
function alive({ pid, start }) {
  const s = stat(pid)
  return s !== null && s[0] !== 'Z' && s[1] === start
}

function cgroupV2Root() {
  for (const line of read('/proc/self/mountinfo').split('\n')) {
    const [left, right] = line.split(' - ')
    if (right && right.split(' ')[0] === 'cgroup2') return left.split(' ')[4]
  }
  throw new Error('no cgroup2 mount')
}

/** The PID 1s of the sandboxes this server's spawner made (the one child still called "husk"). */
function pid1s(server) {
  const spawners = children(server.process.pid).filter((p) => (read(`/proc/${p}/comm`) ?? '').trim() === 'husk')
  assert.equal(spawners.length, 1, `spawner among ${children(server.process.pid)}`)
  return children(spawners[0])
    .filter((p) => (read(`/proc/${p}/cmdline`) ?? '').startsWith('husk-init'))
    .map((pid) => {
      const line = read(`/proc/${pid}/cgroup`).split('\n').find((l) => l.startsWith('0::'))
      return { pid, start: stat(pid)[1], cgroup: join(cgroupV2Root(), line.slice(3)) }
    })
}

/** Registry lines (/run/husk/sandboxes/s<slot>) keeping a sandbox for the owner `stateDir`. */
function keepLines(stateDir) {
  let owner
  try {
    owner = Buffer.from(realpathSync(stateDir)).toString('hex')
  } catch {
    owner = Buffer.from(stateDir).toString('hex')
  }
  const dir = '/run/husk/sandboxes'
  if (!existsSync(dir)) return []
  return readdirSync(dir).flatMap((e) => (read(join(dir, e)) ?? '').split('\n').filter((l) => l.startsWith(`keep ${owner} `)))
}

function leftovers(pids, stateDir) {
  return [
    ...pids.filter(alive).map((p) => `PID 1 ${p.pid} still runs`),
    ...pids.filter((p) => existsSync(p.cgroup)).map((p) => `cgroup ${p.cgroup} still there`),
    ...keepLines(stateDir).map((l) => `registry: ${l}`),
  ]
}

/**
 * Cleanup after a failure: a server that destroys at its stop whatever an earlier one on
 * `stateDir` kept, stopped once it has taken them up (a SIGTERM during the take-up may kill it
 * before its orderly stop), then the state directory removed (by its stop()).
 */
async function sweep(stateDir) {
  const sweeper = await startServer({ stateDir })
  try {
    await waitFor(() => !/taking them up/.test(sweeper.log()) || /took up/.test(sweeper.log()), 30_000, 'the take-up')
  } finally {
    await sweeper.stop()
  }
}

// --- the sandbox's view ---

async function ticks(sbx) {
  let text
  try {
    text = await sbx.files.read('/tmp/ticks')
  } catch {
    return []
  }
  return text
    .split('\n')
    .slice(0, -1)
    .map((l) => l.split(' ').map(Number))
}

async function counter(sbx) {
  const got = await ticks(sbx)
  return got.length ? got[got.length - 1][0] : 0
}

test('a SIGTERM restart keeps a running sandbox whole; the last server destroys it', { timeout: 120_000 }, async () => {
  const tag = unique('jsrestart')
  const first = await startServer({ keep: true })
  const servers = [first]
  let done = false
  try {
    const sbx = await Sandbox.create({ timeoutMs: 300_000, metadata: { suite: tag }, envs: { E: 'js-kept' }, ...first.opts() })
    const pids = pid1s(first)
    assert.equal(pids.length, 1, JSON.stringify(pids))
    await sbx.files.write('/home/user/f.txt', 'kept across the restart')
    await sbx.files.write('/tmp/ticker.sh', TICKER)
    const ticker = await sbx.commands.run('sh /tmp/ticker.sh', { background: true })
    await waitFor(async () => (await counter(sbx)) >= 3, 30_000, 'the ticker to count to 3')
    const infoBefore = await sbx.getInfo()

    const stopped = await first.halt()
    assert.deepEqual(stopped, { code: 0, signal: null }, first.log())
    assert.match(first.log(), /keep running/)
    const downFrom = Date.now() / 1000
    await waitFor(() => Date.now() / 1000 - downFrom >= 1 && alive(pids[0]), 5_000, '1 s with no server, the sandbox running')
    const downTo = Date.now() / 1000

    // The next server, started without keep: its stop destroys what it took up.
    const second = await startServer({ stateDir: first.stateDir })
    servers.push(second)
    const opts = second.opts()
    const info = await Sandbox.getInfo(sbx.sandboxId, opts)
    assert.deepEqual(info.metadata, { suite: tag })
    assert.equal(info.state, 'running')
    assert.ok(Math.abs(info.endAt - infoBefore.endAt) < 1500, `${info.endAt} vs ${infoBefore.endAt}`)
    const back = await Sandbox.connect(sbx.sandboxId, opts)
    assert.equal(await back.files.read('/home/user/f.txt'), 'kept across the restart')
    assert.equal((await back.commands.run('echo $E')).stdout, 'js-kept\n')

    // The ticker: the same process, counting on, and it counted while no server ran.
    const procs = new Map((await back.commands.list()).map((p) => [p.pid, p]))
    assert.ok(procs.has(ticker.pid), `${ticker.pid} not in ${[...procs.keys()]}`)
    assert.deepEqual(procs.get(ticker.pid).args, ['-l', '-c', 'sh /tmp/ticker.sh'])
    const c1 = await counter(back)
    await waitFor(async () => (await counter(back)) >= c1 + 3, 20_000, 'the ticker to count on')
    const got = await ticks(back)
    assert.deepEqual(
      got.map(([i]) => i),
      got.map((_, k) => k + 1),
      'one shell counted all along',
    )
    assert.ok(got.some(([, t]) => t > downFrom && t < downTo), `no tick between ${downFrom} and ${downTo}`)

    // Reattached by pid: new output streams in.
    const c2 = await counter(back)
    let out = ''
    const handle = await back.commands.connect(ticker.pid, {
      onStdout: (d) => {
        out += d
      },
    })
    const seen = () =>
      out
        .split('\n')
        .slice(0, -1)
        .filter((l) => l.startsWith('tick '))
        .map((l) => Number(l.split(' ')[1]))
    await waitFor(() => seen().some((n) => n > c2), 20_000, 'new ticks on the reattached stream')
    await handle.disconnect()

    const listed = Sandbox.list(opts)
    const ids = []
    while (listed.hasNext) ids.push(...(await listed.nextItems()).map((s) => s.sandboxId))
    assert.ok(ids.includes(sbx.sandboxId), ids.join(' '))

    // The last server's stop destroys it: nothing of it is left.
    const stateDir = second.stateDir
    // (An exit other than an orderly one leaves the state dir for the sweep in `finally`.)
    assert.deepEqual(await second.halt(), { code: 0, signal: null }, second.log())
    await second.stop()
    done = true
    await waitFor(() => leftovers(pids, stateDir).length === 0, 10_000, 'the sandbox to be gone from the host').catch(() => {
      assert.fail(`left on the host: ${leftovers(pids, stateDir).join('; ')}`)
    })
  } finally {
    if (!done) {
      // A failure half-way: stop what runs, then let a destroying server take up what was kept.
      for (const s of servers) await s.halt().catch(() => {})
      await sweep(first.stateDir)
    }
  }
})

test("a taken-up sandbox is not another team's", { timeout: 120_000 }, async () => {
  const first = await startServer({ keep: true })
  const servers = [first]
  let done = false
  try {
    const otherKey = first.createKey('other')
    const sbx = await Sandbox.create({ timeoutMs: 300_000, ...first.opts() })
    const pids = pid1s(first)
    await first.halt()
    const second = await startServer({ stateDir: first.stateDir })
    servers.push(second)
    await assert.rejects(Sandbox.connect(sbx.sandboxId, second.opts(otherKey)), SandboxNotFoundError)
    assert.equal(await Sandbox.kill(sbx.sandboxId, second.opts(otherKey)), false)
    const r = await second.http('GET', `/sandboxes/${sbx.sandboxId}`)
    assert.equal(r.status, 401, r.text)
    const back = await Sandbox.connect(sbx.sandboxId, second.opts())
    assert.equal((await back.commands.run('echo mine')).stdout, 'mine\n')
    const stateDir = second.stateDir
    assert.deepEqual(await second.halt(), { code: 0, signal: null }, second.log())
    await second.stop()
    done = true
    await waitFor(() => leftovers(pids, stateDir).length === 0, 10_000, 'the sandbox to be gone from the host')
  } finally {
    if (!done) {
      for (const s of servers) await s.halt().catch(() => {})
      await sweep(first.stateDir)
    }
  }
})
