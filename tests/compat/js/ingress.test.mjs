// Ingress with the stock JS SDK (e2b@2.51.0): a server started in the sandbox through the SDK is
// reached at the host `getHost(port)` names (sent to husk as the Host header; the SDK's domain is
// never resolved); a closed port answers "port is not open"; a private sandbox
// (`network: { allowPublicTraffic: false }`) opens to its `trafficAccessToken` only.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import http from 'node:http'

import { startServer, waitFor } from './server.mjs'

const PORT = 8000
const BODY = 'hello from inside the sandbox\n'

let husk
let otherKey
before(async () => {
  husk = await startServer()
  otherKey = husk.createKey('other')
})
after(async () => {
  await husk?.stop()
})

/** GET `path` from husk (127.0.0.1 only) with `Host: host`. */
function viaHost(host, path = '/hello.txt', headers = {}) {
  return new Promise((resolve, reject) => {
    const req = http.request(
      { host: '127.0.0.1', port: husk.port, path, headers: { Host: host, ...headers }, timeout: 20_000 },
      (res) => {
        const parts = []
        res.on('data', (c) => parts.push(c))
        res.on('end', () => resolve({ status: res.statusCode, text: Buffer.concat(parts).toString('utf8') }))
        res.on('error', reject)
      },
    )
    req.on('timeout', () => req.destroy(new Error('timed out')))
    req.on('error', reject)
    req.end()
  })
}

async function startFileServer(sbx) {
  await sbx.files.write('/tmp/www/hello.txt', BODY)
  await sbx.commands.run(`python3 -m http.server ${PORT} --bind 0.0.0.0 --directory /tmp/www`, {
    background: true,
  })
}

async function waitServing(host, headers = {}) {
  return waitFor(
    async () => {
      const r = await viaHost(host, '/hello.txt', headers)
      return r.status === 200 ? r : null
    },
    30_000,
    `the server at ${host}`,
  )
}

test('getHost reaches a server in the sandbox', async (t) => {
  const sbx = await husk.sandbox(t)
  // husk gives every sandbox a traffic token (the code interpreter's port wants a credential
  // and the SDK sends this one with every call); a public sandbox's ports ignore it.
  assert.equal(typeof sbx.trafficAccessToken, 'string')
  assert.equal(sbx.trafficAccessToken.length, 40)
  const host = sbx.getHost(PORT)
  assert.ok(host.startsWith(`${PORT}-${sbx.sandboxId}.`), host)
  const closed = await viaHost(host)
  assert.equal(closed.status, 502)
  assert.match(JSON.parse(closed.text).message, /port is not open/)

  await startFileServer(sbx)
  assert.equal((await waitServing(host)).text, BODY)
})

test('a private sandbox opens to its traffic token only', async (t) => {
  const sbx = await husk.sandbox(t, { network: { allowPublicTraffic: false } })
  const token = sbx.trafficAccessToken
  assert.equal(typeof token, 'string')
  await startFileServer(sbx)
  const host = sbx.getHost(PORT)
  assert.equal((await waitServing(host, { 'E2B-Traffic-Access-Token': token })).text, BODY)
  for (const headers of [{}, { 'E2B-Traffic-Access-Token': 'x'.repeat(token.length) }, { 'X-API-Key': otherKey }]) {
    const r = await viaHost(host, '/hello.txt', headers)
    assert.equal(r.status, 403, JSON.stringify(headers))
    assert.equal(JSON.parse(r.text).code, 403)
  }
  assert.equal((await viaHost(host, '/hello.txt', { 'X-API-Key': husk.adminKey })).text, BODY)
})

test('maskRequestHost is the Host the sandbox server sees', async (t) => {
  const sbx = await husk.sandbox(t, { network: { maskRequestHost: '${PORT}-myapp.example.com' } })
  await sbx.files.write(
    '/tmp/echo_host.py',
    [
      'import http.server',
      'class H(http.server.BaseHTTPRequestHandler):',
      '    def do_GET(self):',
      "        body = self.headers.get('Host', '').encode()",
      "        self.send_response(200); self.send_header('Content-Length', str(len(body)))",
      '        self.end_headers(); self.wfile.write(body)',
      `http.server.HTTPServer(('0.0.0.0', ${PORT}), H).serve_forever()`,
    ].join('\n'),
  )
  await sbx.commands.run('python3 /tmp/echo_host.py', { background: true })
  const r = await waitServing(sbx.getHost(PORT))
  assert.equal(r.text, `${PORT}-myapp.example.com`)
})
