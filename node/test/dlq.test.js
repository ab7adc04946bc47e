'use strict';
const test = require('node:test');
const assert = require('node:assert/strict');
const { Node, BufferFullError, AskTimeoutError, UnavailableError } = require('..');

// Refused until its time ran out: the last refusal, or the deadline if it
// came first on a loaded machine (both are retryable: dead-lettered).
const refusedToTheEnd = (e) => e instanceof BufferFullError || e instanceof AskTimeoutError;

test('a refused ask lands in the DLQ with its payload; replay and purge', async () => {
  const node = new Node({ breaker: false });
  let release;
  node.pool('narrow', { maxInFlight: 1 }).handle((m) =>
    m.block ? new Promise((r) => (release = r)) : { ok: m },
  );
  const blocker = node.ask('narrow', { block: true });
  const payload = { block: false, n: 1 };
  await assert.rejects(node.ask('narrow', payload, { maxAttempts: 1 }), BufferFullError);
  const letters = node.deadLetters();
  assert.equal(letters.length, 1);
  const [letter] = letters;
  assert.equal(letter.payload, payload, 'the letter keeps the very payload');
  assert.equal(letter.pool, 'narrow');
  assert.equal(letter.reason, 'RETRIES_EXHAUSTED');
  assert.equal(letter.kind, 'ASK');
  assert.equal(letter.error.code, 'BUFFER_FULL');
  assert.ok(letter.error instanceof BufferFullError);
  assert.match(letter.requestId, /^[0-9a-f]{32}$/);
  await new Promise((r) => setImmediate(r));
  release('unblocked');
  assert.equal(await blocker, 'unblocked');
  const replayed = await node.replayDeadLetter(letter.requestId);
  assert.equal(replayed.ok, payload);
  assert.equal(node.deadLetters().length, 0, 'a replayed letter leaves the queue');

  await assert.rejects(node.ask('missing', 'x', { maxAttempts: 1 }));
  // NO_ROUTE is permanent: not dead-lettered.
  assert.equal(node.stats().dlqDepth, 0);
  const blocker2 = node.ask('narrow', { block: true });
  await assert.rejects(node.ask('narrow', { n: 2 }, { maxAttempts: 1 }));
  assert.equal(node.purgeDeadLetters(), 1);
  assert.equal(node.deadLetters().length, 0);
  await new Promise((r) => setImmediate(r));
  release('x');
  await blocker2;
  await node.close();
});

test('a durable ask resumed from its store and dead-lettered keeps its payload in the letter', async () => {
  const fs = require('node:fs');
  const os = require('node:os');
  const path = require('node:path');
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'askpool-dlq-'));
  const file = path.join(dir, 'promises.db');
  try {
    // A durable ask left pending by a node that closed under it.
    const first = new Node().openPromises(file);
    first.pool('orders').handle(() => new Promise(() => {}));
    const ask = first.askDurable('orders', { order: 7 });
    ask.result.catch(() => {});
    await new Promise((r) => setTimeout(r, 10));
    await first.close();

    // Resumed by another node (its message now exists only as JSON), into a
    // full pool: dead-lettered.
    // The durable ask waits as long as its promise (an hour): refused by
    // the full pool, it ends when its attempts do (about 7 s).
    const node = new Node({ breaker: false }).openPromises(file);
    let release;
    node.pool('orders', { maxInFlight: 1 }).handle((m) =>
      m.block ? new Promise((r) => (release = r)) : { got: m },
    );
    const blocker = node.ask('orders', { block: true }, { timeoutMs: 60_000 });
    await assert.rejects(node.awaitDurable(ask.id), refusedToTheEnd);
    const [letter] = node.deadLetters();
    assert.equal(letter.requestId, ask.id);
    assert.deepEqual(letter.payload, { order: 7 }, 'the letter shows the message it holds');
    await new Promise((r) => setImmediate(r));
    release('done');
    await blocker;
    assert.deepEqual(await node.replayDeadLetter(letter.requestId), { got: { order: 7 } });
    await node.close();
  } finally {
    fs.rmSync(dir, { recursive: true });
  }
});

test('replaying the dead letter of a durable ask settles its promise', async () => {
  const fs = require('node:fs');
  const os = require('node:os');
  const path = require('node:path');
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'askpool-dlq-'));
  try {
    // Refused to the end: its attempts end (about 7 s), not its promise.
    const node = new Node({ breaker: false }).openPromises(path.join(dir, 'promises.db'));
    let release;
    let runs = 0;
    node.pool('orders', { maxInFlight: 1 }).handle((m) => {
      if (m.block) return new Promise((r) => (release = r));
      runs += 1;
      return { got: m };
    });
    const blocker = node.ask('orders', { block: true }, { timeoutMs: 60_000 });
    const ask = node.askDurable('orders', { order: 8 });
    await assert.rejects(ask.result, refusedToTheEnd);
    assert.equal(node.promises.get(ask.id).state, 'PENDING', 'a transient failure is no outcome');
    await new Promise((r) => setImmediate(r));
    release('done');
    await blocker;
    assert.deepEqual(await node.replayDeadLetter(ask.id), { got: { order: 8 } });
    const settled = node.promises.get(ask.id);
    assert.equal(settled.state, 'RESOLVED', 'the replay recorded its outcome');
    assert.deepEqual(settled.value, { got: { order: 8 } });
    assert.deepEqual(await node.awaitDurable(ask.id), { got: { order: 8 } });
    assert.equal(runs, 1);
    await node.close();
  } finally {
    fs.rmSync(dir, { recursive: true });
  }
});

