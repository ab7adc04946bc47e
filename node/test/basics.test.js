'use strict';
const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const vm = require('node:vm');
const {
  Node,
  InternalError,
  InvalidArgumentError,
  NoRouteError,
  PayloadMismatchError,
  OversizePayloadError,
  FailedPreconditionError,
} = require('..');

test('a reply comes back, and both objects pass by identity', async () => {
  const node = new Node();
  let seen;
  const reply = { answer: 42 };
  node.pool('echo').handle(async (msg) => {
    seen = msg;
    return reply;
  });
  const msg = { question: 'what' };
  const got = await node.ask('echo', msg);
  assert.equal(seen, msg);
  assert.equal(got, reply);
  await node.close();
});

test('sync handlers, primitives and undefined replies', async () => {
  const node = new Node();
  node.pool('double').handle((n) => n * 2);
  node.pool('nothing').handle(() => undefined);
  assert.equal(await node.ask('double', 21), 42);
  assert.equal(await node.ask('nothing', 'x'), undefined);
  await node.close();
});

test('many asks in flight over a pool of several workers', async () => {
  const node = new Node();
  let running = 0;
  let most = 0;
  const pool = node.pool('slow', { concurrency: 4 });
  pool.handle(async (n) => {
    running++;
    most = Math.max(most, running);
    await new Promise((r) => setTimeout(r, 1));
    running--;
    return n + 1;
  });
  const replies = await Promise.all(Array.from({ length: 200 }, (_, i) => node.ask(pool, i)));
  assert.deepEqual(replies, Array.from({ length: 200 }, (_, i) => i + 1));
  assert.equal(most, 4, 'concurrency bounds the handlers running at once');
  await node.close();
});

test('ids and the preferred worker reach the handler context', async () => {
  const node = new Node();
  let ctxSeen;
  node.pool('ctx', { concurrency: 3 }).handle((msg, ctx) => {
    ctxSeen = {
      requestId: ctx.requestId,
      correlationId: ctx.correlationId,
      worker: ctx.workerId,
      pool: ctx.pool,
      attempt: ctx.attempt,
    };
    return msg;
  });
  const requestId = '0123456789abcdef0123456789abcdef';
  const correlationId = 'fedcba9876543210fedcba9876543210';
  await node.ask('ctx', 1, { requestId, correlationId, preferredWorker: 'w2' });
  assert.deepEqual(ctxSeen, { requestId, correlationId, worker: 'w2', pool: 'ctx', attempt: 1 });
  await node.close();
});

test('a context used after its handler ended: FailedPreconditionError, not a TypeError', async () => {
  const node = new Node();
  const contexts = [];
  node.pool('p').handle(async (msg, ctx) => {
    contexts.push(ctx);
    // Read while the handler runs or not: the same answer once it ended.
    if (msg === 'read') assert.equal(typeof ctx.requestId, 'string');
    if (msg === 'throw') throw new Error('no');
    return msg;
  });
  await node.ask('p', 'plain');
  await node.ask('p', 'read');
  await assert.rejects(node.ask('p', 'throw'));
  const ended = (e) => {
    assert.ok(e instanceof FailedPreconditionError, `${e?.constructor?.name}: ${e?.message}`);
    assert.equal(e.code, 'FAILED_PRECONDITION');
    assert.match(e.message, /^failed precondition: ctx\.\S+ after the handler ended: the context of a request ended with its handler/);
    return true;
  };
  for (const ctx of contexts) {
    for (const getter of ['requestId', 'correlationId', 'causationId', 'pool', 'attempt', 'workerId']) {
      assert.throws(() => ctx[getter], ended, getter);
    }
    assert.throws(() => ctx.progress(0.5, 'late'), ended);
    assert.throws(() => ctx.progress('x'), /progress must be a fraction/, 'a bad argument is still reported first');
    // What tells a handler to stop keeps answering.
    assert.equal(ctx.cancelled, false);
    assert.equal(ctx.signal.aborted, true);
  }
  // The case as met: a timer the handler set, firing after it resolved.
  let late;
  node.pool('timer').handle(async (msg, ctx) => {
    late = new Promise((resolve) =>
      setTimeout(() => {
        try {
          ctx.progress(1);
          resolve(null);
        } catch (e) {
          resolve(e);
        }
      }, 5),
    );
    return msg;
  });
  assert.equal(await node.ask('timer', 1), 1);
  assert.ok(ended(await late));
  await node.close();
});

