'use strict';
const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { execFileSync } = require('node:child_process');
const { Node, AskError, InvalidArgumentError, FailedPreconditionError, UnavailableError } = require('..');

function tempFile() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'askpool-durable-'));
  return { file: path.join(dir, 'promises.db'), done: () => fs.rmSync(dir, { recursive: true }) };
}

test('promises: create, get, resolve, reject, cancel, await', async () => {
  const tmp = tempFile();
  try {
    const node = new Node().openPromises(tmp.file);
    const p = node.promises;
    const created = p.create('order-1', { param: { item: 'book' }, key: 'k1' });
    assert.equal(created.state, 'PENDING');
    assert.deepEqual(created.param, { item: 'book' });
    assert.equal(p.create('order-1', { param: { item: 'book' }, key: 'k1' }).state, 'PENDING');
    const waited = p.await('order-1', { pollMs: 5 });
    const resolved = p.resolve('order-1', { total: 12 }, { key: 'done-1' });
    assert.equal(resolved.state, 'RESOLVED');
    assert.deepEqual((await waited).value, { total: 12 });
    assert.deepEqual(p.get('order-1').value, { total: 12 });
    assert.equal(p.resolve('order-1', { total: 12 }, { key: 'done-1' }).state, 'RESOLVED');
    assert.throws(() => p.reject('order-1', 'no'), FailedPreconditionError);
    p.create('order-2');
    assert.equal(p.reject('order-2', { why: 'out of stock' }).state, 'REJECTED');
    p.create('order-3');
    assert.equal(p.cancel('order-3').state, 'CANCELED');
    p.create('order-4', { timeoutMs: 0 });
    assert.equal(p.get('order-4').state, 'TIMED_OUT');
    assert.throws(() => p.get('missing'), InvalidArgumentError);
    await node.close();
  } finally {
    tmp.done();
  }
});

test('promises.prune deletes the promises settled longer ago than olderThanMs', async () => {
  const tmp = tempFile();
  try {
    const node = new Node().openPromises(tmp.file);
    const p = node.promises;
    for (const id of ['done-1', 'done-2', 'open']) p.create(id);
    p.resolve('done-1', 1);
    p.reject('done-2', 2);
    await new Promise((r) => setTimeout(r, 20));
    assert.equal(p.prune({ olderThanMs: 0 }), 2);
    assert.throws(() => p.get('done-1'), InvalidArgumentError);
    assert.equal(p.get('open').state, 'PENDING');
    // Settled within the retention: kept.
    p.resolve('open', 3);
    assert.equal(p.prune({ olderThanMs: 3_600_000 }), 0);
    assert.equal(p.get('open').state, 'RESOLVED');
    for (const bad of [-1, Number.NaN, Infinity, '0', undefined]) {
      assert.throws(
        () => p.prune({ olderThanMs: bad }),
        (e) => e instanceof InvalidArgumentError && e.code === 'INVALID_ARGUMENT',
        String(bad),
      );
    }
    await node.close();
  } finally {
    tmp.done();
  }
});

test('durable asks without a store, or with a bad id, fail with typed errors', async () => {
  const node = new Node();
  node.pool('p').handle((m) => m);
  await assert.rejects(node.askDurable('p', 1).result, { code: 'FAILED_PRECONDITION' });
  assert.throws(() => node.promises.get('x'), AskError);
  const tmp = tempFile();
  try {
    node.openPromises(tmp.file);
    await assert.rejects(node.askDurable('p', 1, { id: 'nope' }).result, InvalidArgumentError);
    const ask = node.askDurable('p', { v: 1 });
    assert.match(ask.id, /^[0-9a-f]{32}$/);
    assert.deepEqual(await ask, { v: 1 });
    assert.equal(node.promises.get(ask.id).state, 'RESOLVED');
    await node.close();
  } finally {
    tmp.done();
  }
});

test('a durable ask streams the stages of its asks; one answered from the store has none', async () => {
  const node = new Node();
  node.pool('p').handle(async (m, ctx) => {
    ctx.progress(0.5, 'half');
    await new Promise((r) => setTimeout(r, 5));
    return m.toUpperCase();
  });
  const tmp = tempFile();
  try {
    node.openPromises(tmp.file);
    const ask = node.askDurable('p', 'hi');
    const names = [];
    for await (const s of ask.stages()) names.push(s.stage === 'PARTIAL' ? `${s.stage} ${s.note}` : s.stage);
    assert.deepEqual(names, ['SENT', 'RECEIVED', 'READ', 'PARTIAL half', 'FULFILLED']);
    assert.equal(await ask, 'HI');
    assert.throws(() => ask.stages(), { code: 'INVALID_ARGUMENT' });
    assert.equal(await node.awaitDurable(ask.id), 'HI');
    const again = node.resumeDurable(ask.id.toUpperCase());
    assert.equal(again.id, ask.id);
    assert.equal(await again, 'HI');
    const none = [];
    for await (const s of again.stages()) none.push(s.stage);
    assert.deepEqual(none, []);
    // Refused before it started: no stages, and the refusal still rejects.
    const refused = node.resumeDurable('not an id');
    for await (const s of refused.stages()) assert.fail(`a stage of a refused await: ${s.stage}`);
    await assert.rejects(refused, InvalidArgumentError);
    await node.close();
  } finally {
    tmp.done();
  }
});

