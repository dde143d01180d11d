// Workspaces as E2B volumes with the stock JS SDK (e2b@2.51.0): `volumeMounts: {path: name}`
// mounts the team's workspace read-only; `name:rw` makes it writable; other teams cannot.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'

import { startServer, unique } from './server.mjs'

let husk
let ws
before(async () => {
  husk = await startServer()
  ws = unique('jsws')
  const key = { 'X-API-Key': husk.adminKey }
  let r = await husk.http('POST', '/husk/v1/workspaces', {
    headers: { ...key, 'Content-Type': 'application/json' },
    body: JSON.stringify({ name: ws }),
  })
  assert.equal(r.status, 201, r.text)
  r = await husk.http('PUT', `/husk/v1/workspaces/${ws}/files/in.txt`, { headers: key, body: 'from the API\n' })
  assert.ok(r.status < 300, r.text)
})
after(async () => {
  await husk?.stop()
})

test('a volume mount is read-only unless rw, and writes persist', async (t) => {
  const ro = await husk.sandbox(t, { volumeMounts: { '/data': ws } })
  assert.equal((await ro.commands.run('cat /data/in.txt')).stdout, 'from the API\n')
  const refused = await ro.commands.run('touch /data/x 2>&1 || echo refused')
  assert.match(refused.stdout, /Read-only file system[\s\S]*refused\n$/)

  const rw = await husk.sandbox(t, { volumeMounts: { '/w': `${ws}:rw` } })
  await rw.files.write('/w/out.txt', 'from js\n')
  const r = await husk.http('GET', `/husk/v1/workspaces/${ws}/files/out.txt`, {
    headers: { 'X-API-Key': husk.adminKey },
  })
  assert.equal(r.text, 'from js\n')
})

test('another team cannot mount the workspace', async (t) => {
  const other = husk.createKey('other')
  await assert.rejects(husk.sandbox(t, { apiKey: other, volumeMounts: { '/data': ws } }), /not found/)
})
