// The code interpreter through the stock JS SDK (`@e2b/code-interpreter@2.8.0` on e2b@2.51.0):
// runCode on the Jupyter kernels husk's agent runs in sandboxes of the `code-interpreter` preset
// (port 49999: /execute NDJSON, /contexts, /health).
//
// This file's server gets husk's `base` and `code-interpreter` presets built into its state dir
// (shared layer cache) in `before`; they are removed in `after`. The SDK's default template,
// `code-interpreter-v1`, is the `code-interpreter` preset.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'

import { Sandbox, NotFoundError, SandboxError, TimeoutError, InvalidArgumentError } from '@e2b/code-interpreter'

import { startServer, PRESETS_DIR, JUPYTER_PORT } from './server.mjs'
import { join } from 'node:path'

const PRESETS = ['base', 'code-interpreter']
// run.sh runs this file on its own with a long --test-timeout, which bounds the whole file
// (template builds included); each test keeps the suite's usual 90 s.
const PER_TEST = { timeout: 90_000 }
const PNG_MAGIC = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a])

let husk
const built = []
// Builds take seconds with a warm layer cache and minutes cold: more than the per-test timeout.
before(
  async () => {
    husk = await startServer()
    for (const preset of PRESETS) {
      const line = await husk.buildTemplate(join(PRESETS_DIR, preset))
      built.push(preset)
      console.log(`code-interpreter suite: ${line}`)
    }
  },
  { timeout: 1_200_000 },
)
after(
  async () => {
    for (const preset of built.reverse()) await husk.removeTemplate(preset)
    await husk?.stop()
  },
  { timeout: 180_000 },
)

/** A code-interpreter sandbox (default template unless one is given), killed by `t.after`. */
async function ciSandbox(t, template, opts = {}) {
  const o = { timeoutMs: 180_000, ...opts, ...husk.opts() }
  const sbx = template ? await Sandbox.create(template, o) : await Sandbox.create(o)
  t.after(async () => {
    await Sandbox.kill(sbx.sandboxId, husk.opts()).catch(() => {})
  })
  return sbx
}

const stdoutOf = (execution) => execution.logs.stdout.join('')

/** POST /execute with plain HTTP, named by the routing headers (port 49999), like the SDK. */
function rawExecute(sbx, body, query = '') {
  return husk.http('POST', `/execute${query}`, {
    headers: {
      'E2b-Sandbox-Id': sbx.sandboxId,
      'E2b-Sandbox-Port': String(JUPYTER_PORT),
      'X-Access-Token': sbx.envdAccessToken,
      'Content-Type': 'application/json',
    },
    body: JSON.stringify(body),
  })
}

test('default template: state and execution count', PER_TEST, async (t) => {
  const sbx = await ciSandbox(t)
  const a = await sbx.runCode('x = 1')
  assert.equal(a.error, undefined)
  assert.deepEqual(a.results, [])
  assert.ok(Number.isInteger(a.executionCount) && a.executionCount >= 1, String(a.executionCount))
  const b = await sbx.runCode('x + 1')
  assert.equal(b.error, undefined)
  assert.equal(b.text, '2')
  assert.equal(b.results.length, 1)
  assert.equal(b.results[0].isMainResult, true)
  assert.equal(b.executionCount, a.executionCount + 1)
  assert.equal((await sbx.commands.run('echo $HOME')).stdout, '/home/user\n')
})

test('template by name', PER_TEST, async (t) => {
  const sbx = await ciSandbox(t, 'code-interpreter')
  assert.equal((await sbx.runCode('import sys; sys.version_info[:2]')).text, '(3, 11)')
})

