// Files with the stock JS SDK (e2b@2.51.0): read/write text, bytes, blobs and streams, many
// files, list depth, exists, stat, makeDir, rename, remove, watch (streaming), metadata, gzip.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { randomBytes, createHash } from 'node:crypto'

import { FileNotFoundError, FileType, FilesystemEventType, InvalidArgumentError } from 'e2b'

import { startServer, waitFor } from './server.mjs'

let husk
before(async () => {
  husk = await startServer()
})
after(async () => {
  await husk?.stop()
})

test('write and read text; relative and ~ paths', async (t) => {
  const sbx = await husk.sandbox(t)
  const info = await sbx.files.write('/home/user/hello.txt', 'Hello, husk!\n')
  assert.equal(info.path, '/home/user/hello.txt')
  assert.equal(info.name, 'hello.txt')
  assert.equal(info.type, FileType.FILE)
  assert.equal(await sbx.files.read('/home/user/hello.txt'), 'Hello, husk!\n')
  assert.equal((await sbx.commands.run('cat /home/user/hello.txt')).stdout, 'Hello, husk!\n')
  assert.equal((await sbx.files.write('rel.txt', 'rel')).path, '/home/user/rel.txt')
  assert.equal(await sbx.files.read('~/rel.txt'), 'rel')
})

test('bytes, blob and stream', async (t) => {
  const sbx = await husk.sandbox(t)
  const data = randomBytes(3 * 1024 * 1024 + 5)
  await sbx.files.write('/tmp/bin.dat', data.buffer.slice(data.byteOffset, data.byteOffset + data.length))
  const bytes = await sbx.files.read('/tmp/bin.dat', { format: 'bytes' })
  assert.ok(bytes instanceof Uint8Array)
  assert.ok(Buffer.from(bytes).equals(data))
  const blob = await sbx.files.read('/tmp/bin.dat', { format: 'blob' })
  assert.ok(Buffer.from(await blob.arrayBuffer()).equals(data))
  const stream = await sbx.files.read('/tmp/bin.dat', { format: 'stream' })
  const parts = []
  for await (const chunk of stream) parts.push(Buffer.from(chunk))
  assert.ok(Buffer.concat(parts).equals(data))
  const sum = (await sbx.commands.run('sha256sum /tmp/bin.dat | cut -c1-64')).stdout.trim()
  assert.equal(sum, createHash('sha256').update(data).digest('hex'))
})

test('write a Blob and a ReadableStream; octet-stream and multipart', async (t) => {
  const sbx = await husk.sandbox(t)
  await sbx.files.write('/tmp/blob.txt', new Blob(['from a blob']))
  assert.equal(await sbx.files.read('/tmp/blob.txt'), 'from a blob')
  const rs = new ReadableStream({
    start(c) {
      c.enqueue(new TextEncoder().encode('chunk1-'))
      c.enqueue(new TextEncoder().encode('chunk2'))
      c.close()
    },
  })
  await sbx.files.write('/tmp/stream.txt', rs)
  assert.equal(await sbx.files.read('/tmp/stream.txt'), 'chunk1-chunk2')
  await sbx.files.write('/tmp/octet.txt', 'octet', { useOctetStream: true })
  await sbx.files.write('/tmp/multi.txt', 'multi', { useOctetStream: false })
  assert.equal(await sbx.files.read('/tmp/octet.txt'), 'octet')
  assert.equal(await sbx.files.read('/tmp/multi.txt'), 'multi')
})

test('overwrite, parents, empty file, missing file, directory', async (t) => {
  const sbx = await husk.sandbox(t)
  await sbx.files.write('/tmp/over.txt', 'first, longer')
  await sbx.files.write('/tmp/over.txt', 'second')
  assert.equal(await sbx.files.read('/tmp/over.txt'), 'second')
  await sbx.files.write('/home/user/a/b/c/deep.txt', 'deep')
  assert.equal((await sbx.files.getInfo('/home/user/a/b')).type, FileType.DIR)
  await sbx.files.write('/tmp/empty', '')
  assert.equal(await sbx.files.read('/tmp/empty'), '')
  await assert.rejects(sbx.files.read('/tmp/does-not-exist'), FileNotFoundError)
  await assert.rejects(sbx.files.read('/tmp'), InvalidArgumentError)
})

test('write many files', async (t) => {
  const sbx = await husk.sandbox(t)
  const files = Array.from({ length: 40 }, (_, i) => ({ path: `/home/user/many/d${i % 4}/f${i}.txt`, data: `content ${i}` }))
  const infos = await sbx.files.write(files)
  assert.deepEqual(infos.map((i) => i.path).sort(), files.map((f) => f.path).sort())
  for (const f of files.slice(0, 5)) assert.equal(await sbx.files.read(f.path), f.data)
  assert.equal((await sbx.commands.run('find /home/user/many -type f | wc -l')).stdout.trim(), '40')
  const more = await sbx.files.writeFiles([
    { path: '/tmp/wf/a', data: 'a' },
    { path: '/tmp/wf/b', data: new Uint8Array([0, 255]).buffer },
  ])
  assert.equal(more.length, 2)
  assert.deepEqual([...(await sbx.files.read('/tmp/wf/b', { format: 'bytes' }))], [0, 255])
})