test('askHandle: request id, result, and the ACK stages with progress', async () => {
  const node = new Node();
  let handlerRequestId;
  node.pool('steps').handle(async (msg, ctx) => {
    handlerRequestId = ctx.requestId;
    ctx.progress(0.5, 'half way');
    await new Promise((r) => setTimeout(r, 5));
    return msg.toUpperCase();
  });
  const handle = node.askHandle('steps', 'abc');
  assert.match(handle.requestId, /^[0-9a-f]{32}$/);
  const stages = [];
  for await (const s of handle.stages()) stages.push(s);
  assert.equal(await handle, 'ABC');
  assert.equal(await handle.result, 'ABC');
  assert.equal(handlerRequestId, handle.requestId);
  const names = stages.map((s) => s.stage);
  assert.deepEqual(names, ['SENT', 'RECEIVED', 'READ', 'PARTIAL', 'FULFILLED']);
  const partial = stages[3];
  assert.equal(partial.note, 'half way');
  assert.equal(partial.fraction, 0.5);
  assert.ok(stages[4].sinceSentMs >= stages[3].sinceSentMs);
  assert.throws(() => handle.stages(), { code: 'INVALID_ARGUMENT' });
  await node.close();
});

test('stages can be read after the ask ended', async () => {
  const node = new Node();
  node.pool('p').handle((m) => m);
  const handle = node.askHandle('p', 1);
  await handle;
  const names = [];
  for await (const s of handle.stages()) names.push(s.stage);
  assert.deepEqual(names, ['SENT', 'RECEIVED', 'READ', 'FULFILLED']);
  await node.close();
});

test('stages(): next() called again before a stage came queues, as an async generator does', { timeout: 10_000 }, async () => {
  const node = new Node();
  node.pool('p').handle(async (m, ctx) => {
    ctx.progress(0.5, 'half');
    await new Promise((r) => setTimeout(r, 5));
    return m;
  });
  const handle = node.askHandle('p', 1);
  const it = handle.stages()[Symbol.asyncIterator]();
  const reads = [it.next(), it.next(), it.next(), it.next(), it.next(), it.next(), it.next()];
  const got = await Promise.all(reads);
  assert.deepEqual(
    got.map((r) => (r.done ? 'done' : r.value.stage)),
    ['SENT', 'RECEIVED', 'READ', 'PARTIAL', 'FULFILLED', 'done', 'done'],
  );
  assert.equal(await handle, 1);
  assert.equal(node.stats().outstanding, 0, 'no read left pending (it would keep the process alive)');
  assert.equal(node.stats().streams, 0);
  await node.close();
});

test('stages(): return() with a read pending ends the read; a stream opened right after gets every stage', { timeout: 10_000 }, async () => {
  const node = new Node();
  let release;
  node.pool('slow').handle((m) => new Promise((r) => (release = () => r(m))));
  node.pool('echo').handle((m) => m);
  const first = node.askHandle('slow', 1);
  const it = first.stages()[Symbol.asyncIterator]();
  for (const stage of ['SENT', 'RECEIVED', 'READ']) assert.equal((await it.next()).value.stage, stage);
  const pending = it.next(); // the terminal stage is far away
  it.return(); // not awaited: the next stream opens in the same turn
  const second = node.askHandle('echo', 2);
  const names = [];
  for await (const s of second.stages()) names.push(s.stage);
  assert.deepEqual(names, ['SENT', 'RECEIVED', 'READ', 'FULFILLED']);
  assert.deepEqual(await pending, { value: undefined, done: true });
  assert.deepEqual(await it.next(), { value: undefined, done: true });
  release();
  assert.equal(await first, 1);
  assert.equal(await second, 2);
  assert.equal(node.stats().outstanding, 0, 'no read left pending (it would keep the process alive)');
  assert.equal(node.stats().streams, 0);
  await node.close();
});

test('tell: the handler runs, the promise resolves to the request id', async () => {
  const node = new Node();
  let got;
  let ran;
  const done = new Promise((r) => (ran = r));
  node.pool('sink').handle((msg, ctx) => {
    got = { msg, id: ctx.requestId };
    ran();
  });
  const msg = { event: 'x' };
  const id = await node.tell('sink', msg);
  await done;
  assert.equal(got.msg, msg);
  assert.equal(got.id, id);
  await node.close();
});

test('a duplicate request id is answered from the reply cache', async () => {
  const node = new Node();
  let runs = 0;
  node.pool('once').handle((m) => {
    runs++;
    return { m };
  });
  const requestId = '00000000000000000000000000000abc';
  const first = await node.ask('once', 1, { requestId });
  const second = await node.ask('once', 1, { requestId });
  assert.equal(runs, 1);
  assert.equal(second, first, 'the cached reply is the very object');
  await node.close();
});

test('a pool passed as an object, and pool.close() leads to NO_ROUTE', async () => {
  const node = new Node();
  const pool = node.pool('closing').handle((m) => m);
  assert.equal(await node.ask(pool, 5), 5);
  pool.close();
  await assert.rejects(node.ask(pool, 5, { maxAttempts: 1 }), { code: 'NO_ROUTE' });
  await node.close();
});

