// Sandbox egress with the stock JS SDK (e2b@2.51.0), on a simulated internet of the test's own:
// a named network namespace (`husk-compat-<pid>`) with a web server at 198.51.100.10:80, a private
// target at 10.20.30.40:80 (both answer `public host=<Host>` and record every hit) and a name
// server at 198.51.100.53 (tests/compat/netsim/{web,dns}.py, shared with the Python suite), and a
// `husk serve` whose uplink is that namespace. No traffic leaves loopback or that namespace.
//
// The web server also speaks TLS at 198.51.100.10:443, with a certificate from a CA the test makes
// (netsim/certs.py); husk's proxy trusts that CA (`--net-upstream-ca`), the sandboxes do not.
//
// Checks: the default policy reaches the web server and not the private target (refused fast, no
// hit); `network.denyOut` on create, then `updateNetwork` (allow beats deny, `{}` opens again,
// `allowInternetAccess: false` closes); a domain allow list with the callable `denyOut`; a header
// rule with `Secret.fill` (the TLS server gets the key through Node's fetch in the sandbox, the
// sandbox's environment never holds it), replaced and cleared by `updateNetwork`.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { spawn, execFileSync } from 'node:child_process'
import { existsSync, mkdtempSync, openSync, closeSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, resolve, dirname } from 'node:path'
import { fileURLToPath } from 'node:url'

import { randomBytes } from 'node:crypto'

import { Sandbox, Secret } from 'e2b'

import { startServer, waitFor } from './server.mjs'

const HERE = dirname(fileURLToPath(import.meta.url))
const NETSIM = resolve(HERE, '..', 'netsim')
const PUBLIC = '198.51.100.10'
const DNS = '198.51.100.53'
const PRIVATE = '10.20.30.40'
const NAMES = { 'allowed.test': PUBLIC, 'other.test': PUBLIC }
const PROBE_SRC = readFileSync(join(NETSIM, 'probe.py'), 'utf8')
const PROBE_PATH = '/tmp/husk-net-probe.py'
const NETNS_RE = /^husk-compat-(\d+)$/

const ip = (...args) => execFileSync('ip', args, { timeout: 30_000, stdio: ['ignore', 'pipe', 'pipe'] }).toString()

/** Removes `husk-compat-<pid>` namespaces whose creator is gone (a run killed before its
 * teardown); a live process's namespace is never touched. */
function sweepStaleNamespaces() {
  for (const line of ip('netns', 'list').split('\n')) {
    const name = line.split(/\s+/)[0]
    const m = NETNS_RE.exec(name ?? '')
    if (m && !existsSync(`/proc/${m[1]}`)) {
      try {
        ip('netns', 'del', name)
      } catch {
        // raced with someone else's sweep
      }
    }
  }
}

class SimInternet {
  constructor() {
    this.name = `husk-compat-${process.pid}`
    this.dir = mkdtempSync(join(tmpdir(), 'husk-netsim-'))
    this.hitsPath = join(this.dir, 'hits.jsonl')
    writeFileSync(this.hitsPath, '')
    this.procs = []
    this.reaper = null
    this.created = false
    this.closed = false
  }

  get netnsPath() {
    return `/run/netns/${this.name}`
  }

  get caPath() {
    return join(this.dir, 'ca.pem')
  }

  async start() {
    // If this process dies before its teardown, the reaper removes the namespace.
    this.reaper = spawn('python3', [join(NETSIM, 'reaper.py'), this.name, this.dir], { stdio: 'ignore' })
    ip('netns', 'add', this.name)
    this.created = true
    ip('-n', this.name, 'link', 'set', 'lo', 'up')
    for (const a of [PUBLIC, DNS, PRIVATE]) ip('-n', this.name, 'addr', 'add', `${a}/32`, 'dev', 'lo')
    const webReady = join(this.dir, 'web.ready')
    const dnsReady = join(this.dir, 'dns.ready')
    execFileSync('python3', [join(NETSIM, 'certs.py'), this.dir], { timeout: 120_000, stdio: ['ignore', 'pipe', 'pipe'] })
    const [cert, key] = [join(this.dir, 'web.pem'), join(this.dir, 'web.key')]
    this.spawn('web.py', this.hitsPath, webReady, '--tls', cert, key, `${PUBLIC}:80`, `${PUBLIC}:443`, `${PRIVATE}:80`)
    this.spawn('dns.py', dnsReady, `${DNS}:53`, ...Object.entries(NAMES).map(([n, a]) => `${n}=${a}`))
    for (const ready of [webReady, dnsReady]) {
      await waitFor(
        () => {
          const dead = this.procs.find((p) => p.exitCode !== null || p.signalCode !== null)
          if (dead) {
            const logs = ['web.py', 'dns.py'].map((s) => {
              try {
                return readFileSync(join(this.dir, `${s}.log`), 'utf8')
              } catch {
                return ''
              }
            })
            throw new Error(`a netsim helper exited (${dead.exitCode ?? dead.signalCode}): ${logs.join('')}`)
          }
          return existsSync(ready)
        },
        15_000,
        `the simulated internet's ${ready}`,
      )
    }
  }

