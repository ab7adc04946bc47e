'use strict';
const test = require('node:test');
const assert = require('node:assert/strict');
const { spawnSync } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');

function run(fixture, flags = [], args = []) {
  const started = Date.now();
  const r = spawnSync(process.execPath, [...flags, path.join(__dirname, 'fixtures', fixture), ...args], {
    encoding: 'utf8',
    timeout: 20_000,
  });
  return { ...r, ms: Date.now() - started };
}

test('an idle node does not keep the process alive (no close)', () => {
  const r = run('idle-exit.js');
  assert.equal(r.error, undefined, 'the process exited by itself before the 20 s kill');
  assert.equal(r.status, 0, r.stderr);
  assert.equal(r.stdout, 'reply hello\n');
});

test('a pending ask keeps the process alive until it ends', () => {
  const r = run('pending-keeps-alive.js');
  assert.equal(r.error, undefined);
  assert.equal(r.status, 0, r.stderr);
  const m = /^ASK_TIMEOUT after (\d+)\n$/.exec(r.stdout);
  assert.ok(m, r.stdout);
  assert.ok(Number(m[1]) >= 250, `timed out after ${m[1]} ms`);
});

test('a node busy again after it went idle keeps the process alive again', () => {
  const r = run('busy-again-keeps-alive.js');
  assert.equal(r.error, undefined);
  assert.equal(r.status, 0, r.stderr);
  const m = /^ASK_TIMEOUT after (\d+)\n$/.exec(r.stdout);
  assert.ok(m, `the process exited before the ask ended: ${JSON.stringify(r.stdout)}`);
  assert.ok(Number(m[1]) >= 250, `timed out after ${m[1]} ms`);
});

test('durable asks ended by close() keep the process alive until they settle', () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'askpool-exit-'));
  try {
    const r = run('durable-close-keeps-alive.js', [], [path.join(dir, 'p.db')]);
    assert.equal(r.error, undefined, 'the process exited by itself');
    assert.equal(r.status, 0, r.stderr);
    assert.equal(r.stdout, 'settled 100 UNAVAILABLE\n', 'the process exited before they settled');
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('a wake from the runtime after its node was collected does nothing', () => {
  const r = run('wake-after-collected.js', ['--expose-gc']);
  assert.equal(r.error, undefined);
  assert.equal(r.status, 0, r.stderr);
  assert.equal(r.stdout, 'collected 1\n');
});

test('nodes dropped without close are collected once idle, not before', () => {
  const r = run('collected.js', ['--expose-gc']);
  assert.equal(r.error, undefined);
  assert.equal(r.status, 0, r.stderr);
  const m = /^survived ASK_TIMEOUT (\d+) (\d+) collected (\d+) threads (-?\d+)\n$/.exec(r.stdout);
  assert.ok(m, r.stdout);
  assert.equal(Number(m[1]), 20 + (19 * 20) / 2);
  assert.equal(Number(m[2]), 42);
  assert.equal(Number(m[3]), 21, 'every dropped node was collected once idle');
  if (Number(m[4]) >= 0) {
    // 22 nodes made: the addon's one shared runtime runs its two threads,
    // none per node (bindings/node/src/core.rs, RUNTIME).
    assert.equal(Number(m[4]), 2, "only the shared runtime's two threads run");
  }
});

test('closed nodes still referenced keep no threads', { skip: !fs.existsSync('/proc/self/task') }, () => {
  const r = run('closed-threads.js');
  assert.equal(r.error, undefined, 'the process exited by itself');
  assert.equal(r.status, 0, r.stderr);
  const m = /^start (\d+) peak (\d+) end (\d+) held 1000 UNAVAILABLE,UNAVAILABLE,UNAVAILABLE\n$/.exec(r.stdout);
  assert.ok(m, r.stdout);
  const [start, peak, end] = m.slice(1, 4).map(Number);
  // The addon's runtime (a few threads at most), not one per node.
  assert.ok(end - start <= 4, `threads went from ${start} to ${end}`);
  assert.ok(peak - start <= 4, `threads went from ${start} up to ${peak}`);
});
