'use strict';
const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const askpool = require('..');
const { Node, AskError, HandlerFailedError, InvalidArgumentError, errorCodes } = askpool;

const classes = Object.values(askpool).filter(
  (v) => typeof v === 'function' && v.prototype instanceof AskError,
);

test('one AskError subclass per code of the taxonomy', () => {
  assert.equal(errorCodes.length, 15);
  assert.deepEqual(classes.map((c) => c.code).sort(), [...errorCodes].sort());
});

test('every code has its class: transient, permanent or poison', () => {
  const byClass = (k) =>
    classes
      .filter((c) => c.errorClass === k)
      .map((c) => c.code)
      .sort();
  assert.deepEqual(byClass('TRANSIENT'), ['ASK_TIMEOUT', 'BUFFER_FULL', 'DEADLINE_EXCEEDED', 'UNAVAILABLE']);
  assert.deepEqual(byClass('POISON'), ['DECODE_FAILURE']);
  assert.equal(byClass('PERMANENT').length, 10);
  assert.equal(new askpool.DecodeFailureError('x').errorClass, 'POISON');
  assert.equal(new askpool.AskTimeoutError('x').errorClass, 'TRANSIENT');
  assert.equal(new HandlerFailedError('x').errorClass, 'PERMANENT');
  // The base class, made directly, still has a code of the taxonomy.
  const base = new AskError('x');
  assert.ok(errorCodes.includes(base.code), base.code);
  assert.equal(base.code, 'INTERNAL');
  assert.equal(base.errorClass, 'PERMANENT');
});

// The mapping every binding shares (askpool-proto `AskError::from_handler`):
// an error that is just a message keeps its code; one that describes an ask
// (its timeout, route, buffer, payload, cancellation) would misreport the
// caller's own ask, so it arrives as HANDLER_FAILED with its name and message.
const KEPT = new Set([
  'UNAVAILABLE',
  'INVALID_ARGUMENT',
  'VALIDATION_ERROR',
  'PERMISSION_DENIED',
  'FAILED_PRECONDITION',
  'DECODE_FAILURE',
  'INTERNAL',
]);

for (const cls of classes) {
  const kept = KEPT.has(cls.code);
  test(`a handler throwing ${cls.name} reaches the caller as ${kept ? cls.code : 'HANDLER_FAILED'}, with its message`, async () => {
    const node = new Node({ breaker: false });
    node.pool('thrower').handle(() => {
      throw new cls('it went wrong');
    });
    const err = await node.ask('thrower', 1, { maxAttempts: 1 }).then(
      () => assert.fail('the ask succeeded'),
      (e) => e,
    );
    assert.ok(err instanceof AskError);
    if (kept) {
      assert.ok(err instanceof cls, `${err.name} is a ${cls.name}`);
      assert.equal(err.code, cls.code);
      assert.equal(err.name, cls.name);
      assert.match(err.message, /it went wrong/);
    } else if (cls.code === 'HANDLER_FAILED') {
      assert.ok(err instanceof HandlerFailedError);
      assert.equal(err.handlerMessage, 'it went wrong');
    } else {
      assert.ok(err instanceof HandlerFailedError, `${err.name} is a HandlerFailedError`);
      assert.equal(err.handlerName, cls.name);
      assert.equal(err.handlerMessage, 'it went wrong');
    }
    await node.close();
  });
}

test('a handler rethrowing the NoRouteError of its own ask: the caller is told, not misled', async () => {
  const node = new Node({ breaker: false });
  node.pool('outer').handle(async () => node.ask('inner-missing', 1));
  const err = await node.ask('outer', 1, { maxAttempts: 1 }).catch((e) => e);
  assert.ok(err instanceof HandlerFailedError, err.name);
  assert.equal(err.handlerName, 'NoRouteError');
  assert.match(err.handlerMessage, /inner-missing/);
  assert.deepEqual(node.deadLetters(), []);
  await node.close();
});