test('close(): pending asks reject with UNAVAILABLE, later asks too', async () => {
  const node = new Node();
  node.pool('never').handle(() => new Promise(() => {}));
  const pending = node.ask('never', 1, { maxAttempts: 1 });
  await new Promise((r) => setImmediate(r));
  await node.close();
  await assert.rejects(pending, { code: 'UNAVAILABLE', name: 'UnavailableError' });
  await assert.rejects(node.ask('never', 2), { code: 'UNAVAILABLE' });
  assert.equal(node.closed, true);
});

test('close() lets go of the messages of the asks it ended, called by a handler too', async () => {
  // The close's drain ends the asks, and the addon lets go of their
  // messages as it does: reported at the next drain, which a closed node
  // never has. A closed node still referenced held them.
  for (const how of ['outside', 'handler']) {
    const node = new Node();
    node.pool('never').handle(() => new Promise(() => {}));
    node.pool('closer').handle(() => {
      node.close();
      return 'closed';
    });
    const pending = [1, 2, 3].map((i) => node.ask('never', { i }).catch((e) => e.code));
    await new Promise((r) => setImmediate(r));
    if (how === 'outside') await node.close();
    else assert.equal(await node.ask('closer', { big: 'x'.repeat(1000) }).catch((e) => e.code), 'UNAVAILABLE');
    assert.deepEqual(await Promise.all(pending), ['UNAVAILABLE', 'UNAVAILABLE', 'UNAVAILABLE'], how);
    await new Promise((r) => setImmediate(r));
    assert.equal(node.stats().objects, 0, `${how}: no message held by the closed node`);
  }
});

test('close() called by a handler or an abort listener as it runs: every pending ask still settles', { timeout: 10_000 }, async () => {
  // A handler's body runs inside the node's drain; so does the abort
  // listener of a handler's ctx.signal.
  for (const how of ['handler', 'ctx.signal listener']) {
    const node = new Node();
    node.pool('never').handle(() => new Promise(() => {}));
    node.pool('closer').handle((m, ctx) => {
      if (how === 'handler') {
        node.close();
        return 'closed';
      }
      ctx.signal.addEventListener('abort', () => node.close());
      return new Promise(() => {});
    });
    const pending = node.ask('never', 1, { timeoutMs: 60_000 });
    await new Promise((r) => setImmediate(r));
    const closer = node.ask('closer', 1, { timeoutMs: how === 'handler' ? 60_000 : 50 });
    await assert.rejects(pending, { code: 'UNAVAILABLE' }, how);
    await assert.rejects(closer, { code: how === 'handler' ? 'UNAVAILABLE' : 'ASK_TIMEOUT' }, how);
    assert.equal(node.stats().outstanding, 0, how);
    assert.equal(node.closed, true);
  }
});

test('a Rust panic becomes a JS error, and the process carries on', async () => {
  const native = require('../lib/native');
  const core = new native.Core(() => {});
  assert.throws(() => core.debugPanic(), (e) => /panic/i.test(e.message));
  const node = new Node();
  node.pool('alive').handle((m) => m);
  assert.equal(await node.ask('alive', 7), 7);
  await node.close();
  core.close();
});

test('the hot calls (raw N-API) refuse bad arguments and turn a panic into INTERNAL', async () => {
  const native = require('../lib/native');
  const { fromNative } = require('../lib/errors');
  const node = new Node();
  node.pool('echo').handle((m) => m);
  assert.equal(await node.ask('echo', 1), 1);
  const core = new native.Core(() => {});
  const id = core.fastPath();
  const buf = new Uint32Array(64);
  const refused = [
    () => native.fastDrain(id + 1000, buf),
    () => native.fastDrain(id, new Uint8Array(64)),
    () => native.fastDrain(id),
    () => native.fastDrain('0', buf),
    () => native.fastAsk(id, 0, 0),
    () => native.fastReplyDrain(id, 0, 0, [1, 2]),
  ];
  for (const call of refused) {
    assert.throws(call, (e) => {
      const mapped = fromNative(e);
      return mapped instanceof InvalidArgumentError && mapped.code === 'INVALID_ARGUMENT';
    }, String(call));
  }
  assert.equal(native.fastDrain(id, buf), 0);
  native.debugPanicNextHotCall();
  assert.throws(
    () => native.fastDrain(id, buf),
    (e) => fromNative(e) instanceof InternalError && /panic in askpool: debug_panic_next_hot_call/.test(e.message),
  );
  // The next call, and every ask through the wrapper, goes on.
  assert.equal(native.fastDrain(id, buf), 0);
  core.close();
  native.debugPanicNextHotCall();
  const err = await node.ask('echo', 2).catch((e) => e);
  assert.ok(err instanceof InternalError, `${err?.name}: ${err?.message}`);
  assert.equal(await node.ask('echo', 3), 3);
  assert.equal(node.stats().outstanding, 0);
  await node.close();
});

