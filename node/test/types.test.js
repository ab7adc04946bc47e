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

// The option names an interface of index.d.ts declares: its own members,
// and those it takes from an `Omit<Base, ...>` it extends.
function declaredOptions(dts, name) {
  const m = dts.match(
    new RegExp(`^export interface ${name}(?: extends Omit<(\\w+), ([^>]+)>)? \\{\\n([\\s\\S]*?)\\n\\}`, 'm'),
  );
  assert.ok(m, `interface ${name} in index.d.ts`);
  const own = [...m[3].matchAll(/^ {2}(\w+)\?:/gm)].map((x) => x[1]);
  const omitted = m[2] ? [...m[2].matchAll(/'(\w+)'/g)].map((x) => x[1]) : [];
  const inherited = m[1] ? declaredOptions(dts, m[1]).filter((k) => !omitted.includes(k)) : [];
  return [...new Set([...inherited, ...own])].sort();
}

// The option names `call` reads from the options object it is given.
async function readOptions(call) {
  const read = new Set();
  const options = new Proxy(
    {},
    {
      get(_, key) {
        if (typeof key === 'string') read.add(key);
        return undefined;
      },
    },
  );
  await call(options);
  return [...read].sort();
}

test('each options type declares exactly the options the runtime reads', async () => {
  const dts = fs.readFileSync(path.join(root, 'index.d.ts'), 'utf8');
  const { Node } = require('..');
  const node = new Node();
  node.pool('p').handle((m) => m);
  const calls = [
    ['NodeOptions', 'new Node', (o) => new Node(o).close()],
    ['PoolOptions', 'pool', (o) => node.pool('q', o)],
    ['AskOptions', 'ask', (o) => node.ask('p', 1, o)],
    ['AskOptions', 'askHandle', (o) => node.askHandle('p', 1, o).result],
    ['TellOptions', 'tell', (o) => node.tell('p', 1, o)],
  ];
  for (const [type, name, call] of calls) {
    assert.deepEqual(await readOptions(call), declaredOptions(dts, type), `${name} reads what ${type} declares`);
  }
  await node.close();
});

test('a typed usage file compiles with tsc --strict', () => {
  const tsc = path.join(root, 'node_modules', 'typescript', 'bin', 'tsc');
  const r = spawnSync(process.execPath, [tsc, '-p', path.join(__dirname, 'types', 'tsconfig.json')], {
    encoding: 'utf8',
  });
  assert.equal(r.status, 0, r.stdout + r.stderr);
});