test('a handler throw reaches the caller with its name and message', async () => {
  const node = new Node();
  node.pool('bad').handle(async (msg) => {
    throw new TypeError(`cannot use ${msg}`);
  });
  const err = await node.ask('bad', 'x').catch((e) => e);
  assert.ok(err instanceof HandlerFailedError);
  assert.equal(err.code, 'HANDLER_FAILED');
  assert.equal(err.handlerName, 'TypeError');
  assert.equal(err.handlerMessage, 'cannot use x');
  assert.match(err.message, /TypeError: cannot use x/);
  node.pool('strings').handle(() => {
    throw 'plain string';
  });
  const err2 = await node.ask('strings', 1).catch((e) => e);
  assert.equal(err2.handlerName, 'string');
  assert.equal(err2.handlerMessage, 'plain string');
  await node.close();
});

// The process warnings emitted while `run` runs (askpool reports there what
// it could not deliver).
async function collectWarnings(run) {
  const warnings = [];
  const onWarning = (w) => warnings.push(w.message);
  process.on('warning', onWarning);
  try {
    await run();
    // Warnings are emitted on the next tick.
    await new Promise((r) => setImmediate(r));
  } finally {
    process.off('warning', onWarning);
  }
  return warnings;
}

// What a handler may throw or return that has no usable text or no usable
// `then`: each still answers its request (HANDLER_FAILED at once, not a
// timeout), and nothing stays held in the addon.
test('a handler throwing or returning odd things still answers, and holds nothing', async () => {
  const node = new Node({ breaker: false });
  const revoked = () => {
    const { proxy, revoke } = Proxy.revocable({}, {});
    revoke();
    return proxy;
  };
  const odd = {
    nullPrototype: () => {
      throw Object.create(null);
    },
    toStringThrows: () => {
      throw {
        toString() {
          throw new Error('no text');
        },
      };
    },
    messageGetterThrows: () => {
      const e = new Error('x');
      Object.defineProperty(e, 'message', {
        get() {
          throw new Error('no message');
        },
      });
      throw e;
    },
    nameNotAString: () => {
      const e = new Error('named by a number');
      e.name = 42;
      throw e;
    },
    asyncNullPrototype: async () => {
      throw Object.create(null);
    },
    revokedProxyThrown: () => {
      throw revoked();
    },
    thenThrows: () => ({
      then() {
        throw new Error('then failed');
      },
    }),
    thenGetterThrows: () =>
      Object.defineProperty({}, 'then', {
        get() {
          throw new Error('then getter failed');
        },
      }),
    revokedProxyReturned: revoked,
  };
  const warnings = await collectWarnings(async () => {
    for (const [name, handler] of Object.entries(odd)) {
      node.pool(name).handle(handler);
      const err = await node.ask(name, 1, { timeoutMs: 5_000, maxAttempts: 1 }).catch((e) => e);
      assert.ok(err instanceof HandlerFailedError, `${name}: ${err?.name}: ${err?.message}`);
      assert.equal(typeof err.handlerName, 'string', name);
      assert.equal(typeof err.handlerMessage, 'string', name);
    }
    node.pool('thenAnswersTwice').handle(() => ({
      then(ok, fail) {
        ok('first');
        fail(new Error('second'));
        throw new Error('third');
      },
    }));
    assert.equal(await node.ask('thenAnswersTwice', 1, { timeoutMs: 5_000 }), 'first');
    await new Promise((r) => setImmediate(r));
    const stats = node.stats();
    assert.equal(stats.requests, 0, 'no request is left with a handler');
    assert.equal(stats.outstanding, 0);
  });
  assert.deepEqual(warnings, []);
  await node.close();
});

test('INVALID_ARGUMENT: a signal that is not an AbortSignal, before anything is sent', async () => {
  const node = new Node();
  let runs = 0;
  node.pool('p').handle((m) => {
    runs += 1;
    return m;
  });
  const warnings = await collectWarnings(async () => {
    for (const signal of [5, {}, 'abort']) {
      await assert.rejects(node.ask('p', 1, { signal }), { code: 'INVALID_ARGUMENT' });
      await assert.rejects(node.askHandle('p', 1, { signal }).result, { code: 'INVALID_ARGUMENT' });
    }
    assert.equal(runs, 0, 'nothing was sent');
    assert.equal(node.stats().outstanding, 0);
    // The count of pending asks is right: a real ask still holds and settles.
    assert.equal(await node.ask('p', 2, {}), 2);
    assert.equal(node.stats().outstanding, 0);
  });
  assert.deepEqual(warnings, []);
  await node.close();
});