test('a panic polling one ask fails that ask with INTERNAL; the next asks succeed', async () => {
  const native = require('../lib/native');
  const node = new Node();
  node.pool('echo').handle((m) => m);
  assert.equal(await node.ask('echo', 1), 1);
  native.debugPanicNextAsk();
  const err = await node.ask('echo', 2).catch((e) => e);
  assert.ok(err instanceof InternalError, `${err?.name}: ${err?.message}`);
  assert.equal(err.code, 'INTERNAL');
  assert.match(err.message, /panic/);
  assert.equal(await node.ask('echo', 3), 3);
  // The other asks of a batch in which one panics are not lost.
  const batch = Array.from({ length: 50 }, (_, i) => node.ask('echo', i).catch((e) => e.code));
  native.debugPanicNextAsk();
  batch.push(node.ask('echo', 'last').catch((e) => e.code));
  const results = await Promise.all(batch);
  assert.equal(results.filter((r) => r === 'INTERNAL').length, 1);
  assert.equal(results.filter((r) => r !== 'INTERNAL').length, 50);
  assert.equal(await node.ask('echo', 4), 4);
  assert.equal(node.stats().outstanding, 0);
  await node.close();
});

test('a drain that throws once is reported as a warning and jams nothing', async () => {
  const native = require('../lib/native');
  const node = new Node();
  node.pool('echo').handle((m) => m);
  assert.equal(await node.ask('echo', 1), 1);
  const warnings = [];
  const onWarning = (w) => warnings.push(w);
  process.on('warning', onWarning);
  const real = native.fastDrain;
  let once = true;
  native.fastDrain = (...args) => {
    if (once) {
      once = false;
      throw new Error('simulated: a panic caught at the boundary');
    }
    return real(...args);
  };
  try {
    assert.equal(await node.ask('echo', 2, { timeoutMs: 2_000 }), 2);
    assert.equal(await node.ask('echo', 3), 3);
  } finally {
    native.fastDrain = real;
  }
  await new Promise((r) => setImmediate(r));
  process.off('warning', onWarning);
  assert.equal(warnings.length, 1);
  assert.equal(warnings[0].name, 'AskpoolWarning');
  assert.match(warnings[0].message, /simulated/);
  await node.close();
});

test('a reused request id with another payload is refused (PAYLOAD_MISMATCH)', async () => {
  const node = new Node();
  let runs = 0;
  node.pool('once').handle((m) => {
    runs++;
    return { m };
  });
  const requestId = '000000000000000000000000000000f1';
  const first = await node.ask('once', { a: 1 }, { requestId, fingerprint: 'payload-A' });
  const err = await node.ask('once', { b: 2 }, { requestId, fingerprint: 'payload-B' }).catch((e) => e);
  assert.ok(err instanceof PayloadMismatchError, `${err?.name}: ${err?.message}`);
  assert.equal(err.code, 'PAYLOAD_MISMATCH');
  assert.equal(runs, 1);
  // The same fingerprint (as a string or as its bytes) is a true duplicate.
  assert.equal(await node.ask('once', { a: 1 }, { requestId, fingerprint: 'payload-A' }), first);
  assert.equal(
    await node.ask('once', { a: 1 }, { requestId, fingerprint: Buffer.from('payload-A') }),
    first,
  );
  assert.equal(runs, 1);
  // askHandle and tell take a fingerprint too.
  const h = node.askHandle('once', 'x', { requestId, fingerprint: new Uint8Array([1]) });
  await assert.rejects(h.result, { code: 'PAYLOAD_MISMATCH' });
  const tellId = '000000000000000000000000000000f2';
  assert.equal(await node.tell('once', 't', { requestId: tellId, fingerprint: 'T' }), tellId);
  await assert.rejects(node.tell('once', 'u', { requestId: tellId, fingerprint: 'U' }), {
    code: 'PAYLOAD_MISMATCH',
  });
  await assert.rejects(node.ask('once', 1, { fingerprint: 42 }), {
    code: 'INVALID_ARGUMENT',
    name: 'InvalidArgumentError',
  });
  await node.close();
});

test('Buffer payloads are fingerprinted without a fingerprint option', async () => {
  const node = new Node();
  let runs = 0;
  node.pool('bytes').handle((m) => {
    runs++;
    return m;
  });
  const requestId = '000000000000000000000000000000f3';
  const a = Buffer.from('payload-A');
  assert.equal(await node.ask('bytes', a, { requestId }), a);
  const err = await node.ask('bytes', Buffer.from('payload-B'), { requestId }).catch((e) => e);
  assert.ok(err instanceof PayloadMismatchError, `${err?.name}: ${err?.message}`);
  assert.equal(err.code, 'PAYLOAD_MISMATCH');
  assert.equal(runs, 1);
  // Equal bytes in another buffer are a duplicate: the cached reply.
  assert.equal(await node.ask('bytes', Buffer.from('payload-A'), { requestId }), a);
  await assert.rejects(node.ask('bytes', new Uint8Array([9]), { requestId }), {
    code: 'PAYLOAD_MISMATCH',
  });
  assert.equal(runs, 1);
  // An ask without options reuses no id: a Buffer still goes through.
  assert.equal(await node.ask('bytes', a), a);
  const h = node.askHandle('bytes', Buffer.from('other'), { requestId });
  await assert.rejects(h.result, { code: 'PAYLOAD_MISMATCH' });
  assert.equal(runs, 2);
  await node.close();
});