test('list with depth; entry details', async (t) => {
  const sbx = await husk.sandbox(t)
  await sbx.commands.run(
    'mkdir -p /tmp/tree/sub/subsub && echo 1 > /tmp/tree/f1 && echo 22 > /tmp/tree/sub/f2 && ' +
      'echo 333 > /tmp/tree/sub/subsub/f3 && ln -s f1 /tmp/tree/link',
  )
  const one = await sbx.files.list('/tmp/tree')
  assert.deepEqual(one.map((e) => e.path).sort(), ['/tmp/tree/f1', '/tmp/tree/link', '/tmp/tree/sub'])
  const byName = Object.fromEntries(one.map((e) => [e.name, e]))
  assert.equal(byName.f1.type, FileType.FILE)
  assert.equal(byName.f1.size, 2)
  assert.equal(byName.sub.type, FileType.DIR)
  // As E2B's envd lists a symlink: the type of what it leads to, and the absolute path it
  // resolves to.
  assert.equal(byName.link.type, FileType.FILE, JSON.stringify(byName.link))
  assert.equal(byName.link.symlinkTarget, '/tmp/tree/f1', JSON.stringify(byName.link))
  const two = await sbx.files.list('/tmp/tree', { depth: 2 })
  assert.deepEqual(two.map((e) => e.path).sort(), [
    '/tmp/tree/f1',
    '/tmp/tree/link',
    '/tmp/tree/sub',
    '/tmp/tree/sub/f2',
    '/tmp/tree/sub/subsub',
  ])
  await assert.rejects(sbx.files.list('/tmp/nope-dir'), FileNotFoundError)
})

test('exists, getInfo, makeDir, rename, remove', async (t) => {
  const sbx = await husk.sandbox(t)
  await sbx.files.write('/home/user/stat.txt', '0123456789')
  await sbx.commands.run('chmod 640 /home/user/stat.txt')
  assert.equal(await sbx.files.exists('/home/user/stat.txt'), true)
  assert.equal(await sbx.files.exists('/home/user/nope'), false)
  const st = await sbx.files.getInfo('/home/user/stat.txt')
  assert.equal(st.name, 'stat.txt')
  assert.equal(st.type, FileType.FILE)
  assert.equal(st.size, 10)
  assert.equal(st.owner, 'user')
  assert.equal(st.group, 'user')
  assert.equal(st.mode & 0o777, 0o640)
  assert.match(st.permissions, /rw-r-----$/)
  assert.ok(st.modifiedTime instanceof Date)
  await assert.rejects(sbx.files.getInfo('/tmp/missing'), FileNotFoundError)

  assert.equal(await sbx.files.makeDir('/home/user/newdir'), true)
  assert.equal(await sbx.files.makeDir('/home/user/newdir'), false)
  assert.equal(await sbx.files.makeDir('/home/user/p/q/r'), true)
  assert.equal((await sbx.files.getInfo('/home/user/p/q')).type, FileType.DIR)

  const moved = await sbx.files.rename('/home/user/stat.txt', '/home/user/moved.txt')
  assert.equal(moved.path, '/home/user/moved.txt')
  assert.equal(await sbx.files.exists('/home/user/stat.txt'), false)
  assert.equal(await sbx.files.read('/home/user/moved.txt'), '0123456789')
  await assert.rejects(sbx.files.rename('/tmp/not-here', '/tmp/x'), FileNotFoundError)

  await sbx.files.write('/tmp/rm/a/b.txt', 'b')
  await sbx.files.remove('/tmp/rm')
  assert.equal(await sbx.files.exists('/tmp/rm'), false)
  // As E2B's envd (`os.RemoveAll`): what is not there is removed already.
  await sbx.files.remove('/tmp/rm')
  await sbx.files.remove('/tmp/never/there')

  // A symlink's info is its target's type, with the path it resolves to.
  await sbx.commands.run('ln -s /home/user/moved.txt /tmp/to-file && ln -s /home/user /tmp/to-dir')
  const link = await sbx.files.getInfo('/tmp/to-file')
  assert.equal(link.type, FileType.FILE, JSON.stringify(link))
  assert.equal(link.symlinkTarget, '/home/user/moved.txt')
  assert.equal((await sbx.files.getInfo('/tmp/to-dir')).type, FileType.DIR)
})

test('files as root', async (t) => {
  const sbx = await husk.sandbox(t)
  const info = await sbx.files.write('/root/r.txt', 'root data', { user: 'root' })
  assert.equal(info.path, '/root/r.txt')
  assert.equal((await sbx.files.getInfo('/root/r.txt', { user: 'root' })).owner, 'root')
  assert.equal(await sbx.files.read('/root/r.txt', { user: 'root' }), 'root data')
  assert.equal((await sbx.files.write('rel-root.txt', 'r', { user: 'root' })).path, '/root/rel-root.txt')
})