test('null options are no options: ask, askHandle and tell', async () => {
  const node = new Node();
  node.pool('p').handle((m) => m);
  assert.equal(await node.ask('p', 1, null), 1);
  assert.equal(await node.askHandle('p', 2, null), 2);
  assert.match(await node.tell('p', 3, null), /^[0-9a-f]{32}$/);
  await assert.rejects(node.askHandle('missing', 1, null).result, { code: 'NO_ROUTE' });
  await node.close();
});

test('NO_ROUTE: no such pool', async () => {
  const node = new Node();
  await assert.rejects(node.ask('missing', 1), { code: 'NO_ROUTE', name: 'NoRouteError' });
  await node.close();
});

test('ASK_TIMEOUT: the handler does not answer in time', async () => {
  const node = new Node();
  node.pool('stuck').handle(() => new Promise((r) => setTimeout(r, 200)));
  await assert.rejects(node.ask('stuck', 1, { timeoutMs: 20 }), {
    code: 'ASK_TIMEOUT',
    name: 'AskTimeoutError',
  });
  await node.close();
});

test('BUFFER_FULL: more in flight than maxInFlight', async () => {
  const node = new Node();
  let release;
  node
    .pool('narrow', { maxInFlight: 1 })
    .handle(() => new Promise((r) => (release = r)));
  const first = node.ask('narrow', 1);
  await assert.rejects(node.ask('narrow', 2, { maxAttempts: 1 }), {
    code: 'BUFFER_FULL',
    name: 'BufferFullError',
  });
  await new Promise((r) => setImmediate(r));
  release('done');
  assert.equal(await first, 'done');
  await node.close();
});

test('INVALID_ARGUMENT: bad options throw or reject with InvalidArgumentError', async () => {
  const node = new Node();
  assert.throws(() => node.pool('zero', { concurrency: 0 }), { code: 'INVALID_ARGUMENT' });
  node.pool('dup');
  assert.throws(() => node.pool('dup'), { code: 'INVALID_ARGUMENT' });
  await assert.rejects(node.ask('dup', 1, { requestId: 'not-hex' }), {
    code: 'INVALID_ARGUMENT',
    name: 'InvalidArgumentError',
  });
  await assert.rejects(node.ask('dup', 1, { timeoutMs: -1 }), { code: 'INVALID_ARGUMENT' });
  assert.throws(() => node.pool('h').handle('not a function'), { code: 'INVALID_ARGUMENT' });
  assert.throws(() => new Node({ defaultTimeoutMs: Number.NaN }), { code: 'INVALID_ARGUMENT' });
  await node.close();
});

test('timeoutMs and defaultTimeoutMs: one message, in the JS option names, saying what is accepted', async () => {
  const node = new Node();
  node.pool('p').handle((m) => m);
  const above0 = (name, got) => ({
    name: 'InvalidArgumentError',
    code: 'INVALID_ARGUMENT',
    message: `invalid argument: ${name} must be a number of milliseconds above 0 and at most 2^53 - 1, got ${got}`,
  });
  // 1e300 and -1e-7 as JS prints them, not in every digit.
  for (const bad of [0, -0, -1, Number.NaN, Infinity, 2 ** 53, 1e300, -1e-7]) {
    const got = Object.is(bad, -0) ? '0' : String(bad);
    await assert.rejects(node.ask('p', 1, { timeoutMs: bad }), above0('timeoutMs', got));
    await assert.rejects(node.askHandle('p', 1, { timeoutMs: bad }).result, above0('timeoutMs', got));
    await assert.rejects(node.tell('p', 1, { timeoutMs: bad }), above0('timeoutMs', got));
    assert.throws(() => new Node({ defaultTimeoutMs: bad }), above0('defaultTimeoutMs', got));
  }
  // What the message says is accepted is: a fraction of a millisecond too,
  // and one under a nanosecond (a nanosecond, not the core's refusal).
  // Accepted, not refused: half a millisecond may pass before the pool
  // answers on a loaded machine, so a timeout is as good an outcome here.
  const half = await node.ask('p', 'ok', { timeoutMs: 0.5 }).catch((e) => e);
  assert.ok(half === 'ok' || half.code === 'ASK_TIMEOUT', String(half));
  const tiny = await node.ask('p', 'ok', { timeoutMs: 1e-7 }).catch((e) => e);
  assert.ok(tiny === 'ok' || tiny.code === 'ASK_TIMEOUT', String(tiny));
  new Node({ defaultTimeoutMs: 1e-7 }).close();
  assert.equal(await node.ask('p', 'ok', { timeoutMs: 2 ** 53 - 1 }), 'ok');
  const quick = new Node({ defaultTimeoutMs: 0.5 });
  await quick.close();
  // Options where 0 means something keep accepting it, and say so.
  assert.throws(() => node.pool('q', { dedupTtlMs: -1 }), {
    message: 'invalid argument: dedupTtlMs must be a number of milliseconds from 0 to 2^53 - 1, got -1',
  });
  node.pool('r', { dedupTtlMs: 0 });
  await node.close();
});