test('causationId reaches the handler context', async () => {
  const node = new Node();
  node.pool('cause').handle((m, ctx) => ctx.causationId ?? null);
  const causationId = '0000000000000000000000000000c0de';
  assert.equal(await node.ask('cause', 1, { causationId }), causationId);
  assert.equal(await node.askHandle('cause', 1, { causationId }).result, causationId);
  assert.equal(await node.ask('cause', 1), null);
  await assert.rejects(node.ask('cause', 1, { causationId: 'nope' }), {
    code: 'INVALID_ARGUMENT',
    name: 'InvalidArgumentError',
  });
  await node.close();
});

test('a tell carries causationId and correlationId to the handler context', async () => {
  const node = new Node();
  let got;
  let ran;
  const done = new Promise((r) => (ran = r));
  node.pool('caused').handle((m, ctx) => {
    got = { causationId: ctx.causationId, correlationId: ctx.correlationId };
    ran();
  });
  const causationId = '0000000000000000000000000000c0de';
  const correlationId = '00000000000000000000000000000c01';
  await node.tell('caused', 1, { causationId, correlationId });
  await done;
  assert.deepEqual(got, { causationId, correlationId });
  await assert.rejects(node.tell('caused', 1, { causationId: 'nope' }), {
    code: 'INVALID_ARGUMENT',
    name: 'InvalidArgumentError',
  });
  await node.close();
});

test('an oversize byte payload rejects with OVERSIZE_PAYLOAD and nothing is sent', async () => {
  const node = new Node({ maxPayloadBytes: 1_000 });
  let runs = 0;
  node.pool('small').handle((m) => {
    runs++;
    return m.byteLength;
  });
  const big = Buffer.alloc(1_001);
  // The error carries the payload's size and the limit.
  const oversize = (size) => (e) => {
    assert.ok(e instanceof OversizePayloadError, `${e?.name}: ${e?.message}`);
    assert.equal(e.code, 'OVERSIZE_PAYLOAD');
    assert.match(e.message, new RegExp(`\\b${size}\\b`));
    assert.match(e.message, /\b1000\b/);
    return true;
  };
  await assert.rejects(node.ask('small', big), oversize(1_001));
  await assert.rejects(node.ask('small', big, { timeoutMs: 1_000 }), oversize(1_001));
  await assert.rejects(node.askHandle('small', big).result, oversize(1_001));
  await assert.rejects(node.tell('small', big), oversize(1_001));
  // Every kind of byte payload is sized by its byteLength.
  for (const bytes of [
    new Uint8Array(1_001),
    new Float64Array(126),
    new ArrayBuffer(1_001),
    new DataView(new ArrayBuffer(2_000), 500),
  ]) {
    await assert.rejects(node.ask('small', bytes), oversize(bytes.byteLength), bytes.constructor.name);
    await assert.rejects(node.tell('small', bytes), oversize(bytes.byteLength), bytes.constructor.name);
  }
  assert.equal(runs, 0, 'the handler never ran');
  const stats = node.stats();
  assert.equal(stats.pending, 0);
  assert.equal(stats.outstanding, 0);
  assert.equal(stats.pools[0].admitted, 0);
  // Exactly at the limit goes through, as do payloads that are not bytes.
  assert.equal(await node.ask('small', Buffer.alloc(1_000)), 1_000);
  assert.equal(await node.askHandle('small', new Float64Array(125)).result, 1_000);
  assert.equal(await node.ask('small', { byteLength: 5_000 }), 5_000);
  assert.equal(await node.ask('small', 'x'.repeat(5_000)), undefined);
  assert.equal(runs, 4);
  await node.close();
});

test('maxPayloadBytes: null lifts the bound; the default is 16 MiB', async () => {
  const unbounded = new Node({ maxPayloadBytes: null });
  unbounded.pool('any').handle((m) => m.byteLength);
  const huge = Buffer.alloc(16 * 1024 * 1024 + 1);
  assert.equal(await unbounded.ask('any', huge), huge.byteLength);
  assert.match(await unbounded.tell('any', huge), /^[0-9a-f]{32}$/);
  await unbounded.close();
  const node = new Node();
  node.pool('any').handle((m) => m.byteLength);
  await assert.rejects(node.ask('any', huge), { code: 'OVERSIZE_PAYLOAD' });
  assert.equal(await node.ask('any', huge.subarray(1)), huge.byteLength - 1);
  const zero = new Node({ maxPayloadBytes: 0 });
  zero.pool('any').handle((m) => m.byteLength);
  assert.equal(await zero.ask('any', Buffer.alloc(0)), 0);
  await assert.rejects(zero.ask('any', Buffer.alloc(1)), { code: 'OVERSIZE_PAYLOAD' });
  await zero.close();
  await node.close();
});