test('metadata on write', async (t) => {
  const sbx = await husk.sandbox(t)
  const info = await sbx.files.write('/tmp/meta.txt', 'm', { metadata: { 'Owner-Team': 'alpha', k: 'v' } })
  assert.deepEqual(info.metadata, { 'owner-team': 'alpha', k: 'v' })
  assert.deepEqual((await sbx.files.getInfo('/tmp/meta.txt')).metadata, { 'owner-team': 'alpha', k: 'v' })
  const listed = (await sbx.files.list('/tmp')).find((e) => e.name === 'meta.txt')
  assert.deepEqual(listed.metadata, { 'owner-team': 'alpha', k: 'v' })
  await sbx.files.write('/tmp/meta.txt', 'm2', { metadata: { other: '1' } })
  assert.deepEqual((await sbx.files.getInfo('/tmp/meta.txt')).metadata, { other: '1' })
  await sbx.files.write('/tmp/plain.txt', 'p')
  assert.equal((await sbx.files.getInfo('/tmp/plain.txt')).metadata, undefined)
})

test('gzip upload and download', async (t) => {
  const sbx = await husk.sandbox(t)
  const text = 'compress me '.repeat(5000)
  await sbx.files.write('/tmp/gz.txt', text, { gzip: true })
  assert.equal((await sbx.commands.run('wc -c < /tmp/gz.txt')).stdout.trim(), String(text.length))
  assert.equal(await sbx.files.read('/tmp/gz.txt', { gzip: true }), text)
  const data = randomBytes(100_000)
  await sbx.files.write('/tmp/gz.bin', new Blob([data]), { gzip: true })
  assert.ok(Buffer.from(await sbx.files.read('/tmp/gz.bin', { format: 'bytes', gzip: true })).equals(data))
})

test('watch: streaming events, recursive', async (t) => {
  const sbx = await husk.sandbox(t)
  await sbx.commands.run('mkdir -p /tmp/w/sub')
  const events = []
  let exited = false
  const h = await sbx.files.watchDir('/tmp/w', (e) => events.push(e), {
    recursive: true,
    timeoutMs: 30_000,
    onExit: () => {
      exited = true
    },
  })
  try {
    await sbx.files.write('/tmp/w/top.txt', 't')
    await sbx.files.write('/tmp/w/sub/nested.txt', 'n')
    await sbx.files.rename('/tmp/w/top.txt', '/tmp/w/renamed.txt')
    await sbx.files.remove('/tmp/w/renamed.txt')
    await waitFor(
      () => {
        const has = (name, types) => events.some((e) => e.name === name && types.includes(e.type))
        return (
          has('top.txt', [FilesystemEventType.CREATE, FilesystemEventType.WRITE]) &&
          has('sub/nested.txt', [FilesystemEventType.CREATE, FilesystemEventType.WRITE]) &&
          has('top.txt', [FilesystemEventType.RENAME]) &&
          has('renamed.txt', [FilesystemEventType.REMOVE])
        )
      },
      15_000,
      `watch events; got ${JSON.stringify(events)}`,
    )
  } finally {
    await h.stop()
  }
  await waitFor(() => exited, 5_000, 'onExit after stop')
})

test('watch: non-recursive ignores subdirs; errors', async (t) => {
  const sbx = await husk.sandbox(t)
  await sbx.commands.run('mkdir -p /tmp/flat/sub')
  const events = []
  const h = await sbx.files.watchDir('/tmp/flat', (e) => events.push(e), { timeoutMs: 30_000 })
  try {
    await sbx.commands.run('touch /tmp/flat/sub/hidden')
    await sbx.files.write('/tmp/flat/sentinel', '12345')
    await waitFor(() => events.some((e) => e.name === 'sentinel'), 15_000, `sentinel; got ${JSON.stringify(events)}`)
  } finally {
    await h.stop()
  }
  assert.ok(!events.some((e) => e.name.includes('hidden')), JSON.stringify(events))
  await assert.rejects(sbx.files.watchDir('/tmp/no-such-dir', () => {}), FileNotFoundError)
  await sbx.files.write('/tmp/a-file', 'x')
  await assert.rejects(sbx.files.watchDir('/tmp/a-file', () => {}), InvalidArgumentError)
})

test('watch: includeEntry', async (t) => {
  const sbx = await husk.sandbox(t)
  await sbx.files.makeDir('/tmp/w-entry')
  const events = []
  const h = await sbx.files.watchDir('/tmp/w-entry', (e) => events.push(e), { includeEntry: true, timeoutMs: 30_000 })
  try {
    await sbx.files.write('/tmp/w-entry/e.txt', '12345')
    await waitFor(() => events.some((e) => e.name === 'e.txt' && e.entry), 15_000, `an event with entry; got ${JSON.stringify(events)}`)
  } finally {
    await h.stop()
  }
  const withEntry = events.find((e) => e.name === 'e.txt' && e.entry)
  assert.equal(withEntry.entry.path, '/tmp/w-entry/e.txt')
  assert.equal(withEntry.entry.name, 'e.txt')
})