test('replayDeadLetter gives an AskHandle: ids, stages, cancel; a missing letter rejects through it', async () => {
  const node = new Node({ breaker: false });
  let release;
  node.pool('narrow', { maxInFlight: 1 }).handle((m) => (m.block ? new Promise((r) => (release = r)) : m.n));
  const blocker = node.ask('narrow', { block: true });
  const correlationId = 'c'.repeat(32);
  await assert.rejects(node.ask('narrow', { n: 5 }, { maxAttempts: 1, correlationId }), refusedToTheEnd);
  const [letter] = node.deadLetters();
  await new Promise((r) => setImmediate(r));
  release('free');
  await blocker;
  const replay = node.replayDeadLetter(letter.requestId);
  assert.equal(replay.requestId, letter.requestId);
  assert.equal(replay.correlationId, correlationId);
  const stages = [];
  for await (const s of replay.stages()) stages.push(s.stage);
  assert.deepEqual(stages, ['SENT', 'RECEIVED', 'READ', 'FULFILLED']);
  assert.equal(await replay, 5);

  const missing = node.replayDeadLetter('0123456789abcdef0123456789abcdef');
  assert.equal(missing.requestId, '0123456789abcdef0123456789abcdef');
  assert.equal(await missing.catch((e) => e.code), 'FAILED_PRECONDITION');
  await assert.rejects(node.replayDeadLetter(42), { code: 'INVALID_ARGUMENT' });

  // A replay cancelled by its caller: ASK_CANCELLED, and the letter does not come back.
  const blocker2 = node.ask('narrow', { block: true });
  await assert.rejects(node.ask('narrow', { n: 6 }, { maxAttempts: 1 }), refusedToTheEnd);
  const [second] = node.deadLetters();
  const cancelled = node.replayDeadLetter(second.requestId);
  cancelled.cancel();
  assert.equal(await cancelled.catch((e) => e.code), 'ASK_CANCELLED');
  await new Promise((r) => setImmediate(r));
  release('x');
  await blocker2;
  await node.close();
});

test("a tell's dead letter replays as a tell: it resolves to its request id once accepted, with no stages", async () => {
  const node = new Node({ breaker: false });
  let release;
  const told = [];
  node.pool('narrow', { maxInFlight: 1 }).handle((m) => {
    if (m.block) return new Promise((r) => (release = r));
    told.push(m);
    return 'an answer nobody asked for';
  });
  const blocker = node.ask('narrow', { block: true });
  const payload = { n: 9 };
  await assert.rejects(node.tell('narrow', payload, { maxAttempts: 1 }), refusedToTheEnd);
  const [letter] = node.deadLetters();
  assert.equal(letter.kind, 'TELL');
  await new Promise((r) => setImmediate(r));
  release('free');
  await blocker;
  const replay = node.replayDeadLetter(letter.requestId);
  assert.equal(replay.requestId, letter.requestId);
  const stages = [];
  for await (const s of replay.stages()) stages.push(s.stage);
  assert.deepEqual(stages, []);
  assert.equal(await replay, letter.requestId);
  assert.equal(node.deadLetters().length, 0);
  while (told.length === 0) await new Promise((r) => setImmediate(r));
  assert.equal(told[0], payload, 'the handler got the very payload');
  await node.close();
});

test('a closed node refuses replayDeadLetter with UNAVAILABLE, for any id; its letters can still be read', async () => {
  const node = new Node({ breaker: false });
  let runs = 0;
  node.pool('narrow', { maxInFlight: 1 }).handle((m) => {
    runs++;
    return m.block ? new Promise(() => {}) : m;
  });
  const blocker = node.ask('narrow', { block: true }).catch((e) => e);
  await assert.rejects(node.ask('narrow', { n: 1 }, { maxAttempts: 1 }), refusedToTheEnd);
  const [letter] = node.deadLetters();
  await node.close();
  const handle = node.replayDeadLetter(letter.requestId);
  assert.equal(handle.requestId, letter.requestId);
  const unavailable = (e) => e instanceof UnavailableError && e.code === 'UNAVAILABLE';
  await assert.rejects(handle.result, unavailable);
  // Whether the queue holds the id or not: the node is closed, not the letter missing.
  await assert.rejects(node.replayDeadLetter('0123456789abcdef0123456789abcdef').result, unavailable);
  assert.deepEqual(
    node.deadLetters().map((l) => l.requestId),
    [letter.requestId],
  );
  assert.equal(runs, 1, 'only the blocking ask ran');
  assert.equal((await blocker).code, 'UNAVAILABLE');
});