test('a pool name is a string of 1 to 255 bytes', async () => {
  const node = new Node();
  for (const bad of [undefined, null, 7, Symbol('s'), {}]) {
    assert.throws(() => node.pool(bad), { code: 'INVALID_ARGUMENT', name: 'InvalidArgumentError' });
  }
  for (const bad of ['', 'x'.repeat(256)]) {
    assert.throws(() => node.pool(bad), { code: 'INVALID_ARGUMENT' }, JSON.stringify(bad.length));
  }
  // Asking a name of a megabyte: NO_ROUTE, and the message stays short.
  const err = await node.ask('z'.repeat(1 << 20), 1).catch((e) => e);
  assert.equal(err.code, 'NO_ROUTE');
  assert.ok(err.message.length < 600, `${err.message.length} chars`);
  await node.close();
});

test('asking ever new pool names keeps the name table bounded', async () => {
  const native = require('../lib/native');
  const core = new native.Core(() => {});
  const refs = new Set();
  for (let i = 0; i < 1100; i++) refs.add(core.poolRef(`nowhere-${i}`));
  // 1,024 names get a reference of their own; the rest share the scratch one.
  assert.equal(refs.size, 1025);
  assert.ok(refs.has(0xffff_ffff));
  assert.equal(core.poolRef(''), 0xffff_ffff, 'no reference for a name no pool can have');
  assert.equal(core.poolRef('nowhere-7'), 7, 'a kept name keeps its reference');
  core.close();
  // Through the wrapper: past the bound, names are still asked by name.
  const node = new Node();
  for (let i = 0; i < 1100; i++) {
    await assert.rejects(node.ask(`gone-${i}`, i), { code: 'NO_ROUTE' });
  }
  const msg = {};
  node.pool('late').handle((m) => m);
  assert.equal(await node.ask('late', msg), msg);
  assert.equal(await node.askHandle('late', msg, {}).result, msg);
  await assert.rejects(node.ask('gone-1099', 1), (e) => e.code === 'NO_ROUTE' && e.message.includes('gone-1099'));
  await node.close();
});

test('an option getter that asks another name does not redirect a scratch-referenced ask', async () => {
  // Past 1,024 names an ask's pool reference stands for its name only
  // until the next poolRef call. The options are read after it: a getter
  // that asked another name re-pointed it, and the outer ask went to the
  // other pool. (A Proxy message's getPrototypeOf trap did too, when bytes
  // were told by `instanceof`; now a message is never inspected through
  // its traps, so none runs.)
  const node = new Node();
  for (let i = 0; i < 1030; i++) {
    await assert.rejects(node.ask(`gone-${i}`, i), { code: 'NO_ROUTE' });
  }
  node.pool('late-a').handle(() => 'a');
  node.pool('late-b').handle(() => 'b');
  const inner = [];
  const options = {
    get timeoutMs() {
      inner.push(node.ask('late-b', 0));
      return 5000;
    },
  };
  assert.equal(await node.ask('late-a', 1, options), 'a');
  assert.equal(await node.askHandle('late-a', 1, options).result, 'a');
  let traps = 0;
  const msg = new Proxy(
    {},
    {
      getPrototypeOf() {
        traps++;
        inner.push(node.ask('late-b', 0));
        return Object.prototype;
      },
    },
  );
  assert.equal(await node.ask('late-a', msg), 'a');
  assert.equal(await node.ask('late-a', msg, options), 'a');
  assert.equal(traps, 0, 'no trap of the message ran');
  assert.deepEqual(await Promise.all(inner), ['b', 'b', 'b']);
  await node.close();
});

test('a closed pool object never reaches the pool made after it', async () => {
  const node = new Node();
  const x = node.pool('x');
  x.close();
  // The addon may give the next pool the closed one's id.
  const y = node.pool('y');
  assert.throws(() => x.handle(() => 'x'), (e) => e instanceof FailedPreconditionError && /"x" is closed/.test(e.message));
  y.handle((m) => `y got ${m}`);
  assert.equal(await node.ask('y', 1), 'y got 1');
  x.close(); // again: nothing
  assert.equal(await node.ask('y', 2), 'y got 2');
  await node.close();
  assert.throws(() => y.handle(() => 1), (e) => e.code === 'UNAVAILABLE');
});

test('a progress fraction comes back as the number reported', async () => {
  const node = new Node();
  node.pool('p').handle((m, ctx) => {
    ctx.progress(0.1, 'a tenth');
    return m;
  });
  const handle = node.askHandle('p', 1);
  const fractions = [];
  for await (const s of handle.stages()) if (s.stage === 'PARTIAL') fractions.push(s.fraction);
  assert.deepEqual(fractions, [0.1]);
  await node.close();
});