test('contexts are isolated; list, remove', PER_TEST, async (t) => {
  const sbx = await ciSandbox(t)
  const ctx = await sbx.createCodeContext()
  assert.ok(ctx.id)
  assert.equal(ctx.language, 'python')
  assert.equal(ctx.cwd, '/home/user')
  await sbx.runCode('secret = 41', { context: ctx })
  assert.equal((await sbx.runCode('secret + 1', { context: ctx })).text, '42')
  assert.equal((await sbx.runCode('secret')).error?.name, 'NameError')
  const other = await sbx.createCodeContext({ language: 'python' })
  assert.notEqual(other.id, ctx.id)
  assert.equal((await sbx.runCode('secret', { context: other })).error?.name, 'NameError')

  const listed = await sbx.listCodeContexts()
  const ids = listed.map((c) => c.id)
  assert.ok(ids.includes(ctx.id) && ids.includes(other.id), JSON.stringify(ids))
  // The default Python context is listed too, as on E2B.
  assert.equal(listed.filter((c) => c.language === 'python').length, 3, JSON.stringify(listed))

  await sbx.removeCodeContext(other)
  assert.ok(!(await sbx.listCodeContexts()).some((c) => c.id === other.id))
  await assert.rejects(sbx.runCode('1', { context: other }), NotFoundError)
  await sbx.removeCodeContext(ctx.id)
  assert.ok(!(await sbx.listCodeContexts()).some((c) => c.id === ctx.id))
  assert.equal((await sbx.runCode('2 * 21')).text, '42')
})

test('stdout, stderr, results and errors stream to the callbacks in order', PER_TEST, async (t) => {
  const sbx = await ciSandbox(t)
  const events = []
  const code = [
    'import sys, time',
    "print('out-1', flush=True)",
    'time.sleep(0.3)',
    "print('err-1', file=sys.stderr, flush=True)",
    'time.sleep(0.3)',
    "print('out-2', flush=True)",
    'time.sleep(0.3)',
    'display(3)',
    "'last'",
  ].join('\n')
  const r = await sbx.runCode(code, {
    onStdout: (m) => events.push(['stdout', m]),
    onStderr: (m) => events.push(['stderr', m]),
    onResult: async (res) => events.push(['result', res]),
    onError: (e) => events.push(['error', e]),
  })
  assert.equal(r.error, undefined)
  assert.deepEqual(
    events.map(([k, v]) => [k, k === 'result' ? [v.isMainResult, v.text] : v.line]),
    [
      ['stdout', 'out-1\n'],
      ['stderr', 'err-1\n'],
      ['stdout', 'out-2\n'],
      ['result', [false, '3']],
      ['result', [true, 'last']],
    ],
  )
  for (const [k, v] of events.filter(([k]) => k !== 'result')) {
    assert.equal(v.error, k === 'stderr')
    assert.ok(v.timestamp > 0)
  }
  assert.deepEqual(r.logs, { stdout: ['out-1\n', 'out-2\n'], stderr: ['err-1\n'] })

  const errors = []
  const e = await sbx.runCode("print('before')\n1 / 0", { onError: (err) => errors.push(err) })
  assert.equal(e.error.name, 'ZeroDivisionError')
  assert.equal(e.error.value, 'division by zero')
  assert.match(e.error.traceback, /ZeroDivisionError/)
  assert.equal(errors.length, 1)
  assert.equal(stdoutOf(e), 'before\n')
  assert.equal((await sbx.runCode('6 * 7')).text, '42')
})

test('a box-and-whisker chart; a PIL image a cell saves is a PNG result', PER_TEST, async (t) => {
  const sbx = await ciSandbox(t)
  const r = await sbx.runCode(
    [
      'import matplotlib.pyplot as plt',
      "data = {'A': [85, 90, 78, 92, 88], 'B': [95, 89, 76, 91, 84, 87]}",
      'fig, ax = plt.subplots()',
      'ax.boxplot(data.values(), tick_labels=data.keys(), patch_artist=True)',
      "ax.set_title('scores')",
      'plt.show()',
    ].join('\n'),
  )
  assert.equal(r.error, undefined, JSON.stringify(r.error))
  const charts = r.results.filter((x) => x.chart).map((x) => x.chart)
  assert.equal(charts.length, 1)
  assert.equal(charts[0].type, 'box_and_whisker')
  assert.deepEqual(
    charts[0].elements.map((b) => b.label),
    ['A', 'B'],
  )
  const saved = await sbx.runCode(
    "from PIL import Image\nImage.new('RGB', (8, 8), (0, 0, 255)).save('blue.png')",
  )
  assert.equal(saved.error, undefined, JSON.stringify(saved.error))
  const pngs = saved.results.filter((x) => x.png)
  assert.equal(pngs.length, 1)
  assert.ok(Buffer.from(pngs[0].png, 'base64').subarray(0, 8).equals(PNG_MAGIC))
})

