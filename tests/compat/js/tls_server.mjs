// The stock JS SDK (e2b@2.51.0) against `husk serve --tls-cert/--tls-key`. Not run on its own:
// the Python suite's test_tls.py starts the server and runs this file with HUSK_URL (https://…),
// HUSK_API_KEY and NODE_EXTRA_CA_CERTS (the CA that signed the server's certificate).
import { test } from 'node:test'
import assert from 'node:assert/strict'

import { Sandbox } from 'e2b'

const url = process.env.HUSK_URL ?? ''
const apiKey = process.env.HUSK_API_KEY
if (!url.startsWith('https://') || !apiKey) {
  throw new Error('run by test_tls.py: HUSK_URL (https://…) and HUSK_API_KEY')
}
const opts = { apiUrl: url, sandboxUrl: url, apiKey, requestTimeoutMs: 30_000 }

test('create, a command, files and a list over HTTPS', async () => {
  const s = await Sandbox.create({ timeoutMs: 120_000, ...opts })
  try {
    const r = await s.commands.run('echo js-over-$((40+3))')
    assert.equal(r.stdout, 'js-over-43\n')
    await s.files.write('/tmp/js.txt', 'over https')
    assert.equal(await s.files.read('/tmp/js.txt'), 'over https')
    const listed = await Sandbox.list(opts).nextItems()
    assert.ok(listed.some((x) => x.sandboxId === s.sandboxId))
  } finally {
    await s.kill()
  }
})