test('a progress fraction out of range is clamped as in every binding; NaN and an oversize note are refused', async () => {
  const node = new Node();
  let nan;
  let oversize;
  const thrown = (f) => {
    try {
      f();
    } catch (e) {
      return e;
    }
  };
  node.pool('p').handle((m, ctx) => {
    ctx.progress(-0.5);
    ctx.progress(1.5, 'rounding past the end');
    nan = thrown(() => ctx.progress(NaN));
    // A report's bound is 4096 UTF-8 bytes (2 per 'é').
    oversize = thrown(() => ctx.progress(1, 'é'.repeat(2049)));
    ctx.progress(1, 'é'.repeat(2048));
    return m;
  });
  const handle = node.askHandle('p', 1);
  const partial = [];
  for await (const s of handle.stages()) {
    if (s.stage === 'PARTIAL') partial.push([s.fraction, (s.note ?? '').length]);
  }
  assert.deepEqual(partial, [[0, 0], [1, 21], [1, 2048]]);
  assert.equal(await handle, 1);
  assert.equal(nan?.code, 'INVALID_ARGUMENT');
  assert.equal(oversize?.code, 'INVALID_ARGUMENT');
  assert.match(oversize.message, /4098 bytes/);
  await node.close();
});

test('a revoked Proxy passes as a payload like any object', async () => {
  const node = new Node();
  let seen;
  node.pool('p').handle((m) => {
    seen = m;
    return 'ok';
  });
  const { proxy, revoke } = Proxy.revocable({}, {});
  revoke();
  assert.equal(await node.ask('p', proxy), 'ok');
  assert.equal(seen, proxy);
  await node.close();
});

test('an ask refused before sending has no stages (read once)', async () => {
  const node = new Node();
  node.pool('p').handle((m) => m);
  const aborted = new AbortController();
  aborted.abort();
  const handle = node.askHandle('p', 1, { signal: aborted.signal });
  handle.result.catch(() => {});
  const stages = [];
  for await (const s of handle.stages()) stages.push(s);
  assert.deepEqual(stages, []);
  assert.throws(() => handle.stages(), { code: 'INVALID_ARGUMENT' });
  await node.close();
});

test('a handler is called as a plain function: an unbound method fails its own asks only', async () => {
  const node = new Node();
  node.pool('echo').handle((m) => m);
  let seen = 'unset';
  node.pool('this').handle(function () {
    seen = this;
    return 'ok';
  });
  assert.equal(await node.ask('this', 1), 'ok');
  assert.equal(seen, undefined, 'no receiver: not the node\'s handler table');
  class Cache {
    constructor() {
      this.length = 0;
    }
    handle() {
      this.length = 0;
      return 'cached';
    }
  }
  const cache = new Cache();
  node.pool('cache').handle(cache.handle);
  await assert.rejects(node.ask('cache', 1), (e) => e.code === 'HANDLER_FAILED' && /TypeError/.test(e.message));
  assert.equal(await node.ask('echo', 'hi'), 'hi', 'the other pools keep their handlers');
  await node.close();
});

test('ids and counters a Python user has: callerId, correlationId, Pool.stats(), late outcomes, DLQ drops', async () => {
  const node = new Node({ dlqCapacity: 1, breaker: false });
  assert.match(node.callerId, /^[0-9a-f]{16}$/);
  const other = new Node();
  assert.notEqual(other.callerId, node.callerId, 'one per node');
  await other.close();
  const pool = node.pool('p');
  pool.handle((m) => m);
  const given = 'a'.repeat(32);
  const h = node.askHandle('p', 1, { correlationId: given });
  assert.equal(h.correlationId, given);
  await h;
  const own = node.askHandle('p', 2);
  assert.equal(own.correlationId, own.requestId, 'by default the request id');
  await own;
  const stats = pool.stats();
  assert.equal(stats.name, 'p');
  assert.equal(stats.handlerRuns, 2);
  for (const key of ['duplicateAcks', 'suppressedReplies', 'expired', 'replays']) {
    assert.equal(typeof stats[key], 'number', key);
  }
  // Three letters for a queue of one: two dropped, counted.
  const full = node.pool('full', { maxInFlight: 1 });
  full.handle(() => new Promise(() => {}));
  node.askHandle('full', 0).result.catch(() => {});
  await new Promise((r) => setTimeout(r, 10));
  for (let i = 1; i <= 3; i++) {
    await assert.rejects(node.ask('full', i, { maxAttempts: 1 }), { code: 'BUFFER_FULL' });
  }
  const s = node.stats();
  assert.equal(s.dlqDepth, 1);
  assert.equal(s.dlqDropped, 2);
  assert.equal(s.lateOutcomes, 0);
  pool.close();
  assert.throws(() => pool.stats(), { code: 'FAILED_PRECONDITION' });
  await node.close();
});