test('values JSON cannot hold, bad pools and null options: typed errors, nothing held', async () => {
  const node = new Node();
  let runs = 0;
  node.pool('p').handle((m) => {
    runs += 1;
    return m;
  });
  const tmp = tempFile();
  try {
    node.openPromises(tmp.file, null);
    const cyclic = {};
    cyclic.self = cyclic;
    for (const msg of [10n, cyclic]) {
      await assert.rejects(node.askDurable('p', msg).result, {
        code: 'INVALID_ARGUMENT',
        message: /durable ask's message must be JSON/,
      });
      assert.throws(() => node.promises.create('c', { param: msg }), { code: 'INVALID_ARGUMENT' });
    }
    await assert.rejects(node.askDurable(null, 1).result, { code: 'INVALID_ARGUMENT' });
    assert.equal(runs, 0, 'nothing was sent');
    assert.equal(node.stats().objects, 0, 'no payload is held');
    // Null options are no options.
    assert.equal(await node.askDurable('p', 1, null), 1);
    assert.equal(node.promises.create('n', null).state, 'PENDING');
    assert.throws(() => node.promises.resolve('n', 1n, null), { code: 'INVALID_ARGUMENT' });
    assert.equal(node.promises.resolve('n', 1, null).state, 'RESOLVED');
    assert.equal((await node.promises.await('n', null)).value, 1);
    await node.close();
  } finally {
    tmp.done();
  }
});

test('a durable ask survives a restart: two processes, one SQLite file', () => {
  const tmp = tempFile();
  try {
    const fixture = (name, args) =>
      JSON.parse(
        execFileSync(process.execPath, [path.join(__dirname, 'fixtures', name), ...args], {
          encoding: 'utf8',
          timeout: 30_000,
        }),
      );
    const first = fixture('durable-first.js', [tmp.file]);
    assert.deepEqual(first.reply, { n: 42 });
    assert.equal(first.runs, 1);
    const second = fixture('durable-second.js', [tmp.file, first.done, first.pending]);
    assert.deepEqual(second.stored, { n: 42 }, 'the settled ask answers from its promise');
    assert.deepEqual(second.again, { n: 42 });
    assert.equal(second.runs.double, 0, 'the answered ask never ran again');
    assert.deepEqual(second.resumed, { n: 6 }, 'the pending ask was asked again with its message');
    assert.equal(second.runs.slow, 1);
    assert.deepEqual(second.states, ['RESOLVED', 'RESOLVED']);
  } finally {
    tmp.done();
  }
});

test('promises: an id that is not a string is INVALID_ARGUMENT, not a promise named "undefined"', async () => {
  const tmp = tempFile();
  try {
    const node = new Node().openPromises(tmp.file);
    const p = node.promises;
    for (const id of [undefined, null, 7, {}]) {
      assert.throws(() => p.create(id), InvalidArgumentError, String(id));
      assert.throws(() => p.get(id), InvalidArgumentError, String(id));
      assert.throws(() => p.resolve(id, 1), InvalidArgumentError, String(id));
      await assert.rejects(p.await(id), InvalidArgumentError, String(id));
      await assert.rejects(node.awaitDurable(id), InvalidArgumentError, String(id));
    }
    assert.throws(() => p.get('undefined'), /no promise with id "undefined"/, 'nothing was created');
    await node.close();
  } finally {
    tmp.done();
  }
});

/** `promise`'s outcome, or 'pending' if it has none within `ms`. */
function within(promise, ms) {
  let timer;
  const late = new Promise((resolve) => {
    timer = setTimeout(() => resolve('pending'), ms);
  });
  return Promise.race([
    promise.then(
      () => 'resolved',
      (e) => `rejected ${e.code}`,
    ),
    late,
  ]).finally(() => clearTimeout(timer));
}

