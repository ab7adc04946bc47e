'use strict';
// index.d.ts is hand-written: check it against the runtime exports, and
// compile a typed usage file with tsc --strict.
const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { spawnSync } = require('node:child_process');

const root = path.join(__dirname, '..');

test('index.d.ts declares exactly the runtime exports', () => {
  const dts = fs.readFileSync(path.join(root, 'index.d.ts'), 'utf8');
  const declared = new Set();
  for (const m of dts.matchAll(/^export (?:declare )?(?:class|const|function) (\w+)/gm)) {
    declared.add(m[1]);
  }
  const runtime = new Set(Object.keys(require('..')));
  assert.deepEqual([...declared].sort(), [...runtime].sort());
});

test('every Node method of the wrapper is declared', () => {
  const dts = fs.readFileSync(path.join(root, 'index.d.ts'), 'utf8');
  const { Node, Pool, AskHandle } = require('..');
  for (const cls of [Node, Pool, AskHandle]) {
    const body = dts.slice(dts.indexOf(`export class ${cls.name}`));
    const block = body.slice(0, body.indexOf('\n}\n'));
    for (const name of Object.getOwnPropertyNames(cls.prototype)) {
      if (name === 'constructor' || name.startsWith('_')) continue;
      assert.match(block, new RegExp(`\\b${name}\\b[(<:]`), `${cls.name}.${name}`);
    }
  }
});

test('a typed usage file compiles with tsc --strict', () => {
  const tsc = path.join(root, 'node_modules', 'typescript', 'bin', 'tsc');
  const r = spawnSync(process.execPath, [tsc, '-p', path.join(__dirname, 'types', 'tsconfig.json')], {
    encoding: 'utf8',
  });
  assert.equal(r.status, 0, r.stdout + r.stderr);
});
