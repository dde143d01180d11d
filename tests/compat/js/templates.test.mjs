// E2B's templates as code with the stock JS SDK (e2b@2.51.0): `Template().fromTemplate(...)
// .copy(...).runCmd(...)`, `Template.build` twice (the second time from the cache, nothing
// uploaded again), sandboxes from the result, `Template.exists`, a failing step named in the
// error, and a non-admin key refused.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { mkdtempSync, mkdirSync, writeFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, resolve, dirname } from 'node:path'
import { fileURLToPath } from 'node:url'
import { Template, BuildError } from 'e2b'

import { startServer, unique } from './server.mjs'

const HERE = dirname(fileURLToPath(import.meta.url))
const SPEC = resolve(HERE, '..', 'templates', 'debian', 'husk.toml')

let husk
let base
let ctx
const built = []
before(async () => {
  husk = await startServer()
  base = unique('jsbase')
  await husk.buildTemplate(SPEC, base)
  ctx = mkdtempSync(join(tmpdir(), 'husk-js-tpl-'))
  mkdirSync(join(ctx, 'site', 'css'), { recursive: true })
  writeFileSync(join(ctx, 'site', 'index.html'), '<h1>hi</h1>\n')
  writeFileSync(join(ctx, 'site', 'css', 'a.css'), 'body{}\n')
  writeFileSync(join(ctx, 'run.sh'), '#!/bin/sh\necho ran $1\n')
}, { timeout: 900_000 })
after(async () => {
  for (const n of built) await husk?.removeTemplate(n)
  await husk?.removeTemplate(base)
  await husk?.stop()
  if (ctx) rmSync(ctx, { recursive: true, force: true })
})

function template() {
  return Template({ fileContextPath: ctx })
    .fromTemplate(base)
    .setEnvs({ SITE: '/srv/site' })
    .copy('site', '/srv/site', { user: 'root' })
    .copy('run.sh', '/usr/local/bin/run-it', { mode: 0o755 })
    .runCmd('run-it built > /home/user/built.txt')
    .setWorkdir('/srv/site')
    .setStartCmd('touch /tmp/up && exec sleep infinity', 'test -f /tmp/up')
}

test('a template built with the JS SDK, twice, the second from the cache', { timeout: 300_000 }, async (t) => {
  const name = unique('jstpl')
  built.push(name)
  const opts = { apiKey: husk.adminKey, apiUrl: husk.url }
  const logs = []
  const info = await Template.build(template(), name, { ...opts, onBuildLogs: (e) => logs.push(e.message) })
  assert.equal(info.templateId, name)
  assert.ok(logs.some((m) => m.startsWith("Uploaded 'site'")), logs.join('\n'))

  const sbx = await husk.sandbox(t, { template: name })
  const r = await sbx.commands.run('pwd; echo $SITE; cat index.html css/a.css /home/user/built.txt; ls /tmp/up; stat -c "%U %a" /srv/site/index.html /usr/local/bin/run-it')
  assert.deepEqual(r.stdout.trim().split('\n'), [
    '/srv/site', '/srv/site', '<h1>hi</h1>', 'body{}', 'ran built', '/tmp/up', 'root 644', 'user 755',
  ])

  const logs2 = []
  const info2 = await Template.build(template(), name, { ...opts, onBuildLogs: (e) => logs2.push(e.message) })
  assert.notEqual(info2.buildId, info.buildId)
  assert.ok(!logs2.some((m) => m.startsWith('Uploaded')), logs2.join('\n'))
  const starts = logs2.filter((m) => /^\[\d+\/\d+\] /.test(m))
  const cached = logs2.filter((m) => m.startsWith('CACHED ['))
  assert.ok(starts.length > 0 && cached.length === starts.length, logs2.join('\n'))
  assert.equal(await Template.exists(name, opts), true)
  assert.equal(await Template.exists(unique('nothere'), opts), false)
})

test('tags: name:tag builds, assignTags, removeTags, getTags', { timeout: 300_000 }, async (t) => {
  const opts = { apiKey: husk.adminKey, apiUrl: husk.url }
  const name = unique('jstags')
  built.push(name, `${name}:v1`, `${name}:stable`, `${name}:prod`)
  const tpl = Template({ fileContextPath: ctx }).fromTemplate(base).runCmd('echo one > /home/user/version')
  const info = await Template.build(tpl, `${name}:v1`, { ...opts, tags: ['stable'] })
  assert.deepEqual([...info.tags].sort(), ['stable', 'v1'])
  assert.equal(await Template.exists(`${name}:stable`, opts), true)
  assert.equal(await Template.exists(name, opts), false)
  const assigned = await Template.assignTags(`${name}:v1`, ['prod', 'default'], opts)
  assert.deepEqual([...assigned.tags].sort(), ['default', 'prod'])
  const sbx = await husk.sandbox(t, { template: name })
  assert.equal((await sbx.commands.run('cat /home/user/version')).stdout, 'one\n')
  await Template.removeTags(name, ['stable'], opts)
  const tags = (await Template.getTags(name, opts)).map((x) => x.tag).sort()
  assert.deepEqual(tags, ['default', 'prod', 'v1'])
  assert.equal(await Template.exists(`${name}:stable`, opts), false)
})

test('a failing step is named, and a team key cannot build', { timeout: 120_000 }, async () => {
  const opts = { apiKey: husk.adminKey, apiUrl: husk.url }
  const failing = Template({ fileContextPath: ctx }).fromTemplate(base).runCmd('true').runCmd('echo boom; exit 4')
  await assert.rejects(Template.build(failing, unique('jsfail'), opts), (e) => {
    assert.ok(e instanceof BuildError, String(e))
    assert.match(e.message, /step 2 failed.*exit code 4/s)
    return true
  })
  const team = husk.createKey(unique('jsteam'))
  await assert.rejects(
    Template.build(Template().fromTemplate(base).runCmd('true'), unique('jsno'), { apiKey: team, apiUrl: husk.url }),
    (e) => /admin key/.test(e.message),
  )
})
