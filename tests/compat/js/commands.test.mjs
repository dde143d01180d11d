// Commands with the stock JS SDK (e2b@2.51.0): run, exit codes, callbacks, env, cwd, users and
// sudo, background handles, stdin, kill, timeouts, list, reconnecting to a running process.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'

import { CommandExitError, Sandbox, SandboxError, TimeoutError } from 'e2b'

import { startServer, unique, waitFor } from './server.mjs'

let husk
let sbx
before(async () => {
  husk = await startServer()
})
after(async () => {
  await husk?.stop()
})

// One sandbox per test keeps tests independent; they are cheap.
async function sandbox(t, opts) {
  return husk.sandbox(t, opts)
}

test('run echo', async (t) => {
  sbx = await sandbox(t)
  const r = await sbx.commands.run('echo hi')
  assert.equal(r.stdout, 'hi\n')
  assert.equal(r.stderr, '')
  assert.equal(r.exitCode, 0)
  assert.equal(r.error, undefined)
})

test('stdout and stderr are separate; unicode', async (t) => {
  sbx = await sandbox(t)
  const r = await sbx.commands.run("echo out; echo err >&2; printf 'h\\xc3\\xa9 \\xe2\\x9c\\x93\\n'")
  assert.equal(r.stdout, 'out\nhé ✓\n')
  assert.equal(r.stderr, 'err\n')
})

test('non-zero exit throws CommandExitError with details', async (t) => {
  sbx = await sandbox(t)
  await assert.rejects(sbx.commands.run('echo partial; echo boom >&2; exit 3'), (e) => {
    assert.ok(e instanceof CommandExitError)
    assert.equal(e.exitCode, 3)
    assert.equal(e.stdout, 'partial\n')
    assert.equal(e.stderr, 'boom\n')
    return true
  })
  for (const [cmd, code] of [
    ['false', 1],
    ['exit 42', 42],
    ['no-such-command-xyz', 127],
  ]) {
    await assert.rejects(sbx.commands.run(cmd), (e) => e instanceof CommandExitError && e.exitCode === code)
  }
})

test('output callbacks arrive in order', async (t) => {
  sbx = await sandbox(t)
  const out = []
  const err = []
  const r = await sbx.commands.run('for i in $(seq 1 300); do echo l$i; echo e$i >&2; done', {
    onStdout: (d) => out.push(d),
    onStderr: async (d) => {
      err.push(d)
    },
  })
  const want = Array.from({ length: 300 }, (_, i) => `l${i + 1}\n`).join('')
  const wantErr = Array.from({ length: 300 }, (_, i) => `e${i + 1}\n`).join('')
  assert.equal(out.join(''), want)
  assert.equal(r.stdout, want)
  assert.equal(err.join(''), wantErr)
})

test('large output', async (t) => {
  sbx = await sandbox(t)
  const r = await sbx.commands.run('seq 1 200000')
  const lines = r.stdout.trimEnd().split('\n')
  assert.equal(lines.length, 200000)
  assert.equal(lines.at(-1), '200000')
})

test('envs per command do not leak; sandbox envs stay', async (t) => {
  sbx = await sandbox(t, { envs: { SBX_VAR: 'from-sandbox' } })
  assert.equal((await sbx.commands.run('echo $ONE', { envs: { ONE: '1' } })).stdout, '1\n')
  assert.equal((await sbx.commands.run('echo ${ONE:-unset}')).stdout, 'unset\n')
  assert.equal((await sbx.commands.run('echo $SBX_VAR')).stdout, 'from-sandbox\n')
  assert.equal((await sbx.commands.run('echo $SBX_VAR', { envs: { SBX_VAR: 'override' } })).stdout, 'override\n')
  assert.equal((await sbx.commands.run('echo $SBX_VAR')).stdout, 'from-sandbox\n')
})

test('default user, cwd, root', async (t) => {
  sbx = await sandbox(t)
  assert.deepEqual((await sbx.commands.run('whoami; id -u; echo $HOME; pwd')).stdout.trim().split('\n'), [
    'user',
    '1000',
    '/home/user',
    '/home/user',
  ])
  assert.equal((await sbx.commands.run('pwd', { cwd: '/tmp' })).stdout, '/tmp\n')
  assert.deepEqual((await sbx.commands.run('whoami; id -u; echo $HOME', { user: 'root' })).stdout.trim().split('\n'), [
    'root',
    '0',
    '/root',
  ])
  await assert.rejects(sbx.commands.run('pwd', { cwd: '/does/not/exist' }), SandboxError)
})

test('passwordless sudo', async (t) => {
  sbx = await sandbox(t)
  assert.equal((await sbx.commands.run('sudo whoami')).stdout, 'root\n')
  assert.equal((await sbx.commands.run('sudo -n id -u')).stdout, '0\n')
})

