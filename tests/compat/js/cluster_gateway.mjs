// The stock JS SDK (e2b@2.51.0) against a husk cluster's gateways. Not run on its own: the
// Python suite's test_cluster.py starts the cluster (PostgreSQL, three nodes, two gateways) and
// runs this file with HUSK_GATEWAYS (the gateways' URLs, comma-separated) and HUSK_API_KEY.
import { test, after } from 'node:test'
import assert from 'node:assert/strict'

import { Sandbox } from 'e2b'

const gateways = (process.env.HUSK_GATEWAYS ?? '').split(',').filter(Boolean)
const apiKey = process.env.HUSK_API_KEY
if (gateways.length < 2 || !apiKey) {
  throw new Error('run by test_cluster.py: HUSK_GATEWAYS (two or more URLs) and HUSK_API_KEY')
}
const opts = (i) => ({
  apiUrl: gateways[i % gateways.length],
  sandboxUrl: gateways[i % gateways.length],
  apiKey,
  requestTimeoutMs: 30_000,
})
const made = []
after(async () => {
  for (const id of made) {
    await Sandbox.kill(id, opts(0)).catch(() => {})
  }
})

test('creates through either gateway spread over the nodes and everything works through the other', async () => {
  const tag = `js-${process.pid}-${Date.now()}`
  const sandboxes = []
  for (let i = 0; i < 9; i++) {
    const s = await Sandbox.create({ timeoutMs: 120_000, metadata: { tag }, ...opts(i) })
    made.push(s.sandboxId)
    sandboxes.push(s)
  }
  const codes = new Set(sandboxes.map((s) => s.sandboxId.slice(0, 4)))
  assert.ok(codes.size >= 2, `nine creates landed on ${codes.size} node(s)`)
  for (const [i, s] of sandboxes.entries()) {
    const other = await Sandbox.connect(s.sandboxId, opts(i + 1))
    const r = await other.commands.run('echo js-$((20+22))')
    assert.equal(r.stdout, 'js-42\n')
    await other.files.write('/tmp/js.txt', `from ${i}`)
    assert.equal(await s.files.read('/tmp/js.txt'), `from ${i}`)
  }
  // A PTY on each node.
  for (const code of codes) {
    const s = sandboxes.find((x) => x.sandboxId.startsWith(code))
    const chunks = []
    const h = await s.pty.create({ cols: 80, rows: 24, onData: (d) => chunks.push(Buffer.from(d)), timeoutMs: 30_000 })
    await s.pty.sendInput(h.pid, new TextEncoder().encode('echo pty-$((6*7))\nexit 0\n'))
    await h.wait()
    assert.match(Buffer.concat(chunks).toString(), /pty-42/)
  }
  // The list merges every node's, through either gateway.
  for (let g = 0; g < gateways.length; g++) {
    const listed = await Sandbox.list({ query: { metadata: { tag } }, ...opts(g) }).nextItems()
    assert.deepEqual(new Set(listed.map((x) => x.sandboxId)), new Set(sandboxes.map((x) => x.sandboxId)))
  }
  for (const s of sandboxes) {
    await s.kill()
  }
})
