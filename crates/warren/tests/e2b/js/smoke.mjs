// The official E2B JS SDK (npm `e2b`, pinned in package-lock.json) against warren's E2B API:
// create, commands.run, files write/read/list, list by metadata, kill. Run by
// crates/warren/tests/suite/e2b.rs with E2B_API_KEY, E2B_API_URL, E2B_SANDBOX_URL and
// WARREN_E2B_RUN set; prints `SCENARIO PASSED: js` when every check held.
import assert from 'node:assert/strict'
import { readFileSync } from 'node:fs'
import { CommandExitError, NotFoundError, Sandbox, FileType } from 'e2b'

const { version } = JSON.parse(
  readFileSync(new URL('./node_modules/e2b/package.json', import.meta.url), 'utf8'),
)
const RUN = process.env.WARREN_E2B_RUN
const HOME = '/home/user'
const hang = setTimeout(() => {
  console.error('the JS scenario hung for 120 s')
  process.exit(2)
}, 120_000)

const sbx = await Sandbox.create({ metadata: { run: RUN, scenario: 'js' }, timeoutMs: 120_000 })
try {
  assert.match(sbx.sandboxId, /^[a-z0-9]+$/, 'a sandbox id of letters and digits')

  const result = await sbx.commands.run('echo out; echo err >&2; id -un; pwd')
  assert.equal(result.stdout, `out\nuser\n${HOME}\n`, 'stdout of a command')
  assert.equal(result.stderr, 'err\n', 'stderr of a command')
  assert.equal(result.exitCode, 0, 'exit code of a command')
  await assert.rejects(
    sbx.commands.run('echo bad >&2; exit 4'),
    (error) => error instanceof CommandExitError && error.exitCode === 4 && error.stderr === 'bad\n',
    'a non-zero exit is a CommandExitError',
  )
  const withEnv = await sbx.commands.run('echo $JS_VAR', { envs: { JS_VAR: 'js-env' } })
  assert.equal(withEnv.stdout, 'js-env\n', 'a command env var')

  const info = await sbx.files.write(`${HOME}/js/hello.txt`, 'hello from js')
  assert.equal(info.path, `${HOME}/js/hello.txt`, "write's path")
  assert.equal(await sbx.files.read(`${HOME}/js/hello.txt`), 'hello from js', 'read as text')
  const bytes = new Uint8Array([0, 1, 2, 253, 254, 255])
  await sbx.files.write(`${HOME}/js/bytes.bin`, bytes.buffer)
  const back = await sbx.files.read(`${HOME}/js/bytes.bin`, { format: 'bytes' })
  assert.deepEqual(Array.from(back), Array.from(bytes), 'read as bytes')
  const entries = await sbx.files.list(`${HOME}/js`)
  assert.deepEqual(
    entries.map((e) => [e.name, e.type]).sort(),
    [['bytes.bin', FileType.FILE], ['hello.txt', FileType.FILE]],
    'list of a dir',
  )
  assert.equal((await sbx.commands.run('cat js/hello.txt')).stdout, 'hello from js', 'a written file, seen by a command')

  const pager = Sandbox.list({ query: { metadata: { run: RUN, scenario: 'js' } } })
  const listed = await pager.nextItems()
  assert.deepEqual(listed.map((s) => s.sandboxId), [sbx.sandboxId], 'list filtered by metadata')

  const again = await Sandbox.connect(sbx.sandboxId)
  assert.equal(await again.files.read(`${HOME}/js/hello.txt`), 'hello from js', 'read after connect')

  assert.equal(await Sandbox.kill(sbx.sandboxId), true, 'kill of a live sandbox')
  assert.equal(await Sandbox.kill(sbx.sandboxId), false, 'a second kill')
  await assert.rejects(Sandbox.connect(sbx.sandboxId), NotFoundError, 'connect to a killed sandbox')
  const after = await Sandbox.list({ query: { metadata: { run: RUN } } }).nextItems()
  assert.deepEqual(after, [], 'the list after kill')
} finally {
  await Sandbox.kill(sbx.sandboxId).catch(() => {})
}
clearTimeout(hang)
console.log(`SCENARIO PASSED: js (e2b ${version})`)
