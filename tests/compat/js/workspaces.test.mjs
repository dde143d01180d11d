// Workspaces as E2B volumes with the stock JS SDK (e2b@2.51.0): `volumeMounts: {path: name}`
// mounts the team's workspace read-only; `name:rw` makes it writable; other teams cannot. The
// volume API (`Volume.create/list/getInfo/destroy`) and the volume content API with the
// volume's token work on the same workspaces.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { Volume, AuthenticationError, VolumeError, VolumeNotFoundError, VolumePathNotFoundError } from 'e2b'

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

test('volumes: create, list, info, destroy; another team sees none of it', async () => {
  const name = unique('jsvol')
  const vol = await Volume.create(name, husk.opts())
  assert.equal(vol.name, name)
  assert.match(vol.volumeId, /^vol_[a-z0-9]{20}$/)
  const info = await Volume.getInfo(vol.volumeId, husk.opts())
  assert.deepEqual([info.volumeId, info.name, info.token], [vol.volumeId, name, vol.token])
  assert.ok((await Volume.list(husk.opts())).some((v) => v.volumeId === vol.volumeId && v.name === name))
  await assert.rejects(Volume.create(name, husk.opts()), /already exists/)
  const other = husk.createKey('other')
  await assert.rejects(Volume.getInfo(vol.volumeId, husk.opts(other)), VolumeNotFoundError)
  assert.equal(await Volume.destroy(vol.volumeId, husk.opts(other)), false)
  assert.ok(!(await Volume.list(husk.opts(other))).some((v) => v.volumeId === vol.volumeId))
  assert.equal(await Volume.destroy(vol.volumeId, husk.opts()), true)
  assert.equal(await Volume.destroy(vol.volumeId, husk.opts()), false)
  await assert.rejects(Volume.getInfo(vol.volumeId, husk.opts()), VolumeNotFoundError)
})

test('volume content: files, directories, metadata; read from a sandbox', async (t) => {
  const vol = await Volume.create(unique('jsvol'), husk.opts())
  t.after(() => Volume.destroy(vol.volumeId, husk.opts()).catch(() => {}))
  const w = await vol.writeFile('/test.txt', 'Hello, World!')
  assert.deepEqual([w.name, w.path, w.type, w.size], ['test.txt', '/test.txt', 'file', 13])
  assert.equal(await vol.readFile('/test.txt'), 'Hello, World!')
  assert.deepEqual(await vol.readFile('/test.txt', { format: 'bytes' }), new TextEncoder().encode('Hello, World!'))
  await assert.rejects(vol.writeFile('/test.txt', 'again', { force: false }), VolumeError)
  await vol.writeFile('/test.txt', 'New', { force: true })
  assert.equal(await vol.readFile('/test.txt'), 'New')
  await vol.writeFile('/meta.txt', 'm', { uid: 1000, gid: 1000, mode: 0o644 })
  const meta = await vol.getInfo('/meta.txt')
  assert.deepEqual([meta.uid, meta.gid, meta.mode], [1000, 1000, 0o644])
  assert.ok(meta.mtime instanceof Date)
  const up = await vol.updateMetadata('/meta.txt', { uid: 1001, mode: 0o755 })
  assert.deepEqual([up.uid, up.gid, up.mode], [1001, 1000, 0o755])
  await assert.rejects(vol.makeDir('/a/b/c'), VolumePathNotFoundError)
  const d = await vol.makeDir('/a/b/c', { force: true })
  assert.deepEqual([d.type, d.path], ['directory', '/a/b/c'])
  await assert.rejects(vol.makeDir('/a/b/c', { force: false }), VolumeError)
  await vol.writeFile('/a/b/c/in.txt', 'deep\n')
  assert.deepEqual((await vol.list('/a/b/c')).map((e) => e.path), ['/a/b/c/in.txt'])
  assert.ok((await vol.list('/a', { depth: 3 })).some((e) => e.path === '/a/b/c/in.txt'))
  await assert.rejects(vol.list('/missing'), VolumePathNotFoundError)
  await assert.rejects(vol.readFile('/../etc/passwd'), /`..` is refused/)

  // Written with no sandbox running, read from one; written from one, read back.
  const ro = await husk.sandbox(t, { volumeMounts: { '/mnt/v': vol } })
  assert.equal((await ro.commands.run('cat /mnt/v/a/b/c/in.txt')).stdout, 'deep\n')
  const rw = await husk.sandbox(t, { volumeMounts: { '/mnt/w': `${vol.name}:rw` } })
  await rw.files.write('/mnt/w/out.txt', 'from js sandbox\n')
  assert.equal(await vol.readFile('/out.txt'), 'from js sandbox\n')

  assert.equal(await vol.exists('/a'), true)
  await vol.remove('/a')
  assert.equal(await vol.exists('/a'), false)
  await assert.rejects(vol.remove('/a'), VolumePathNotFoundError)
})

test('volume tokens open their own volume only', async (t) => {
  const mine = await Volume.create(unique('jsvol'), husk.opts())
  const other = husk.createKey('other')
  const theirs = await Volume.create(unique('jsvol'), husk.opts(other))
  t.after(async () => {
    await Volume.destroy(mine.volumeId, husk.opts()).catch(() => {})
    await Volume.destroy(theirs.volumeId, husk.opts(other)).catch(() => {})
  })
  await mine.writeFile('/secret.txt', 'mine')
  const forged = new Volume(mine.volumeId, mine.name, theirs.token)
  await assert.rejects(forged.readFile('/secret.txt'), AuthenticationError)
  await assert.rejects(forged.writeFile('/planted.txt', 'x'), AuthenticationError)
  assert.equal(await mine.exists('/planted.txt'), false)
  const r = await husk.http('GET', `/volumecontent/${mine.volumeId}/file?path=/secret.txt`, {
    headers: { 'X-API-Key': husk.adminKey },
  })
  assert.equal(r.status, 401)
})