test('an ask refused for a mistyped option or a throwing getter holds nothing, and never throws', async () => {
  const node = new Node();
  node.pool('p').handle((m) => m);
  node.openPromises(path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'askpool-')), 'p.db'));
  const getterThrows = (name) => ({
    get [name]() {
      throw new Error(`${name} getter`);
    },
  });
  const mistyped = [
    { timeoutMs: '5' },
    { timeoutMs: 5n },
    { preferredWorker: 5 },
    { requestId: 5 },
    { correlationId: {} },
    { causationId: ['0123456789abcdef0123456789abcdef'] },
    { maxAttempts: '2' },
  ];
  const calls = [
    ['ask', (o) => node.ask('p', { big: 'payload' }, o)],
    ['askHandle', (o) => node.askHandle('p', { big: 'payload' }, o).result],
    ['tell', (o) => node.tell('p', { big: 'payload' }, o)],
  ];
  for (const [name, call] of calls) {
    for (const o of mistyped) {
      // A tell has no preferred worker (TellOptions): not an option of it.
      if (name === 'tell' && 'preferredWorker' in o) continue;
      await assert.rejects(call(o), { code: 'INVALID_ARGUMENT' }, `${name} ${Object.keys(o)}`);
    }
    for (const option of ['signal', 'timeoutMs', 'requestId', 'fingerprint']) {
      await assert.rejects(call(getterThrows(option)), { message: `${option} getter` }, `${name} ${option}`);
    }
  }
  await assert.rejects(node.askDurable('p', { big: 'payload' }, { id: 5 }).result, { code: 'INVALID_ARGUMENT' });
  await assert.rejects(node.askDurable('p', { big: 'payload' }, getterThrows('id')).result, { message: 'id getter' });
  await new Promise((r) => setImmediate(r));
  assert.equal(node.stats().objects, 0, 'no refused message stays in the object table');
  assert.equal(node.stats().outstanding, 0);
  assert.equal(await node.ask('p', 1, { timeoutMs: 1000 }), 1);
  assert.match(await node.tell('p', { big: 'payload' }, getterThrows('preferredWorker')), /^[0-9a-f]{32}$/);
  await node.close();
});

test('FAILED_PRECONDITION: replaying a dead letter that does not exist', async () => {
  const node = new Node();
  await assert.rejects(node.replayDeadLetter('0123456789abcdef0123456789abcdef'), {
    code: 'FAILED_PRECONDITION',
  });
  await node.close();
});

test('UNAVAILABLE: asking a closed node', async () => {
  const node = new Node();
  await node.close();
  await assert.rejects(node.ask('any', 1), { code: 'UNAVAILABLE' });
});