test('a matplotlib chart is a PNG (and chart data); a DataFrame is HTML and data', PER_TEST, async (t) => {
  const sbx = await ciSandbox(t)
  const r = await sbx.runCode(
    "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.title('squares')\nplt.show()",
  )
  assert.equal(r.error, undefined)
  const pngs = r.results.filter((x) => x.png)
  assert.equal(pngs.length, 1)
  const png = Buffer.from(pngs[0].png, 'base64')
  assert.ok(png.subarray(0, 8).equals(PNG_MAGIC), png.subarray(0, 8).toString('hex'))
  assert.equal(pngs[0].isMainResult, false)
  assert.equal(pngs[0].chart?.type, 'line')
  assert.equal(pngs[0].chart?.title, 'squares')

  const df = await sbx.runCode("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', None]})")
  assert.equal(df.error, undefined)
  assert.equal(df.results.length, 1)
  assert.match(df.results[0].html, /<table/)
  assert.deepEqual(df.results[0].data, { a: [1, 2], b: ['x', null] })
  assert.equal(df.results[0].isMainResult, true)

  const shown = await sbx.runCode(
    "from IPython.display import display, HTML, JSON\ndisplay(HTML('<b>bold</b>'))\ndisplay(JSON({'k': [1]}))\n5",
  )
  assert.deepEqual(
    shown.results.map((x) => [x.isMainResult, x.html ?? x.json ?? x.text]),
    [
      [false, '<b>bold</b>'],
      [false, { k: [1] }],
      [true, '5'],
    ],
  )
})

test('env vars: per call and global', PER_TEST, async (t) => {
  const sbx = await ciSandbox(t, undefined, { envs: { HUSK_GLOBAL: 'global-value' } })
  const show = "import os; print(os.environ.get('HUSK_GLOBAL'), os.environ.get('HUSK_CALL'))"
  assert.equal(stdoutOf(await sbx.runCode(show)), 'global-value None\n')
  assert.equal(
    stdoutOf(await sbx.runCode(show, { envs: { HUSK_CALL: 'call-value', HUSK_GLOBAL: 'overridden' } })),
    'overridden call-value\n',
  )
  assert.equal(stdoutOf(await sbx.runCode(show)), 'global-value None\n')
})

test('cwd of a context', PER_TEST, async (t) => {
  const sbx = await ciSandbox(t)
  const ctx = await sbx.createCodeContext({ cwd: '/tmp' })
  assert.equal(ctx.cwd, '/tmp')
  assert.equal(stdoutOf(await sbx.runCode('import os; print(os.getcwd())', { context: ctx })), '/tmp\n')
  assert.equal(stdoutOf(await sbx.runCode('import os; print(os.getcwd())')), '/home/user\n')
})

test('a timeout interrupts the cell; the context is reused with its state', PER_TEST, async (t) => {
  const sbx = await ciSandbox(t)
  const ctx = await sbx.createCodeContext()
  await sbx.runCode('kept = 7', { context: ctx })
  const t0 = Date.now()
  await assert.rejects(sbx.runCode('import time; time.sleep(30)', { context: ctx, timeoutMs: 2_000 }), TimeoutError)
  assert.ok(Date.now() - t0 < 15_000)
  const t1 = Date.now()
  const r = await sbx.runCode('kept + 1', { context: ctx, timeoutMs: 20_000 })
  assert.equal(r.text, '8')
  assert.ok(Date.now() - t1 < 20_000)
})

test('restart a context', PER_TEST, async (t) => {
  const sbx = await ciSandbox(t)
  const ctx = await sbx.createCodeContext()
  await sbx.runCode('gone = 5', { context: ctx })
  await sbx.restartCodeContext(ctx)
  assert.equal((await sbx.runCode('gone', { context: ctx })).error?.name, 'NameError')
  assert.equal((await sbx.runCode('3 * 3', { context: ctx })).text, '9')
  await sbx.restartCodeContext(ctx.id)
  assert.equal((await sbx.runCode('1 + 2', { context: ctx })).text, '3')
})

