'use strict';
// The README's Node examples run as written (a doc that drifted from the
// API would fail here, not in a user's first try). Each runs as an ES
// module inside this package, so `import ... from 'askpool'` is the
// package itself, with the working directory a fresh one (the durable
// example makes its SQLite file there).

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { execFileSync } = require('node:child_process');

const README = path.join(__dirname, '..', '..', 'README.md');

function jsBlocks() {
  const text = fs.readFileSync(README, 'utf8');
  const section = text.split('\n## Node\n')[1].split('\n## ')[0];
  return [...section.matchAll(/^```js\n([\s\S]*?)^```$/gm)].map((m) => m[1]);
}

test('the README has its two Node examples', () => {
  assert.equal(jsBlocks().length, 2);
});

for (const [i, example] of jsBlocks().entries()) {
  test(`the README's Node example ${i + 1} runs`, () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'askpool-readme-'));
    // Inside the package, so that 'askpool' names it.
    const script = path.join(__dirname, `.readme-example-${i + 1}.mjs`);
    // The second example goes on from the first one (its node and pool),
    // before that one's close.
    const body =
      i === 0
        ? example
        : [
            jsBlocks()[0].replace(/^await node\.close\(\);.*$/m, ''),
            example.replace(/^const receipt = /m, 'const receipt2 = '),
            'await node.close();',
          ].join('\n');
    fs.writeFileSync(script, body);
    try {
      execFileSync(process.execPath, [script], { cwd: dir, timeout: 60_000, stdio: 'pipe' });
    } catch (e) {
      assert.fail(`exit ${e.status}: ${e.stderr}`);
    } finally {
      fs.rmSync(script, { force: true });
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
}