test('INVALID_ARGUMENT: negative, NaN, fractional or huge numeric options', async () => {
  const node = new Node();
  node.pool('ok').handle((m) => m);
  const counts = { concurrency: 65_537, maxInFlight: 2 ** 32, dedupMax: 2 ** 32 };
  for (const [name, tooBig] of Object.entries(counts)) {
    for (const bad of [-1, 0, Number.NaN, 1.5, Infinity, tooBig, '4']) {
      assert.throws(
        () => node.pool(`bad-${name}-${String(bad)}`, { [name]: bad }),
        (e) => e instanceof InvalidArgumentError && e.code === 'INVALID_ARGUMENT',
        `${name}: ${String(bad)}`,
      );
    }
  }
  for (const name of ['dedupTtlMs', 'processingTimeoutMs']) {
    for (const bad of [-1, Number.NaN, Infinity, 2 ** 53, 'soon']) {
      assert.throws(
        () => node.pool(`bad-${name}-${String(bad)}`, { [name]: bad }),
        (e) => e instanceof InvalidArgumentError && e.code === 'INVALID_ARGUMENT',
        `${name}: ${String(bad)}`,
      );
    }
  }
  // The refused pools were not created: the names are free.
  node.pool('bad-concurrency--1', { concurrency: 2 }).handle((m) => m);
  assert.equal(await node.ask('bad-concurrency--1', 1), 1);
  for (const [name, bads] of Object.entries({
    dlqCapacity: [-1, 1.5, Number.NaN, 2 ** 32],
    reconcileCapacity: [-1, 1.5, Infinity, 2 ** 32],
    defaultTimeoutMs: [-1, Number.NaN, Infinity, 2 ** 53],
    processingTimeoutMs: [-1, Number.NaN, 2 ** 53],
    maxPayloadBytes: [-1, Number.NaN, 1.5, Infinity, 2 ** 53, '16'],
  })) {
    for (const bad of bads) {
      assert.throws(
        () => new Node({ [name]: bad }),
        (e) => e instanceof InvalidArgumentError && e.code === 'INVALID_ARGUMENT',
        `${name}: ${String(bad)}`,
      );
    }
  }
  // The refusal names the option.
  assert.throws(() => new Node({ maxPayloadBytes: -1 }), (e) => /maxPayloadBytes/.test(e.message));
  assert.throws(() => new Node({ maxPayloadBytes: 1.5 }), (e) => /maxPayloadBytes/.test(e.message));
  // Its bounds themselves are fine.
  for (const ok of [0, 2 ** 53 - 1, null, undefined]) {
    const n = new Node({ maxPayloadBytes: ok });
    await n.close();
  }
  for (const [name, bads] of Object.entries({
    timeoutMs: [-1, Number.NaN, Infinity, 1e300, 'slow'],
    maxAttempts: [-1, 0, 2.5, Number.NaN, 2 ** 32],
  })) {
    for (const bad of bads) {
      for (const start of [
        () => node.ask('ok', 1, { [name]: bad }),
        () => node.askHandle('ok', 1, { [name]: bad }).result,
        () => node.tell('ok', 1, { [name]: bad }),
      ]) {
        await assert.rejects(
          start(),
          (e) => e instanceof InvalidArgumentError && e.code === 'INVALID_ARGUMENT',
          `${name}: ${String(bad)}`,
        );
      }
    }
  }
  const db = require('node:path').join(require('node:os').tmpdir(), `askpool-bad-${process.pid}.db`);
  assert.throws(() => node.openPromises(db, { timeoutMs: -1 }), { code: 'INVALID_ARGUMENT' });
  assert.equal(require('node:fs').existsSync(db), false, 'no store opened');
  // A missing or non-path argument is refused, not turned into a file name.
  for (const bad of [undefined, null, '', 42, {}, new URL('http://example.com/x.db')]) {
    assert.throws(() => node.openPromises(bad), { code: 'INVALID_ARGUMENT' }, String(bad));
  }
  for (const name of ['undefined', 'null', '42', '[object Object]']) {
    assert.equal(require('node:fs').existsSync(name), false, `no file named ${name}`);
  }
  // Bounds themselves are fine.
  node.pool('wide', { concurrency: 4, maxInFlight: 2 ** 32 - 1, dedupMax: 1 }).handle((m) => m);
  assert.equal(await node.ask('wide', 2, { timeoutMs: 2 ** 53 - 1, maxAttempts: 1 }), 2);
  assert.equal(node.stats().outstanding, 0);
  await node.close();
});