  spawn(script, ...args) {
    const log = openSync(join(this.dir, `${script}.log`), 'w')
    try {
      this.procs.push(
        spawn('ip', ['netns', 'exec', this.name, 'python3', join(NETSIM, script), ...args], {
          stdio: ['ignore', 'ignore', log],
        }),
      )
    } finally {
      closeSync(log)
    }
  }

  /** Every connection the internet's servers got so far: [{to: 'ADDR:PORT', host}]. */
  hits() {
    return readFileSync(this.hitsPath, 'utf8')
      .split('\n')
      .filter((l) => l.trim())
      .map((l) => JSON.parse(l))
  }

  hitsTo(...addresses) {
    return this.hits().filter((h) => addresses.includes(h.to.slice(0, h.to.lastIndexOf(':'))))
  }

  /** Synchronous, so it also runs from process.on('exit'). Idempotent. */
  close() {
    if (this.closed) return
    this.closed = true
    for (const p of this.procs) {
      if (p.exitCode === null && p.signalCode === null) p.kill('SIGKILL')
    }
    try {
      if (this.created) ip('netns', 'del', this.name)
    } finally {
      rmSync(this.dir, { recursive: true, force: true })
      if (this.reaper && this.reaper.exitCode === null) this.reaper.kill('SIGTERM')
    }
  }
}

let internet
let husk
const closeOnExit = () => internet?.close()

before(async () => {
  sweepStaleNamespaces()
  internet = new SimInternet()
  process.on('exit', closeOnExit)
  try {
    await internet.start()
    husk = await startServer({
      egressArgs: [
        '--egress',
        `netns:${internet.netnsPath}`,
        '--egress-address',
        '203.0.113.2/24',
        '--egress-gateway',
        '203.0.113.1',
        '--net-dns',
        DNS,
        '--net-upstream-ca',
        internet.caPath,
      ],
    })
  } catch (e) {
    internet.close()
    throw e
  }
})

after(async () => {
  try {
    await husk?.stop()
  } finally {
    internet?.close()
    process.off('exit', closeOnExit)
  }
  assert.equal(existsSync(internet.netnsPath), false, `${internet.netnsPath} still exists`)
})

const quote = (s) => `'${s.replace(/'/g, `'\\''`)}'`

/** Runs the probes inside the sandbox: {probe: {r, ms}}. */
async function probe(sbx, ...probes) {
  await sbx.files.write(PROBE_PATH, PROBE_SRC)
  const r = await sbx.commands.run(`python3 ${PROBE_PATH} ${probes.map(quote).join(' ')}`, { timeoutMs: 60_000 })
  return JSON.parse(r.stdout.trim().split('\n').pop())
}

const http = (host) => `http:http://${host}/`
const tcp = (addr, port = 80) => `tcp:${addr}:${port}`
const result = (v, p) => v[p]?.r ?? 'missing'

function assertOk(v, p, body) {
  assert.equal(result(v, p), `ok:${body}`, `${p}: ${JSON.stringify(v)}`)
}

/** Refused at once (a reset, an ICMP error, an unreachable network), never a silent hang. */
function assertRefusedFast(v, p) {
  const r = result(v, p)
  const ms = v[p]?.ms ?? Infinity
  assert.ok(
    ['refused', 'reset', 'closed'].includes(r) || r.startsWith('oserror:') || r.startsWith('urlerror:'),
    `${p}: expected a refusal, got ${r} (${JSON.stringify(v)})`,
  )
  assert.ok(!r.includes('timed out'), `${p}: ${r}`)
  assert.ok(ms < 1500, `${p}: refused only after ${ms} ms (${r})`)
}

test('the default policy reaches the internet and not the private network', async (t) => {
  const sbx = await husk.sandbox(t)
  const v = await probe(sbx, http(PUBLIC), 'dns:allowed.test', tcp(PRIVATE))
  assertOk(v, http(PUBLIC), `public host=${PUBLIC}`)
  assertOk(v, 'dns:allowed.test', PUBLIC)
  assertRefusedFast(v, tcp(PRIVATE))
  assert.ok(
    internet.hits().some((h) => h.to === `${PUBLIC}:80` && h.host === PUBLIC),
    JSON.stringify(internet.hits()),
  )
  assert.deepEqual(internet.hitsTo(PRIVATE), [])
  const info = await sbx.getInfo()
  assert.equal(info.allowInternetAccess, true)
})