test('durable asks around close: in flight they reject UNAVAILABLE, after it at once', async () => {
  const tmp = tempFile();
  try {
    // The close ends the inner ask on the runtime's threads; its outcome
    // must still reach JS (it was lost in some runs).
    for (let i = 0; i < 20; i++) {
      const node = new Node().openPromises(tmp.file);
      node.pool('p').handle(() => new Promise((resolve) => setTimeout(() => resolve('late'), 50)));
      const asked = node.askDurable('p', { i });
      await new Promise((resolve) => setTimeout(resolve, 10));
      await node.close();
      assert.equal(await within(asked.result, 2_000), 'rejected UNAVAILABLE', `run ${i}`);
      assert.equal(node.stats().outstanding, 0);
      assert.equal(await within(node.askDurable('p', { i }).result, 2_000), 'rejected UNAVAILABLE');
      assert.equal(await within(node.awaitDurable(asked.id), 2_000), 'rejected UNAVAILABLE');
    }
  } finally {
    tmp.done();
  }
});

test('openPromises: a durable timeout under a millisecond is refused', () => {
  // Every durable ask would time out as it is stored, its handler never run.
  const tmp = tempFile();
  try {
    for (const timeoutMs of [0, 0.5, -1, NaN]) {
      assert.throws(
        () => new Node().openPromises(tmp.file, { timeoutMs }),
        (e) => e instanceof InvalidArgumentError && e.code === 'INVALID_ARGUMENT',
        String(timeoutMs),
      );
    }
    assert.ok(new Node().openPromises(tmp.file, { timeoutMs: 1 }).promises);
  } finally {
    tmp.done();
  }
});

test('a promise id or key that is not well-formed Unicode (a lone surrogate) is INVALID_ARGUMENT', async () => {
  // The addon's conversion made it U+FFFD: 'a\ud800' and 'a\udfff' were one promise.
  const tmp = tempFile();
  try {
    const node = new Node().openPromises(tmp.file);
    const p = node.promises;
    const invalid = (e) => e instanceof InvalidArgumentError && e.code === 'INVALID_ARGUMENT';
    assert.throws(() => p.create('a\ud800', { timeoutMs: 60000 }), invalid);
    assert.throws(() => p.create('a', { timeoutMs: 60000, key: 'k\udfff' }), invalid);
    assert.throws(() => p.get('a\udfff'), invalid);
    await assert.rejects(node.awaitDurable('a\ud800'), invalid);
    assert.throws(() => p.get('a'), /no promise/, 'nothing was created');
    await node.close();
  } finally {
    tmp.done();
  }
});

test('a durable ask left unawaited is no unhandled rejection when its node closes', () => {
  const tmp = tempFile();
  try {
    // In a child: an unhandled rejection ends a process with code 1.
    const script = `
      const { Node } = require(${JSON.stringify(path.join(__dirname, '..'))});
      (async () => {
        const node = new Node().openPromises(${JSON.stringify(tmp.file)});
        node.pool('orders').handle(() => new Promise(() => {}));
        const { id } = node.askDurable('orders', { order: 7 });
        await new Promise((r) => setTimeout(r, 20));
        await node.close();
        await new Promise((r) => setTimeout(r, 50));
        console.log('closed cleanly ' + id);
      })();`;
    const out = execFileSync(process.execPath, ['-e', script], { encoding: 'utf8' });
    assert.match(out, /^closed cleanly [0-9a-f]{32}$/m);
  } finally {
    tmp.done();
  }
});

test('promises.await: pollMs and timeoutMs are checked; timeoutMs and a signal end the wait', async () => {
  const tmp = tempFile();
  try {
    const node = new Node().openPromises(tmp.file);
    const p = node.promises;
    p.create('slow', { timeoutMs: 60_000 });
    for (const bad of [-5, 0, Number.NaN, Infinity, 'soon', null]) {
      await assert.rejects(p.await('slow', { pollMs: bad }), { code: 'INVALID_ARGUMENT' }, `pollMs ${bad}`);
      await assert.rejects(p.await('slow', { timeoutMs: bad }), { code: 'INVALID_ARGUMENT' }, `timeoutMs ${bad}`);
    }
    await assert.rejects(p.await('slow', { signal: 'stop' }), { code: 'INVALID_ARGUMENT' });
    const started = Date.now();
    await assert.rejects(p.await('slow', { timeoutMs: 50, pollMs: 5 }), { code: 'ASK_TIMEOUT' });
    assert.ok(Date.now() - started < 5_000);
    const ac = new AbortController();
    const waiting = p.await('slow', { signal: ac.signal, pollMs: 1_000 });
    setTimeout(() => ac.abort('enough'), 20);
    await assert.rejects(waiting, (e) => e.code === 'ASK_CANCELLED' && e.cause === 'enough');
    p.resolve('slow', 1);
    assert.equal((await p.await('slow', { timeoutMs: 50 })).state, 'RESOLVED');
    await node.close();
  } finally {
    tmp.done();
  }
});

