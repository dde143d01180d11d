// Shared helpers for husk's JS compatibility tests (stock `e2b@2.51.0`, node:test).
//
// startServer() runs `husk serve --listen 127.0.0.1:0 --state-dir <fresh temp dir>`, waits for
// its "listening on http://127.0.0.1:PORT" line, reads the admin key, and returns helpers;
// stop() sends SIGTERM and waits for the exit, then removes the state dir; halt() does the same
// but keeps the state dir, for a next server started on it (`stateDir`).

import { spawn, execFileSync, execFile } from 'node:child_process'
import { mkdtempSync, readFileSync, rmSync, existsSync, accessSync, constants } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, resolve, dirname } from 'node:path'
import { fileURLToPath } from 'node:url'
import { randomBytes, randomUUID } from 'node:crypto'

import { Sandbox } from 'e2b'

const HERE = dirname(fileURLToPath(import.meta.url))
const REPO_ROOT = resolve(HERE, '..', '..', '..')
const DEFAULT_BIN = join(REPO_ROOT, 'target', 'x86_64-unknown-linux-gnu', 'debug', 'husk')
/**
 * Lazily unmounts whatever is mounted at or beneath `dir`, deepest first, then removes it: a
 * server's workspace file systems stay mounted after it stops (by design).
 */
function removeStateDir(dir) {
  let lines = []
  try {
    lines = readFileSync('/proc/self/mountinfo', 'utf8').split('\n')
  } catch {
    // no mounts to see: nothing of ours can be mounted either
  }
  const mine = lines
    .map((l) => l.split(' ')[4])
    .filter((p) => p && (p === dir || p.startsWith(dir + '/')))
    .sort((a, b) => b.length - a.length)
  for (const p of mine) {
    try {
      execFileSync('umount', ['-l', p], { stdio: 'ignore' })
    } catch {
      // already gone
    }
  }
  rmSync(dir, { recursive: true, force: true })
}

const LISTEN_RE = /listening on http:\/\/127\.0\.0\.1:(\d+)/
const KEY_RE = /^e2b_[0-9a-f]{40}$/
export const ENVD_PORT = 49983
export const JUPYTER_PORT = 49999
// husk's preset templates (templates/README.md), and the layer cache the tests share with the
// cargo tests and the Python suite: layers are keyed by content, so a machine bootstraps Debian once.
export const PRESETS_DIR = join(REPO_ROOT, 'templates')
export const LAYER_CACHE = '/var/tmp/husk-test-layers'