test("a pool is a name or an open Pool of this node: another node's Pool, a closed Pool, other objects are refused", async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'askpool-poolref-'));
  const a = new Node();
  const b = new Node().openPromises(path.join(dir, 'p.db'));
  try {
    const ran = [];
    const poolOfA = a.pool('p').handle(() => ran.push('a p'));
    b.pool('p').handle(() => ran.push('b p'));
    const old = b.pool('q').handle(() => ran.push('old q'));
    old.close();
    // The name (and maybe the id) of the closed pool, taken by another.
    const fresh = b.pool('q').handle(() => 'new q');
    function p() {}
    const calls = {
      ask: (pool) => b.ask(pool, 1),
      'ask with options': (pool) => b.ask(pool, 1, { timeoutMs: 5_000 }),
      askHandle: (pool) => b.askHandle(pool, 1).result,
      tell: (pool) => b.tell(pool, 1),
      askDurable: (pool) => b.askDurable(pool, 1).result,
    };
    const refused = (Class, pattern) => (e) => {
      assert.ok(e instanceof Class, `${e?.name}: ${e?.message}`);
      assert.match(e.message, pattern);
      return true;
    };
    for (const [name, call] of Object.entries(calls)) {
      await assert.rejects(call(poolOfA), refused(InvalidArgumentError, /Pool "p" belongs to another node/), name);
      await assert.rejects(call(old), refused(NoRouteError, /pool "q": this Pool was closed/), name);
      for (const other of [p, { name: 'p' }, new Proxy(fresh, {}), null, undefined, 7]) {
        await assert.rejects(
          call(other),
          refused(InvalidArgumentError, /a pool is a name \(a string\) or a Pool of this node/),
          `${name} ${typeof other}`,
        );
      }
    }
    assert.deepEqual(ran, [], 'no handler ran for a refused pool argument');
    assert.equal(b.stats().objects, 0, 'a refused message is not held');
    assert.equal(b.stats().outstanding, 0);
    // Through its own Pool, and by name, the new pool answers.
    assert.equal(await b.ask(fresh, 1), 'new q');
    assert.equal(await b.ask('q', 1), 'new q');
    assert.equal(await a.ask(poolOfA, 1), 1);
    // A closed node: UNAVAILABLE, for a closed Pool as by name.
    await b.close();
    await assert.rejects(b.ask(old, 1), { code: 'UNAVAILABLE' });
    await assert.rejects(b.ask(fresh, 1), { code: 'UNAVAILABLE' });
  } finally {
    await a.close();
    await b.close();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('a SharedArrayBuffer is bytes: sized against maxPayloadBytes and fingerprinted, bare or under a view', async () => {
  const node = new Node({ maxPayloadBytes: 1_000 });
  let runs = 0;
  node.pool('p').handle((m) => {
    runs++;
    return m;
  });
  const filled = (n, byte) => {
    const sab = new SharedArrayBuffer(n);
    new Uint8Array(sab).fill(byte);
    return sab;
  };
  for (const big of [new SharedArrayBuffer(1_001), new Uint8Array(new SharedArrayBuffer(1_001))]) {
    const what = big.constructor.name;
    await assert.rejects(node.ask('p', big), OversizePayloadError, what);
    await assert.rejects(node.ask('p', big, { timeoutMs: 5_000 }), OversizePayloadError, what);
    await assert.rejects(node.tell('p', big), OversizePayloadError, what);
  }
  assert.equal(runs, 0);
  const small = filled(1_000, 1);
  assert.equal(await node.ask('p', small), small, 'at the bound it goes through, by reference');
  // As a fingerprint: its bytes, as any other bytes.
  const requestId = '000000000000000000000000000000f4';
  const first = { n: 1 };
  assert.equal(await node.ask('p', first, { requestId, fingerprint: filled(4, 7) }), first);
  assert.equal(await node.ask('p', { n: 2 }, { requestId, fingerprint: new Uint8Array(4).fill(7) }), first);
  await assert.rejects(node.ask('p', { n: 3 }, { requestId, fingerprint: filled(4, 8) }), PayloadMismatchError);
  // A bare one asked under a request id is fingerprinted by its bytes.
  const tellId = '000000000000000000000000000000f5';
  assert.equal(await node.tell('p', filled(8, 1), { requestId: tellId }), tellId);
  await assert.rejects(node.tell('p', filled(8, 2), { requestId: tellId }), PayloadMismatchError);
  assert.equal(runs, 3);
  // Bytes of another realm are bytes too; a Proxy over an ArrayBuffer is an
  // object like any other, passed by reference with none of its traps run.
  await assert.rejects(node.ask('p', vm.runInNewContext('new ArrayBuffer(1001)')), OversizePayloadError);
  const proxied = new Proxy(new ArrayBuffer(2_000), {});
  assert.equal(await node.ask('p', proxied, { requestId: '000000000000000000000000000000f6' }), proxied);
  await node.close();
});
