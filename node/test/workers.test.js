'use strict';
const test = require('node:test');
const assert = require('node:assert/strict');
const { spawnSync } = require('node:child_process');
const path = require('node:path');

// The addon loads once per worker thread (a new napi env each time); a
// process whose worker threads use askpool must neither crash nor hang.
test('nodes in worker threads: load, ask, exit or be terminated, many times', () => {
  const r = spawnSync(process.execPath, [path.join(__dirname, 'fixtures', 'workers.js')], {
    encoding: 'utf8',
    timeout: 60_000,
  });
  assert.equal(r.error, undefined, 'the process ended by itself before the 60 s kill');
  assert.equal(r.signal, null, `the process died of ${r.signal}: ${r.stderr}`);
  assert.equal(r.status, 0, r.stderr);
  const result = JSON.parse(r.stdout);
  assert.deepEqual(result, {
    replies: 24 + 4 + 12,
    exitedByThemselves: 24 + 2,
    terminated: 2 + 12,
    errors: [],
  });
});