test('ctx.progress refuses a fraction that is not a finite number (one out of 0..1 is clamped)', async () => {
  const node = new Node();
  const refused = [];
  node.pool('p').handle((m, ctx) => {
    for (const bad of [Number.NaN, Infinity, -Infinity, '0.5', undefined]) {
      try {
        ctx.progress(bad, 'bad');
        refused.push(`accepted ${String(bad)}`);
      } catch (e) {
        refused.push(e instanceof InvalidArgumentError && e.code === 'INVALID_ARGUMENT');
      }
    }
    ctx.progress(0, 'start');
    ctx.progress(1, 'end');
    return m;
  });
  const h = node.askHandle('p', 1);
  const stages = [];
  for await (const s of h.stages()) stages.push(s);
  assert.equal(await h.result, 1);
  assert.deepEqual(refused, [true, true, true, true, true]);
  const partial = stages.filter((s) => s.stage === 'PARTIAL');
  assert.deepEqual(
    partial.map((s) => [s.fraction, s.note]),
    [
      [0, 'start'],
      [1, 'end'],
    ],
  );
  await node.close();
});

test("options: a getter's or trap's own error comes through; a non-object is INVALID_ARGUMENT", () => {
  const mine = new RangeError('mine');
  const throwing = {
    get concurrency() {
      throw mine;
    },
  };
  assert.throws(
    () =>
      new Node({
        get dlqCapacity() {
          throw mine;
        },
      }),
    (e) => e === mine,
  );
  const node = new Node();
  assert.throws(() => node.pool('p', throwing), (e) => e === mine);
  const trap = new Proxy(
    {},
    {
      get() {
        throw mine;
      },
    },
  );
  assert.throws(() => node.pool('q', trap), (e) => e === mine);
  assert.throws(() => node.pool('r', 5), { code: 'INVALID_ARGUMENT' });
  assert.throws(() => new Node('fast'), { code: 'INVALID_ARGUMENT' });
  node.close();
});

test('a durable promise error says its kind once', () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'askpool-prefix-'));
  try {
    const node = new Node().openPromises(path.join(dir, 'p.db'));
    assert.throws(() => node.promises.create(''), {
      code: 'INVALID_ARGUMENT',
      message: 'invalid argument: promise id must not be empty',
    });
    node.close();
  } finally {
    fs.rmSync(dir, { recursive: true });
  }
});

test('a name or id that is not well-formed Unicode (a lone surrogate) is INVALID_ARGUMENT', async () => {
  // The addon's conversion made it U+FFFD: 'p\ud800' and 'p\udfff' were one pool.
  const node = new Node();
  node.pool('p').handle((m) => m);
  const invalid = (e) => e instanceof InvalidArgumentError && e.code === 'INVALID_ARGUMENT';
  const objects = node.stats().objects;
  assert.throws(() => node.pool('q\ud800'), invalid);
  await assert.rejects(node.ask('p\ud800', 1), invalid);
  await assert.rejects(node.ask('p', 1, { correlationId: '\udfff' }), invalid);
  await assert.rejects(node.ask('p', 1, { preferredWorker: 'w\ud800' }), invalid);
  await assert.rejects(node.tell('p\udfff', 1), invalid);
  assert.equal(node.stats().objects, objects, 'nothing refused is left in the object table');
  // A well-formed pair is a character like any other.
  node.pool('p\ud83d\ude00').handle((m) => m);
  assert.equal(await node.ask('p\ud83d\ude00', 2), 2);
  await node.close();
});

test('FAILED_PRECONDITION: a second handler for a pool, as in Python and Kotlin', async () => {
  const node = new Node();
  const pool = node.pool('p');
  pool.handle((m) => m);
  assert.throws(() => pool.handle((m) => m), {
    code: 'FAILED_PRECONDITION',
    message: 'failed precondition: pool p already has a handler',
  });
  assert.equal(await node.ask('p', 1), 1, 'the first handler stays');
  await node.close();
});

test('processingTimeoutMs: 0 is refused in the JS option name, saying what is accepted', async () => {
  const message =
    'invalid argument: processingTimeoutMs must be a number of milliseconds above 0 and at most 2^53 - 1, got 0';
  assert.throws(() => new Node({ processingTimeoutMs: 0 }), { code: 'INVALID_ARGUMENT', message });
  const node = new Node();
  assert.throws(() => node.pool('p', { processingTimeoutMs: 0 }), { code: 'INVALID_ARGUMENT', message });
  await node.close();
});