test('background wait and kill', async (t) => {
  sbx = await sandbox(t)
  const h = await sbx.commands.run('sleep 1; echo done', { background: true })
  assert.ok(h.pid > 0)
  const r = await h.wait()
  assert.equal(r.stdout, 'done\n')
  assert.equal(h.exitCode, 0)

  const s = await sbx.commands.run('sleep 60', { background: true })
  assert.ok((await sbx.commands.list()).some((p) => p.pid === s.pid))
  assert.equal(await s.kill(), true)
  await assert.rejects(s.wait(), (e) => e instanceof CommandExitError && e.exitCode !== 0)
  await waitFor(async () => !(await sbx.commands.list()).some((p) => p.pid === s.pid), 10_000, 'pid to leave the list')
  assert.equal(await sbx.commands.kill(s.pid), false)
  assert.equal(await sbx.commands.kill(999999), false)
})

test('list shows running commands with their config', async (t) => {
  sbx = await sandbox(t)
  const marker = unique('listed')
  const h = await sbx.commands.run(`sleep 60 # ${marker}`, { background: true, envs: { LISTED: marker }, cwd: '/tmp' })
  try {
    const p = (await sbx.commands.list()).find((x) => x.pid === h.pid)
    assert.ok(p, 'not listed')
    assert.equal(p.cmd, '/bin/bash')
    assert.deepEqual(p.args, ['-l', '-c', `sleep 60 # ${marker}`])
    assert.equal(p.envs.LISTED, marker)
    assert.equal(p.cwd, '/tmp')
  } finally {
    await h.kill()
  }
})

test('stdin: send and close', async (t) => {
  sbx = await sandbox(t)
  const h = await sbx.commands.run('cat', { background: true, stdin: true })
  await sbx.commands.sendStdin(h.pid, 'hello\n')
  await h.sendStdin(new TextEncoder().encode('bytes too\n'))
  await sbx.commands.closeStdin(h.pid)
  assert.equal((await h.wait()).stdout, 'hello\nbytes too\n')
})

test('no stdin by default: readers see EOF', async (t) => {
  sbx = await sandbox(t)
  assert.equal((await sbx.commands.run('cat; echo eof', { timeoutMs: 20_000 })).stdout, 'eof\n')
})

test('command timeout kills the process', async (t) => {
  sbx = await sandbox(t)
  const marker = unique('timeout')
  const start = Date.now()
  await assert.rejects(sbx.commands.run(`sleep 30 # ${marker}`, { timeoutMs: 2_000 }), TimeoutError)
  assert.ok(Date.now() - start < 15_000)
  await waitFor(
    async () => !(await sbx.commands.list()).some((p) => p.args.join(' ').includes(marker)),
    15_000,
    'the timed-out process to be killed',
  )
})

test('disconnect keeps the process; connect resumes it', async (t) => {
  sbx = await sandbox(t)
  const h = await sbx.commands.run('while [ ! -f /tmp/go ]; do sleep 0.1; done; echo finished', {
    background: true,
  })
  await h.disconnect()
  assert.ok((await sbx.commands.list()).some((p) => p.pid === h.pid))
  const seen = []
  const again = await sbx.commands.connect(h.pid, { onStdout: (d) => seen.push(d) })
  assert.equal(again.pid, h.pid)
  await sbx.files.write('/tmp/go', '')
  const r = await again.wait()
  assert.equal(r.stdout, 'finished\n')
  assert.equal(seen.join(''), 'finished\n')
  await assert.rejects(sbx.commands.connect(999999), SandboxError)
})

test('concurrent commands', async (t) => {
  sbx = await sandbox(t)
  const rs = await Promise.all(Array.from({ length: 5 }, (_, i) => sbx.commands.run(`sleep 1; echo c${i}`)))
  assert.deepEqual(
    rs.map((r) => r.stdout),
    Array.from({ length: 5 }, (_, i) => `c${i}\n`),
  )
})

test('killing the sandbox during a command rejects with the SDK\'s "killed" TimeoutError', async (t) => {
  // E2B: the stream breaks off, the SDK's health probe finds the sandbox gone.
  sbx = await sandbox(t)
  let out = ''
  const h = await sbx.commands.run('echo started; sleep 60', { background: true, onStdout: (d) => (out += d) })
  await waitFor(() => out.includes('started'), 10_000, 'the command to start')
  assert.equal(await Sandbox.kill(sbx.sandboxId, husk.opts()), true)
  await assert.rejects(h.wait(), (e) => {
    assert.ok(e instanceof TimeoutError, `${e?.name}: ${e?.message}`)
    assert.match(e.message, /was killed or reached its end of life/)
    return true
  })
})