test('promises.await with a signal over many polls: no abort listener left behind', async () => {
  // Each poll's wait listened for the abort; one that ended on its timer
  // left its listener: past ten polls, MaxListenersExceededWarning.
  const { getEventListeners } = require('node:events');
  const tmp = tempFile();
  const warnings = [];
  const onWarning = (w) => warnings.push(`${w.name}: ${w.message}`);
  process.on('warning', onWarning);
  try {
    const node = new Node().openPromises(tmp.file);
    node.promises.create('later', { timeoutMs: 60_000 });
    const ac = new AbortController();
    setTimeout(() => node.promises.resolve('later', 1), 100);
    const settled = await node.promises.await('later', { signal: ac.signal, pollMs: 2 });
    assert.equal(settled.state, 'RESOLVED');
    assert.equal(getEventListeners(ac.signal, 'abort').length, 0);
    await new Promise((r) => setImmediate(r));
    assert.deepEqual(warnings, []);
    await node.close();
  } finally {
    process.off('warning', onWarning);
    tmp.done();
  }
});

test('a durable ask runs its stored message, on its first run as after a restart', async () => {
  const tmp = tempFile();
  try {
    const node = new Node().openPromises(tmp.file);
    let seen;
    node.pool('p').handle((m) => {
      seen = m;
      return m.n;
    });
    const message = { n: 3, at: new Date(0) };
    const asked = node.askDurable('p', message);
    message.n = 4;
    assert.equal(await asked, 3);
    assert.notEqual(seen, message, 'the stored copy, not the object');
    assert.deepEqual(seen, { n: 3, at: '1970-01-01T00:00:00.000Z' });
    assert.deepEqual(node.promises.get(asked.id).param, { n: 3, at: '1970-01-01T00:00:00.000Z' });
    await node.close();
  } finally {
    tmp.done();
  }
});

test('a durable ask asked again with the same message, keys in another order, is the same request', async () => {
  const tmp = tempFile();
  try {
    const node = new Node().openPromises(tmp.file);
    let runs = 0;
    node.pool('p').handle((m) => {
      runs++;
      return m.a + m.b;
    });
    const id = '0123456789abcdef0123456789abcdef';
    assert.equal(await node.askDurable('p', { a: 1, b: 2 }, { id }), 3);
    assert.equal(await node.askDurable('p', { b: 2, a: 1 }, { id }), 3);
    assert.equal(runs, 1);
    await assert.rejects(node.askDurable('p', { a: 1, b: 3 }, { id }).result, { code: 'PAYLOAD_MISMATCH' });
    await node.close();
  } finally {
    tmp.done();
  }
});

test('a closed node refuses openPromises and its promises with UNAVAILABLE, and makes no file', async () => {
  const tmp = tempFile();
  const unavailable = (e) => e instanceof UnavailableError && e.code === 'UNAVAILABLE';
  try {
    const never = new Node();
    await never.close();
    assert.throws(() => never.openPromises(tmp.file), unavailable);
    assert.equal(fs.existsSync(tmp.file), false, 'no file was made');
    assert.throws(() => never.promises.create('x'), unavailable);
    // A node that had a store: nothing reads or writes it once closed.
    const node = new Node().openPromises(tmp.file);
    node.promises.create('kept');
    await node.close();
    const calls = {
      openPromises: () => node.openPromises(tmp.file),
      create: () => node.promises.create('new'),
      get: () => node.promises.get('kept'),
      resolve: () => node.promises.resolve('kept', 1),
      reject: () => node.promises.reject('kept', 1),
      cancel: () => node.promises.cancel('kept'),
      prune: () => node.promises.prune({ olderThanMs: 1 }),
    };
    for (const [name, call] of Object.entries(calls)) assert.throws(call, unavailable, name);
    await assert.rejects(node.promises.await('kept', { timeoutMs: 1_000 }), unavailable);
    const reader = new Node().openPromises(tmp.file);
    try {
      assert.equal(reader.promises.get('kept').state, 'PENDING', 'the closed node settled nothing');
      assert.throws(() => reader.promises.get('new'), InvalidArgumentError, 'nor created anything');
    } finally {
      await reader.close();
    }
  } finally {
    tmp.done();
  }
});

test('a closed node lets go of its store file at once', { skip: process.platform !== 'linux' && 'reads /proc/self/fd' }, async () => {
  // Before: the file and its -wal and -shm stayed open until the closed
  // node was collected, one more descriptor per closed node on the file.
  const file = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'askpool-')), 'p.db');
  const openOnFile = () =>
    fs.readdirSync('/proc/self/fd').filter((fd) => {
      try {
        return fs.readlinkSync(`/proc/self/fd/${fd}`).startsWith(file);
      } catch {
        return false; // closed while listed
      }
    }).length;
  const node = new Node();
  node.pool('p').handle((m) => m);
  node.openPromises(file);
  assert.equal(await node.askDurable('p', 'x'), 'x');
  assert.ok(openOnFile() > 0, 'the store is open');
  await node.close();
  assert.equal(openOnFile(), 0, 'the store file is let go by close()');
});
