// E2B's secret API with the stock JS SDK (e2b@2.51.0): Secret.create/update/getInfo/list/exists/
// destroy on husk's sealed secrets, which processes then get as `husk-secret://name`, masked.
// Values never come back; another team's secrets are missing ones.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { Secret, SecretError, SecretNotFoundError, AuthenticationError } from 'e2b'

import { startServer, unique } from './server.mjs'

const VALUE = 'sk-js-compat-5b2e90d1-not-for-eyes'

let husk
before(async () => {
  husk = await startServer()
})
after(async () => {
  await husk?.stop()
})

test('secrets: create, version, metadata, list in pages, use, tenancy, destroy', async (t) => {
  const name = unique('JS-Key')
  const made = await Secret.create(name, VALUE, { ...husk.opts(), metadata: { owner: 'js' } })
  assert.equal(made.name, name.toLowerCase())
  assert.match(made.secretId, /^sec_[0-9a-f]{24}$/)
  assert.deepEqual([made.version, made.metadata], [1, { owner: 'js' }])
  assert.ok(made.createdAt instanceof Date)
  assert.equal(JSON.stringify(made).includes(VALUE), false)
  for (const ref of [made.secretId, made.name, name]) {
    assert.equal((await Secret.getInfo(ref, husk.opts())).secretId, made.secretId)
  }
  await assert.rejects(Secret.create(name, 'again', husk.opts()), /already exists/)
  const up = await Secret.update(made.secretId, `${VALUE}-2`, husk.opts())
  assert.deepEqual([up.version, up.metadata], [2, { owner: 'js' }])
  await assert.rejects(Secret.update('no-such-secret', 'x', husk.opts()), SecretNotFoundError)

  const seen = []
  const pages = Secret.list({ ...husk.opts(), limit: 1 })
  while (pages.hasNext) {
    const page = await pages.nextItems()
    assert.ok(page.length <= 1)
    seen.push(...page)
  }
  assert.ok(seen.some((s) => s.secretId === made.secretId))

  const sbx = await husk.sandbox(t)
  const r = await sbx.commands.run(`echo "$K"; test "$K" = "${VALUE}-2" && echo match`, {
    envs: { K: `husk-secret://${made.name}` },
  })
  assert.equal(r.stdout, '****\nmatch\n')

  const other = husk.createKey('other')
  assert.equal(await Secret.exists(made.secretId, husk.opts(other)), false)
  assert.equal(await Secret.destroy(made.secretId, husk.opts(other)), false)
  await assert.rejects(Secret.getInfo(made.secretId, husk.opts('e2b_' + '0'.repeat(40))), AuthenticationError)
  await assert.rejects(Secret.create('sec_taken', 'x', husk.opts()), SecretError)

  assert.equal(await Secret.destroy(made.secretId, husk.opts()), true)
  assert.equal(await Secret.destroy(made.secretId, husk.opts()), false)
  assert.equal(await Secret.exists(made.name, husk.opts()), false)
})