test('an ask refused for its aborted signal keeps the ids it was given', async () => {
  const node = new Node();
  node.pool('p').handle((m) => m);
  const ac = new AbortController();
  ac.abort('why');
  const requestId = 'b'.repeat(32);
  const h = node.askHandle('p', 1, { signal: ac.signal, requestId });
  assert.equal(h.requestId, requestId);
  assert.equal(h.correlationId, requestId);
  await assert.rejects(h, (e) => e.code === 'ASK_CANCELLED' && e.cause === 'why');
  // A handle is a thenable with catch and finally, as a Promise is.
  let finished = false;
  const caught = await node
    .askHandle('p', 1, { signal: ac.signal })
    .finally(() => (finished = true))
    .catch((e) => e.code);
  assert.equal(caught, 'ASK_CANCELLED');
  assert.ok(finished);
  await node.close();
});

test('ask, askHandle and tell options that are not an object are INVALID_ARGUMENT', async () => {
  const node = new Node();
  node.pool('p').handle((m) => m);
  await assert.rejects(node.ask('p', 1, 42), { code: 'INVALID_ARGUMENT' });
  await assert.rejects(node.askHandle('p', 1, 'fast'), { code: 'INVALID_ARGUMENT' });
  await assert.rejects(node.tell('p', 1, 7), { code: 'INVALID_ARGUMENT' });
  assert.equal(node.stats().objects, 0, 'nothing held');
  await node.close();
});

test('a detached buffer or a revoked Proxy as a fingerprint, or a detached payload under a requestId: INVALID_ARGUMENT, nothing held', async () => {
  const node = new Node();
  let runs = 0;
  node.pool('p').handle((m) => {
    runs++;
    return m;
  });
  // A buffer (and a view made over it before) whose bytes were transferred.
  const detach = (buffer) => {
    structuredClone(buffer, { transfer: [buffer] });
    return buffer;
  };
  const buffer = new ArrayBuffer(8);
  const view = new Float64Array(buffer);
  const dataView = new DataView(buffer, 2);
  detach(buffer);
  const revoked = Proxy.revocable({}, {});
  revoked.revoke();
  const requestId = '0123456789abcdef0123456789abcdef';
  const payloadDetached = /the payload is a detached ArrayBuffer or a view over one .*give a fingerprint option/;
  const fingerprintDetached = /fingerprint is a detached ArrayBuffer or a view over one/;
  const cases = [
    [buffer, { requestId }, payloadDetached],
    [view, { requestId }, payloadDetached],
    [dataView, { requestId }, payloadDetached],
    [{}, { requestId, fingerprint: buffer }, fingerprintDetached],
    [{}, { fingerprint: view }, fingerprintDetached],
    [{}, { requestId, fingerprint: revoked.proxy }, /fingerprint must be a string or bytes .*not an object/],
    [{}, { fingerprint: new Proxy(new Uint8Array(4), {}) }, /fingerprint must be a string or bytes/],
  ];
  const calls = [
    ['ask', (msg, o) => node.ask('p', msg, o)],
    ['askHandle', (msg, o) => node.askHandle('p', msg, o).result],
    ['tell', (msg, o) => node.tell('p', msg, o)],
  ];
  for (const [name, call] of calls) {
    for (const [msg, options, message] of cases) {
      await assert.rejects(
        call(msg, options),
        (e) => {
          assert.ok(e instanceof InvalidArgumentError, `${name}: ${e?.name}: ${e?.message}`);
          assert.equal(e.code, 'INVALID_ARGUMENT');
          assert.match(e.message, message);
          return true;
        },
        `${name} ${Object.keys(options)}`,
      );
    }
  }
  await new Promise((r) => setImmediate(r));
  assert.equal(runs, 0, 'nothing was sent');
  assert.equal(node.stats().objects, 0, 'no refused message stays in the object table');
  assert.equal(node.stats().outstanding, 0);
  // Without a request id (nothing to fingerprint), or with a fingerprint of
  // its own, a detached buffer is a payload like any other: passed by reference.
  assert.equal(await node.ask('p', buffer), buffer);
  assert.equal(await node.ask('p', view, { requestId, fingerprint: 'view' }), view);
  // A detached DataView too, whose byteLength throws where a typed
  // array's reads 0 (it was a raw TypeError with no code).
  assert.equal(await node.ask('p', dataView), dataView);
  assert.match(await node.tell('p', dataView), /^[0-9a-f]{32}$/);
  await node.close();
});
