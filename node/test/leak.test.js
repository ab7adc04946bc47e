'use strict';
const test = require('node:test');
const assert = require('node:assert/strict');
const { spawnSync } = require('node:child_process');
const path = require('node:path');

/** Runs a fixture under --expose-gc; what it printed, parsed. */
function runFixture(name, timeout) {
  const r = spawnSync(process.execPath, ['--expose-gc', path.join(__dirname, 'fixtures', name)], {
    encoding: 'utf8',
    timeout,
  });
  assert.equal(r.error, undefined);
  assert.equal(r.status, 0, r.stderr);
  return JSON.parse(r.stdout);
}

test('100,000 asks with timeouts and aborts, half through askHandle: counts and streams back to idle, heap bounded', () => {
  const { outcomes, handles, heapBefore, heapAfter, stats, total } = runFixture('leak.js', 240_000);
  assert.equal(total, 100_000);
  // A sixth each through askHandle with its stages read to the end, never
  // read (the handle dropped: only its finalizer closes its stream), or
  // returned after one.
  for (const use of ['read', 'dropped', 'returned']) {
    assert.ok(handles[use] >= total / 6 - 3, JSON.stringify(handles));
  }
  assert.equal(handles.unended, 0, 'every stage stream read through ended with a terminal stage');
  const sum = outcomes.ok + outcomes.timeout + outcomes.cancelled + outcomes.other;
  assert.equal(sum, total, 'every ask ended');
  assert.equal(outcomes.other, 0);
  assert.ok(outcomes.ok >= total / 3, JSON.stringify(outcomes));
  assert.ok(outcomes.timeout > 1_000, JSON.stringify(outcomes));
  assert.ok(outcomes.cancelled > 1_000, JSON.stringify(outcomes));
  assert.equal(stats.pending, 0, 'no ask pending');
  assert.equal(stats.outstanding, 0, 'no promise waiting on the addon');
  assert.equal(stats.requests, 0, 'no request held for a handler');
  assert.equal(stats.streams, 0, 'every stage stream closed: read through, returned, or its dropped handle collected');
  assert.equal(stats.tasks, 16, 'only the idle workers (2 pools x 8) remain');
  assert.equal(stats.armedTimers, 0);
  assert.equal(stats.dlqDepth, 0);
  for (const p of stats.pools) {
    assert.equal(p.inFlight, 0, p.name);
    assert.equal(p.dedupInProgress, 0, p.name);
    assert.equal(p.dedupTerminal, 0, `${p.name}: the expired replies were evicted`);
  }
  assert.ok(stats.timedOutRecords <= 1_000, 'timeout records stay within their bound');
  assert.equal(stats.objects, 0, 'every host object was released');
  const growth = heapAfter - heapBefore;
  assert.ok(growth < 8 * 1024 * 1024, `heap grew by ${growth} bytes over 90,000 asks`);
});

test('stage iterators dropped before their end close their streams when collected', () => {
  const { open } = runFixture('stages-dropped.js', 120_000);
  // 5,000 dropped per round: each round ends with (close to) none open,
  // not with every stream of the rounds before.
  assert.equal(open.length, 4);
  for (const n of open) assert.ok(n < 500, JSON.stringify(open));
});

test('a handle collected while its stages are read: the stream lives with its iterator', () => {
  // Its finalizer, meant for a handle nobody read the stages of, dropped
  // the stream under the iterator, which then ended after its first stage.
  const { collected, seen } = runFixture('stages-outlive-handle.js', 20_000);
  assert.equal(collected, true, 'the handle was collected');
  assert.deepEqual(seen, ['SENT', 'RECEIVED', 'READ', 'PARTIAL', 'FULFILLED']);
});

test('nodes dropped without close are collected as they pile up, their reply caches counted by V8', () => {
  // Each holds 1 MiB of reply-cache buckets V8's heap does not see. Not told
  // of it, V8 collected none of 400 (about 2,000 piled up, gigabytes, before
  // its first collection); told, it collects them as they come.
  const { made, collected } = runFixture('external.js', 60_000);
  assert.equal(made, 400);
  assert.ok(collected >= made / 2, `collected ${collected} of ${made}`);
});

test('replies cached past their TTL are let go while the node is idle', async () => {
  // The reply cache applied its TTL only on the pool's next request, and a
  // reply let go on a runtime thread freed its object only at the next call
  // into the addon: 2,000 100 kB replies stayed alive 5 s past a 500 ms TTL.
  const { Node } = require('..');
  const node = new Node();
  const pool = node.pool('ttl', { dedupTtlMs: 100 });
  pool.handle(async (m) => ({ m }));
  for (let i = 0; i < 50; i++) await node.ask('ttl', i);
  assert.ok(node.stats().objects >= 50, 'the cache holds the replies');
  const deadline = Date.now() + 20_000;
  while (node.stats().objects > 0 && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 20));
  }
  const stats = node.stats();
  assert.equal(stats.pools[0].dedupTerminal, 0, 'evicted with no request after them');
  assert.equal(stats.objects, 0, 'their objects released with no call into the addon');
  await node.close();
});