test('bad language, unknown context, context and language together; wire format', PER_TEST, async (t) => {
  const sbx = await ciSandbox(t)
  // JS puts only "<status> <statusText>" in the error (the body only with requestSource "ci").
  for (const call of [() => sbx.runCode('1', { language: 'cobol' }), () => sbx.createCodeContext({ language: 'cobol' })]) {
    await assert.rejects(call(), (err) => {
      assert.ok(err instanceof SandboxError, String(err))
      assert.ok(!/^5\d\d/.test(err.message), err.message)
      assert.ok(/cobol/.test(err.message) || /^4\d\d /.test(err.message), err.message)
      return true
    })
  }
  const missing = { id: 'nosuchcontext', language: 'python', cwd: '/' }
  await assert.rejects(sbx.runCode('1', { context: missing }), NotFoundError)
  await assert.rejects(sbx.removeCodeContext('nosuchcontext'), NotFoundError)
  await assert.rejects(sbx.restartCodeContext('nosuchcontext'), NotFoundError)

  const ctx = await sbx.createCodeContext()
  await assert.rejects(sbx.runCode('1', { context: ctx, language: 'python' }), InvalidArgumentError)
  const both = await rawExecute(sbx, { code: '1', context_id: ctx.id, language: 'python' })
  assert.equal(both.status, 400, both.text)
  assert.match(both.text, /Only one of context_id or language can be provided/)

  // NDJSON as JS sends it (undefined keys left out), with a query parameter to ignore.
  const r = await rawExecute(sbx, { code: "print('hi')\n1 + 1" }, '?source=husk-compat')
  assert.equal(r.status, 200, r.text)
  const lines = r.text.split('\n').filter((l) => l.trim()).map((l) => JSON.parse(l))
  const kinds = lines.map((l) => l.type).filter((k) => k !== 'keepalive')
  assert.equal(kinds[0], 'number_of_executions')
  assert.equal(kinds.at(-1), 'end_of_execution')
  assert.ok(lines.some((l) => l.type === 'stdout' && l.text === 'hi\n' && l.timestamp))
  assert.ok(lines.some((l) => l.type === 'result' && l.is_main_result === true && l.text === '2'))

  const health = await husk.http('GET', '/health', {
    headers: { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': String(JUPYTER_PORT) },
  })
  assert.equal(health.status, 200, health.text)
  assert.match(health.text, /OK/)
})

test('bash', PER_TEST, async (t) => {
  const sbx = await ciSandbox(t)
  assert.equal(stdoutOf(await sbx.runCode('echo hello-$((40 + 2))', { language: 'bash' })), 'hello-42\n')
  await sbx.runCode('export HUSK_BASH=kept; cd /tmp', { language: 'bash' })
  assert.equal(
    stdoutOf(await sbx.runCode('echo $HUSK_BASH $(pwd) $(whoami)', { language: 'bash' })),
    'kept /tmp user\n',
  )
  const ctx = await sbx.createCodeContext({ language: 'bash' })
  assert.equal(ctx.language, 'bash')
  assert.equal(stdoutOf(await sbx.runCode('echo "[$HUSK_BASH]"', { context: ctx })), '[]\n')
})

test('R (IRkernel): values as results, env vars per call, errors, plots, contexts', PER_TEST, async (t) => {
  const sbx = await ciSandbox(t, undefined, { envs: { TEST_ENV_VAR: 'supertest' } })
  let r = await sbx.runCode('x <- 40 + 2\nx', { language: 'r' })
  assert.equal(r.error, undefined)
  assert.equal(r.results[0].text.trim(), '[1] 42')
  r = await sbx.runCode("Sys.getenv('TEST_ENV_VAR')", { language: 'r' })
  assert.equal(r.results[0].text.trim(), '[1] "supertest"')
  r = await sbx.runCode("Sys.getenv('FOO')", { language: 'r', envs: { FOO: 'bar' } })
  assert.equal(r.results[0].text.trim(), '[1] "bar"')
  r = await sbx.runCode("Sys.getenv('FOO', unset = 'default')", { language: 'r' })
  assert.equal(r.results[0].text.trim(), '[1] "default"')
  r = await sbx.runCode('stop("boom")', { language: 'r' })
  assert.match(r.error?.value ?? '', /boom/)
  r = await sbx.runCode('plot(1:10)', { language: 'r' })
  assert.ok(r.results.some((res) => res.png), JSON.stringify(r.results))
  const ctx = await sbx.createCodeContext({ language: 'r' })
  assert.equal((await sbx.runCode('exists("x")', { context: ctx })).results[0].text.trim(), '[1] FALSE')
})

test('JavaScript and TypeScript (Deno): results, top-level await, state, cwd, ESM imports', PER_TEST, async (t) => {
  const sbx = await ciSandbox(t)
  let r = await sbx.runCode("console.log('Hello, World!')", { language: 'js' })
  assert.deepEqual(r.logs.stdout, ['Hello, World!\n'])
  r = await sbx.runCode("async function main() { return 'Hello, World!' }\nawait main()", { language: 'js' })
  assert.equal(r.results[0].text, 'Hello, World!')
  await sbx.runCode('const x = 1', { language: 'javascript' })
  assert.equal((await sbx.runCode('x + 2', { language: 'js' })).results[0].text, '3')
  r = await sbx.runCode('function sub(a: number, b: number): number { return a - b }\nsub(1, 2)', { language: 'ts' })
  assert.equal(r.results[0].text, '-1')
  r = await sbx.runCode("import { join } from 'node:path'\njoin('a', 'b')", { language: 'typescript' })
  assert.equal(r.results[0].text, 'a/b')
  assert.equal((await sbx.runCode('process.cwd()', { language: 'js' })).results[0].text, '/home/user')
  const ctx = await sbx.createCodeContext({ cwd: '/tmp', language: 'js' })
  assert.equal((await sbx.runCode('process.cwd()', { context: ctx })).results[0].text, '/tmp')
  r = await sbx.runCode("throw new Error('boom')", { language: 'js' })
  assert.match(r.error?.value ?? '', /boom/)
})

test('Java (husk\'s JShell kernel): output, results, state, env vars per call, errors, contexts', PER_TEST, async (t) => {
  const sbx = await ciSandbox(t, undefined, { envs: { TEST_ENV_VAR: 'supertest' } })
  let r = await sbx.runCode('System.out.println("Hello, World!");', { language: 'java' })
  assert.deepEqual(r.logs.stdout, ['Hello, World!\n'])
  r = await sbx.runCode('int x = 40 + 2;\nx', { language: 'java' })
  assert.equal(r.text, '42')
  r = await sbx.runCode('System.getenv("TEST_ENV_VAR")', { language: 'java' })
  assert.equal(r.text, 'supertest')
  r = await sbx.runCode('System.getenv("FOO")', { language: 'java', envs: { FOO: 'bar' } })
  assert.equal(r.text, 'bar')
  assert.equal((await sbx.runCode('System.getenv("FOO")', { language: 'java' })).text, 'null')
  r = await sbx.runCode('throw new RuntimeException("boom")', { language: 'java' })
  assert.equal(r.error?.name, 'java.lang.RuntimeException')
  assert.equal(r.error?.value, 'boom')
  assert.equal((await sbx.runCode('x * 2', { language: 'java' })).text, '84')
  const ctx = await sbx.createCodeContext({ language: 'java', cwd: '/tmp' })
  r = await sbx.runCode('System.getProperty("user.dir")', { context: ctx })
  assert.equal(r.text, '/tmp')
})

test('killing the sandbox during runCode rejects with the SDK\'s "killed" TimeoutError', PER_TEST, async (t) => {
  // E2B: the /execute stream breaks off, the SDK finds the sandbox gone.
  const sbx = await ciSandbox(t)
  let started
  const go = new Promise((resolve) => (started = resolve))
  const running = sbx.runCode("print('go', flush=True)\nimport time\ntime.sleep(60)", {
    onStdout: () => started(),
    timeoutMs: 90_000,
  })
  running.catch(() => {})
  await go
  assert.equal(await Sandbox.kill(sbx.sandboxId, husk.opts()), true)
  await assert.rejects(running, (e) => {
    assert.ok(e instanceof TimeoutError, `${e?.name}: ${e?.message}`)
    assert.match(e.message, /killed while the request was in progress/)
    return true
  })
})

test('a killed sandbox', PER_TEST, async (t) => {
  const sbx = await ciSandbox(t)
  assert.equal((await sbx.runCode('1')).text, '1')
  assert.equal(await sbx.kill(), true)
  await assert.rejects(sbx.runCode('1', { timeoutMs: 20_000, requestTimeoutMs: 20_000 }), SandboxError)
  await assert.rejects(sbx.createCodeContext(), SandboxError)
})