test('denyOut on create, then updateNetwork: allow beats deny, {} opens', async (t) => {
  const sbx = await husk.sandbox(t, { network: { denyOut: ['198.51.100.0/24'] } })
  const web = tcp(PUBLIC)
  assertRefusedFast(await probe(sbx, web), web)
  let info = await sbx.getInfo()
  assert.deepEqual(info.network?.denyOut, ['198.51.100.0/24'])

  await sbx.updateNetwork({ allowOut: [PUBLIC], denyOut: ['198.51.100.0/24'] })
  let v = await probe(sbx, web)
  assert.ok(result(v, web).startsWith('ok:HTTP/1.0 200'), JSON.stringify(v))
  info = await Sandbox.getInfo(sbx.sandboxId, husk.opts())
  assert.equal(info.network?.allowOut?.length, 1, JSON.stringify(info.network))

  // Deny again (the update replaces the rules), then everything open.
  await Sandbox.updateNetwork(sbx.sandboxId, { denyOut: ['198.51.100.0/24'] }, husk.opts())
  assertRefusedFast(await probe(sbx, web), web)
  await sbx.updateNetwork({})
  v = await probe(sbx, http(PUBLIC))
  assertOk(v, http(PUBLIC), `public host=${PUBLIC}`)
  assert.deepEqual(internet.hitsTo(PRIVATE), [])
})

test('updateNetwork({ allowInternetAccess: false }) closes the sandbox', async (t) => {
  const sbx = await husk.sandbox(t)
  const web = tcp(PUBLIC)
  let v = await probe(sbx, web)
  assert.ok(result(v, web).startsWith('ok:HTTP/1.0 200'), JSON.stringify(v))
  // The SDK sends this as `allow_internet_access` in the PUT body.
  await sbx.updateNetwork({ allowInternetAccess: false })
  v = await probe(sbx, web)
  assertRefusedFast(v, web)
  assert.equal((await sbx.getInfo()).allowInternetAccess, false)
})

test('a domain allow list with the callable denyOut', async (t) => {
  const sbx = await husk.sandbox(t, {
    network: { allowOut: ['allowed.test'], denyOut: (ctx) => [ctx.allTraffic] },
  })
  const v = await probe(sbx, http('allowed.test'), http('other.test'), tcp(PRIVATE))
  assertOk(v, http('allowed.test'), 'public host=allowed.test')
  assertRefusedFast(v, http('other.test'))
  assertRefusedFast(v, tcp(PRIVATE))
  assert.ok(!internet.hits().some((h) => h.host === 'other.test'), JSON.stringify(internet.hits()))
  assert.deepEqual(internet.hitsTo(PRIVATE), [])
})

test('a header rule with Secret.fill: the server gets the key, the sandbox never holds it', async (t) => {
  const [first, second] = ['sk-js-first-', 'sk-js-second-'].map((p) => p + randomBytes(10).toString('hex'))
  const names = []
  for (const value of [first, second]) {
    const name = `js-key-${randomBytes(4).toString('hex')}`
    await Secret.create(name, value, husk.opts())
    names.push(name)
  }
  const rules = (name) => ({ 'allowed.test': [{ transform: { headers: { Authorization: `Bearer ${Secret.fill(name)}` } } }] })
  const sbx = await husk.sandbox(t, {
    network: { allowOut: ['allowed.test'], denyOut: (ctx) => [ctx.allTraffic], rules: rules(names[0]) },
  })
  // Node's fetch in the sandbox trusts the sandbox's CA (NODE_EXTRA_CA_CERTS).
  const fetchOnce = async () => {
    const before = internet.hits().length
    const r = await sbx.commands.run(
      `node -e "fetch('https://allowed.test/js').then(async (r) => console.log(r.status, await r.text()))"`,
      { timeoutMs: 60_000 },
    )
    assert.equal(r.stdout.trim(), '200 public host=allowed.test', r.stderr)
    const hits = internet.hits().slice(before)
    assert.equal(hits.length, 1, JSON.stringify(hits))
    assert.equal(hits[0].tls, true)
    return hits[0].authorization
  }
  assert.equal(await fetchOnce(), `Bearer ${first}`)
  const env = (await sbx.commands.run("cat /proc/self/environ | tr '\\0' '\\n'")).stdout
  assert.ok(!env.includes(first), 'the key is in the sandbox\'s environment')
  assert.match(env, /^NODE_EXTRA_CA_CERTS=\/etc\/ssl\/certs\/ca-certificates\.crt$/m)
  const info = await sbx.getInfo()
  assert.deepEqual(info.network?.rules, {
    'allowed.test': [{ transform: { headers: { Authorization: `Bearer \${e2b.secrets.${names[0]}}` } } }],
  })

  // Replaced, then cleared (omitted fields are cleared).
  await sbx.updateNetwork({ allowOut: ['allowed.test'], denyOut: (ctx) => [ctx.allTraffic], rules: rules(names[1]) })
  assert.equal(await fetchOnce(), `Bearer ${second}`)
  await sbx.updateNetwork({})
  const r = await sbx.commands.run(
    `node -e "fetch('https://allowed.test/js').then((r) => console.log(r.status), (e) => console.log('error', e.cause?.code))"`,
    { timeoutMs: 60_000 },
  )
  // Straight to the server now, whose CA the sandbox does not trust.
  assert.match(r.stdout.trim(), /^error /, r.stdout)
})
