'use strict';
// The npm tarball installs into a fresh project and works from CJS and ESM.
const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { execFileSync } = require('node:child_process');

const root = path.join(__dirname, '..');
const npm = process.platform === 'win32' ? 'npm.cmd' : 'npm';

test("askpool/package.json can be required (tools read a package's version from it)", () => {
  // The package requiring itself by name goes through its exports, as an
  // installed one does.
  const pkg = require('askpool/package.json');
  assert.equal(pkg, require('../package.json'));
  assert.equal(pkg.name, 'askpool');
});

test('npm pack, install into a fresh directory, require and import', () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'askpool-pack-'));
  try {
    const out = execFileSync(npm, ['pack', '--json', '--pack-destination', dir], {
      cwd: root,
      encoding: 'utf8',
    });
    const [info] = JSON.parse(out);
    const files = info.files.map((f) => f.path).sort();
    for (const f of ['askpool.node', 'index.d.ts', 'index.js', 'index.mjs', 'lib/node.js']) {
      assert.ok(files.includes(f), `the tarball holds ${f}: ${files}`);
    }
    assert.ok(!files.some((f) => f.startsWith('test/')), 'tests stay out of the tarball');
    const app = path.join(dir, 'app');
    fs.mkdirSync(app);
    fs.writeFileSync(path.join(app, 'package.json'), '{"name":"app","private":true}');
    execFileSync(
      npm,
      ['install', '--no-audit', '--no-fund', '--offline', path.join(dir, info.filename)],
      { cwd: app, encoding: 'utf8' },
    );
    const cjs = `const { Node } = require('askpool');
      if (require('askpool/package.json').name !== 'askpool') throw new Error('askpool/package.json');
      const node = new Node();
      node.pool('p').handle((m) => m + 1);
      node.ask('p', 1).then((r) => { console.log('cjs', r); return node.close(); });`;
    const esm = `import { Node } from 'askpool';
      const node = new Node();
      node.pool('p').handle((m) => m * 10);
      console.log('esm', await node.ask('p', 4));
      await node.close();`;
    const env = { ...process.env, ASKPOOL_NATIVE: '' };
    assert.equal(
      execFileSync(process.execPath, ['-e', cjs], { cwd: app, encoding: 'utf8', env }),
      'cjs 2\n',
    );
    assert.equal(
      execFileSync(process.execPath, ['--input-type=module', '-e', esm], {
        cwd: app,
        encoding: 'utf8',
        env,
      }),
      'esm 40\n',
    );
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