export function huskBinary() {
  const bin = process.env.HUSK_BIN || DEFAULT_BIN
  try {
    accessSync(bin, constants.X_OK)
  } catch {
    throw new Error(`husk binary not found at ${bin}: build husk first: cargo build`)
  }
  return bin
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

/** Calls `check` until it returns something truthy or `timeoutMs` passes. */
export async function waitFor(check, timeoutMs, what, intervalMs = 100) {
  const end = Date.now() + timeoutMs
  for (;;) {
    const value = await check()
    if (value) return value
    if (Date.now() >= end) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`)
    await sleep(intervalMs)
  }
}

export function unique(prefix = 't') {
  return `${prefix}-${randomBytes(6).toString('hex')}`
}

/**
 * Starts `husk serve`. `egressArgs`: its egress flags; by default `--egress off` (network.test.mjs
 * passes `--egress netns:PATH ...` for a simulated internet of its own). Its sandboxes end when it
 * stops (`--destroy-on-exit`), unless `keep`: then they outlive it, as husk's default, for the
 * next server on the same state directory to take up. `stateDir`: an earlier server's state
 * directory (a restart; stop that one with halt(), which keeps it), else a fresh one.
 */
export async function startServer({
  startupTimeoutMs = 30_000,
  egressArgs = ['--egress', 'off'],
  keep = false,
  stateDir = undefined,
} = {}) {
  if (process.getuid && process.getuid() !== 0) {
    throw new Error('husk serve needs root (namespaces, cgroups, mounts): run as root')
  }
  const bin = huskBinary()
  // A server that fails to start removes the state dir only if it made it.
  const ownStateDir = stateDir === undefined
  stateDir ??= mkdtempSync(join(tmpdir(), 'husk-compat-js-'))
  // No sandbox egress unless the caller gives its own (never the host's routing in tests: the
  // network tests give their server a simulated internet of their own).
  if (!egressArgs.some((a) => a.startsWith('--egress'))) egressArgs = [...egressArgs, '--egress', 'off']
  // A test's server takes its sandboxes with it when it stops (by default they outlive it),
  // unless `keep`.
  const args = ['serve', '--listen', '127.0.0.1:0', '--state-dir', stateDir, ...(keep ? [] : ['--destroy-on-exit']), ...egressArgs]
  // With setpriv (util-linux) the server gets SIGTERM if this process dies without stopping
  // it, so it still cleans up its sandboxes; setpriv execs husk in place (same pid).
  const setpriv = ['/usr/bin/setpriv', '/bin/setpriv'].find((p) => existsSync(p))
  const child = setpriv
    ? spawn(setpriv, ['--pdeathsig', 'TERM', bin, ...args], { stdio: ['ignore', 'pipe', 'pipe'] })
    : spawn(bin, args, { stdio: ['ignore', 'pipe', 'pipe'] })
  const killOnExit = () => {
    if (exited === null) child.kill('SIGTERM')
  }
  process.on('exit', killOnExit)
  let log = ''
  let exited = null
  const exitPromise = new Promise((res) => {
    child.on('exit', (code, signal) => {
      exited = { code, signal }
      res(exited)
    })
  })
  let onLine
  const listening = new Promise((res, rej) => {
    onLine = () => {
      const m = LISTEN_RE.exec(log)
      if (m) res(Number(m[1]))
    }
    child.on('error', rej)
    exitPromise.then((e) =>
      rej(new Error(`husk serve exited (${JSON.stringify(e)}) before listening:\n${log.slice(-4000)}`)),
    )
  })
  const append = (chunk) => {
    log += chunk.toString()
    if (log.length > 200_000) log = log.slice(-100_000)
    onLine()
  }
  child.stdout.on('data', append)
  child.stderr.on('data', append)

  let timer
  const timeout = new Promise((_, rej) => {
    timer = setTimeout(
      () => rej(new Error(`husk serve did not log "listening on" within ${startupTimeoutMs} ms:\n${log.slice(-4000)}`)),
      startupTimeoutMs,
    )
  })

  let url = null
  let adminKey = null
  const keys = new Map()
  // Every test kills what it made; anything still running at the end is a leak in a test.
  const warnAboutLeftovers = async () => {
    const left = new Set()
    for (const key of new Set([adminKey, ...keys.values()])) {
      if (!key) continue
      try {
        const p = Sandbox.list({ apiUrl: url, sandboxUrl: url, apiKey: key, requestTimeoutMs: 10_000 })
        while (p.hasNext) for (const s of await p.nextItems()) left.add(s.sandboxId)
      } catch {
        // the server may already be unusable; stopping it matters more
      }
    }
    if (left.size) console.warn(`warning: ${left.size} sandbox(es) still running at the end: ${[...left].join(' ')}`)
  }

  // SIGTERM and wait for the exit; the state dir stays.
  const halt = async (timeoutMs = 60_000) => {
    process.off('exit', killOnExit)
    if (exited === null) {
      child.kill('SIGTERM')
      let t2
      const res = await Promise.race([
        exitPromise,
        new Promise((r) => {
          t2 = setTimeout(() => r(null), timeoutMs)
        }),
      ])
      clearTimeout(t2)
      if (res === null) {
        child.kill('SIGKILL')
        await exitPromise
        throw new Error(`husk serve did not exit within ${timeoutMs} ms of SIGTERM; killed it`)
      }
    }
    return exited
  }

  const stop = async (timeoutMs = 60_000) => {
    process.off('exit', killOnExit)
    if (exited === null && url) await warnAboutLeftovers()
    try {
      return await halt(timeoutMs)
    } finally {
      removeStateDir(stateDir)
    }
  }

  let port
  try {
    port = await Promise.race([listening, timeout])
    const keyFile = join(stateDir, 'admin.key')
    await waitFor(() => existsSync(keyFile) && readFileSync(keyFile, 'utf8').trim(), 10_000, 'admin.key')
    clearTimeout(timer)
  } catch (e) {
    clearTimeout(timer)
    await (ownStateDir ? stop() : halt()).catch(() => {})
    throw e
  }
  adminKey = readFileSync(join(stateDir, 'admin.key'), 'utf8').trim()
  if (!KEY_RE.test(adminKey)) {
    await (ownStateDir ? stop() : halt()).catch(() => {})
    throw new Error(`admin.key holds ${JSON.stringify(adminKey)}, not e2b_<40 hex>`)
  }
  url = `http://127.0.0.1:${port}`

  // Safety net: an SDK call that forgot its per-call URLs still reaches this server and nothing
  // else. No API key is set, so such a call fails loudly instead of passing.
  process.env.E2B_API_URL = url
  process.env.E2B_SANDBOX_URL = url
  // The volume content API: the SDK does not look for it at E2B_API_URL.
  process.env.E2B_VOLUME_API_URL = url
  delete process.env.E2B_API_KEY
  delete process.env.E2B_DOMAIN
  delete process.env.E2B_DEBUG

  const server = {
    url,
    port,
    adminKey,
    stateDir,
    bin,
    log: () => log,
    stop,
    halt,
    /** The server's process (e.g. to kill it outright: `server.process.kill('SIGKILL')`). */
    process: child,
    /** Resolves to { code, signal } once the server has exited. */
    exited: () => exitPromise,
    /** Per-call SDK connection options pointing at this server. */
    opts(apiKey, extra = {}) {
      return { apiUrl: url, sandboxUrl: url, apiKey: apiKey ?? adminKey, requestTimeoutMs: 30_000, ...extra }
    },
    /** `husk key create --team NAME`: a key of another team (cached per team). */
    createKey(team) {
      if (keys.has(team)) return keys.get(team)
      const out = execFileSync(bin, ['key', 'create', '--team', team, '--state-dir', stateDir], {
        timeout: 30_000,
      })
        .toString()
        .trim()
      if (!KEY_RE.test(out)) throw new Error(`husk key create printed ${JSON.stringify(out)}`)
      keys.set(team, out)
      return out
    },
    /**
     * `husk template build SPEC [--name NAME]` into this server's state dir (shared layer cache),
     * next to the running server. Resolves to the CLI's last line (name, size, build time).
     */
    buildTemplate(spec, name, timeoutMs = 900_000) {
      const args = ['template', 'build', spec, '--quiet', '--state-dir', stateDir, '--layer-cache', LAYER_CACHE]
      if (name) args.push('--name', name)
      return new Promise((res, rej) => {
        execFile(bin, args, { timeout: timeoutMs, maxBuffer: 64 << 20 }, (err, stdout, stderr) => {
          const text = `${stdout}${stderr}`.trim()
          if (err) rej(new Error(`husk template build ${spec} failed (${err.code ?? err.signal}):\n${text.slice(-4000)}`))
          else res(text.split('\n').pop())
        })
      })
    },
    /** `husk template rm NAME` (best effort: used in teardown). */
    removeTemplate(name) {
      return new Promise((res) => {
        execFile(bin, ['template', 'rm', name, '--state-dir', stateDir], { timeout: 60_000 }, () => res())
      })
    },
    /** Creates a sandbox killed by `t.after` (pass the node:test context). */
    async sandbox(t, opts = {}) {
      const { apiKey, ...rest } = opts
      const key = apiKey ?? adminKey
      const sbx = await Sandbox.create({ timeoutMs: 120_000, ...rest, ...server.opts(key) })
      t.after(async () => {
        await Sandbox.kill(sbx.sandboxId, server.opts(key)).catch(() => {})
      })
      return sbx
    },
    /** Plain HTTP to the server (never anywhere else). */
    async http(method, path, { headers = {}, body } = {}) {
      const res = await fetch(url + path, { method, headers, body, signal: AbortSignal.timeout(20_000) })
      const buf = Buffer.from(await res.arrayBuffer())
      return { status: res.status, headers: res.headers, body: buf, text: buf.toString('utf8') }
    },
    /** Creates a sandbox with plain HTTP to learn its envd access token; killed by `t.after`. */
    async rawSandbox(t, apiKey = adminKey) {
      const r = await server.http('POST', '/v2/sandboxes', {
        headers: { 'X-API-Key': apiKey, 'Content-Type': 'application/json' },
        body: JSON.stringify({ templateID: 'base', timeout: 120 }),
      })
      if (r.status !== 201) throw new Error(`create: ${r.status} ${r.text}`)
      const data = JSON.parse(r.text)
      t.after(async () => {
        await server.http('DELETE', `/sandboxes/${data.sandboxID}`, { headers: { 'X-API-Key': apiKey } }).catch(() => {})
      })
      return data
    },
  }
  return server
}

export function sandboxHeaders(sandboxId, token) {
  const h = { 'E2b-Sandbox-Id': sandboxId, 'E2b-Sandbox-Port': String(ENVD_PORT) }
  if (token !== undefined) h['X-Access-Token'] = token
  return h
}

/** Fetches a URL the SDK built (e.g. a signed file URL), naming the sandbox with the routing
 * headers of single-base-URL mode and nothing else (no access token). */
export async function fetchUrl(url, sandboxId, { method = 'GET', body, headers = {} } = {}) {
  if (!url.startsWith('http://127.0.0.1:')) throw new Error(`refusing to fetch ${url}`)
  const res = await fetch(url, {
    method,
    body,
    headers: { ...sandboxHeaders(sandboxId), ...headers },
    signal: AbortSignal.timeout(20_000),
  })
  return { status: res.status, body: Buffer.from(await res.arrayBuffer()) }
}

/** multipart/form-data with one `file` part whose filename is the target path. */
export function multipart(path, data) {
  const boundary = randomUUID().replace(/-/g, '')
  const head = Buffer.from(
    `--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="${path}"\r\n` +
      'Content-Type: application/octet-stream\r\n\r\n',
  )
  const tail = Buffer.from(`\r\n--${boundary}--\r\n`)
  return {
    body: Buffer.concat([head, Buffer.from(data), tail]),
    headers: { 'Content-Type': `multipart/form-data; boundary=${boundary}` },
  }
}
