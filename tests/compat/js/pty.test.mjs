// PTYs with the stock JS SDK (e2b@2.51.0): create, input, output, TERM, resize, kill, reconnect.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'

import { CommandExitError } from 'e2b'

import { startServer, waitFor } from './server.mjs'

let husk
before(async () => {
  husk = await startServer()
})
after(async () => {
  await husk?.stop()
})

const enc = (s) => new TextEncoder().encode(s)

function collector() {
  const chunks = []
  return {
    onData: (d) => chunks.push(Buffer.from(d)),
    text: () => Buffer.concat(chunks).toString('utf8'),
  }
}

test('pty: TERM, input, resize, exit', async (t) => {
  const sbx = await husk.sandbox(t)
  const c = collector()
  const h = await sbx.pty.create({ cols: 80, rows: 24, onData: c.onData, timeoutMs: 30_000 })
  assert.ok(h.pid > 0)
  await sbx.pty.sendInput(h.pid, enc('echo $TERM; echo sum=$((40+2))\n'))
  await sbx.pty.sendInput(h.pid, enc("echo size=$(stty size | tr ' ' x)\n"))
  await waitFor(() => c.text().includes('size=24x80'), 15_000, 'the initial size')
  await sbx.pty.resize(h.pid, { cols: 132, rows: 40 })
  await sbx.pty.sendInput(h.pid, enc("echo size=$(stty size | tr ' ' x)\n"))
  await sbx.pty.sendInput(h.pid, enc('exit 0\n'))
  const r = await h.wait()
  assert.equal(r.exitCode, 0)
  assert.ok(c.text().includes('xterm-256color'), c.text())
  assert.ok(c.text().includes('sum=42'), c.text())
  assert.ok(c.text().includes('size=40x132'), c.text())
})

test('pty: is a terminal; user, cwd, envs', async (t) => {
  const sbx = await husk.sandbox(t)
  const c = collector()
  const h = await sbx.pty.create({
    cols: 80,
    rows: 24,
    onData: c.onData,
    user: 'root',
    cwd: '/tmp',
    envs: { MY_PTY_VAR: 'pty-value' },
    timeoutMs: 30_000,
  })
  await sbx.pty.sendInput(h.pid, enc('[ -t 0 ] && echo tty-$((1+1)); echo "who=$(whoami) dir=$(pwd) v=$MY_PTY_VAR"\n'))
  await sbx.pty.sendInput(h.pid, enc('exit 0\n'))
  await h.wait()
  assert.ok(c.text().includes('tty-2'), c.text())
  assert.ok(c.text().includes('who=root dir=/tmp v=pty-value'), c.text())
})

test('pty: kill', async (t) => {
  const sbx = await husk.sandbox(t)
  const h = await sbx.pty.create({ cols: 80, rows: 24, onData: () => {}, timeoutMs: 30_000 })
  assert.ok((await sbx.commands.list()).some((p) => p.pid === h.pid))
  assert.equal(await sbx.pty.kill(h.pid), true)
  await assert.rejects(h.wait(), (e) => e instanceof CommandExitError && e.exitCode !== 0)
  assert.equal(await sbx.pty.kill(h.pid), false)
})

test('pty: non-zero exit', async (t) => {
  const sbx = await husk.sandbox(t)
  const h = await sbx.pty.create({ cols: 80, rows: 24, onData: () => {}, timeoutMs: 30_000 })
  await sbx.pty.sendInput(h.pid, enc('exit 7\n'))
  await assert.rejects(h.wait(), (e) => e instanceof CommandExitError && e.exitCode === 7)
})

test('pty: disconnect and reconnect', async (t) => {
  const sbx = await husk.sandbox(t)
  const h = await sbx.pty.create({ cols: 80, rows: 24, onData: () => {}, timeoutMs: 30_000 })
  await h.disconnect()
  assert.ok((await sbx.commands.list()).some((p) => p.pid === h.pid))
  const c = collector()
  const again = await sbx.pty.connect(h.pid, { onData: c.onData, timeoutMs: 30_000 })
  await sbx.pty.sendInput(h.pid, enc('echo back-$((3*3))\n'))
  await sbx.pty.sendInput(h.pid, enc('exit 0\n'))
  await again.wait()
  assert.ok(c.text().includes('back-9'), c.text())
})
