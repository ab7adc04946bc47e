'use strict';
const test = require('node:test');
const assert = require('node:assert/strict');
const { Node, AskCancelledError } = require('..');

const tick = () => new Promise((r) => setImmediate(r));

// Runs `fn`, collecting what the process emits as `event` meanwhile.
async function collect(event, fn) {
  const seen = [];
  const onEvent = (e) => seen.push(e);
  process.on(event, onEvent);
  try {
    await fn();
  } finally {
    process.off(event, onEvent);
  }
  return seen;
}

test('a signal aborted before the ask: nothing is sent', async () => {
  const node = new Node();
  let runs = 0;
  node.pool('p').handle(() => {
    runs++;
  });
  const controller = new AbortController();
  controller.abort(new Error('not wanted'));
  const err = await node.ask('p', 1, { signal: controller.signal }).catch((e) => e);
  assert.ok(err instanceof AskCancelledError);
  assert.equal(err.code, 'ASK_CANCELLED');
  assert.equal(err.cause.message, 'not wanted');
  await tick();
  assert.equal(runs, 0);
  assert.equal(node.stats().pools[0].admitted, 0);
  await node.close();
});

test('a signal aborted while the options are read (a getter): nothing is sent', async () => {
  const node = new Node();
  let runs = 0;
  node.pool('p').handle(() => {
    runs++;
  });
  for (const kind of ['ask', 'askHandle', 'tell']) {
    const controller = new AbortController();
    const options = {
      signal: controller.signal,
      get timeoutMs() {
        controller.abort(new Error(`left during ${kind}`));
        return 1000;
      },
    };
    const started = {
      ask: () => node.ask('p', 1, options),
      askHandle: () => node.askHandle('p', 1, options).result,
      tell: () => node.tell('p', 1, options),
    }[kind]();
    const err = await started.catch((e) => e);
    assert.ok(err instanceof AskCancelledError, kind);
    assert.equal(err.cause.message, `left during ${kind}`, kind);
  }
  await tick();
  assert.equal(runs, 0);
  assert.equal(node.stats().pools[0].admitted, 0);
  await node.close();
});

test('a signal aborted during the ask: it rejects and the handler sees the cancel', async () => {
  const node = new Node();
  let handlerSignal;
  let started;
  const running = new Promise((r) => (started = r));
  node.pool('slow').handle((msg, ctx) => {
    handlerSignal = ctx.signal;
    started();
    return new Promise((resolve) => ctx.signal.addEventListener('abort', () => resolve('late')));
  });
  const controller = new AbortController();
  const asked = node.ask('slow', 1, { signal: controller.signal });
  await running;
  assert.equal(handlerSignal.aborted, false);
  controller.abort();
  await assert.rejects(asked, { code: 'ASK_CANCELLED', name: 'AskCancelledError' });
  for (let i = 0; i < 10 && !handlerSignal.aborted; i++) await tick();
  assert.equal(handlerSignal.aborted, true, 'the protocol cancel reached the handler');
  const pool = node.stats().pools[0];
  assert.equal(pool.cancels, 1);
  await node.close();
});

test("a signal aborted during the ask: the rejection's cause is the signal's reason", async () => {
  const node = new Node();
  let started;
  const running = new Promise((r) => (started = r));
  node.pool('slow').handle((m, ctx) => {
    started();
    return new Promise((resolve) => ctx.signal.addEventListener('abort', () => resolve('late')));
  });
  const controller = new AbortController();
  const reason = new Error('the user left');
  const asked = node.ask('slow', 1, { signal: controller.signal });
  await running;
  controller.abort(reason);
  const err = await asked.catch((e) => e);
  assert.ok(err instanceof AskCancelledError);
  assert.equal(err.cause, reason, 'as when the signal was aborted before the ask');
  // AbortSignal.timeout(): the cause tells a deadline from a user's abort.
  const timedOut = await node.ask('slow', 2, { signal: AbortSignal.timeout(20) }).catch((e) => e);
  assert.ok(timedOut instanceof AskCancelledError);
  assert.equal(timedOut.cause?.name, 'TimeoutError');
  // A cancel by the handle has no signal, so no cause.
  const handle = node.askHandle('slow', 3);
  await tick();
  handle.cancel();
  const cancelled = await handle.result.catch((e) => e);
  assert.equal(cancelled.code, 'ASK_CANCELLED');
  assert.equal(cancelled.cause, undefined);
  await node.close();
});

test('one signal shared by many asks: one abort listener, no MaxListenersExceededWarning', async () => {
  const { getEventListeners } = require('node:events');
  const warnings = await collect('warning', async () => {
    const node = new Node();
    node.pool('echo', { concurrency: 4 }).handle(async (m) => m);
    node.pool('never').handle(() => new Promise(() => {}));
    const controller = new AbortController();
    const { signal } = controller;
    const replies = await Promise.all(Array.from({ length: 50 }, (_, i) => node.ask('echo', i, { signal })));
    assert.equal(replies.length, 50);
    assert.equal(getEventListeners(signal, 'abort').length, 0, 'every listener removed once its ask ended');
    const pending = Array.from({ length: 50 }, (_, i) => node.ask('never', i, { signal }));
    assert.equal(getEventListeners(signal, 'abort').length, 1);
    const reason = new Error('all of them');
    controller.abort(reason);
    for (const err of await Promise.all(pending.map((p) => p.catch((e) => e)))) {
      assert.ok(err instanceof AskCancelledError);
      assert.equal(err.cause, reason);
    }
    assert.equal(node.stats().outstanding, 0);
    await node.close();
    await tick();
  });
  assert.deepEqual(
    warnings.map((w) => w.name),
    [],
    warnings.map((w) => w.message).join('; '),
  );
});

test('handle.cancel() rejects the ask; cancel after the end does nothing', async () => {
  const node = new Node();
  node.pool('never').handle(() => new Promise(() => {}));
  node.pool('echo').handle((m) => m);
  let releaseLater;
  const gate = new Promise((r) => (releaseLater = r));
  node.pool('gated').handle(async (m) => {
    await gate;
    return m;
  });
  const handle = node.askHandle('never', 1);
  await tick();
  handle.cancel();
  await assert.rejects(handle.result, { code: 'ASK_CANCELLED' });
  const done = node.askHandle('echo', 2);
  assert.equal(await done, 2);
  done.cancel();
  assert.equal(await done.result, 2);
  // Cancelled after their end while newer asks are in flight (which reuse
  // the ended asks' task slots; several, so that one does whichever slot
  // comes free first): the newer asks are not touched.
  const later = [];
  for (let i = 0; i < 4; i++) later.push(node.askHandle('gated', 10 + i));
  const settled = Promise.allSettled(later);
  await tick();
  done.cancel();
  handle.cancel();
  await tick();
  releaseLater();
  const outcomes = (await settled).map((o) => o.value ?? o.reason?.code);
  assert.deepEqual(outcomes, [10, 11, 12, 13], 'a stale cancel left the newer asks alone');
  const stages = [];
  for await (const s of handle.stages()) stages.push(s.stage);
  assert.equal(stages.at(-1), 'FAILED');
  await node.close();
});

test('a handle read through its stages or cancelled: its failure is no unhandled rejection', async () => {
  const unhandled = await collect('unhandledRejection', async () => {
    const node = new Node();
    node.pool('never').handle(() => new Promise(() => {}));
    // The README's loop, with an await in its body: the ask times out
    // while the loop still runs, before the handle is awaited.
    const handle = node.askHandle('never', 1, { timeoutMs: 20 });
    const stages = [];
    for await (const s of handle.stages()) {
      stages.push(s.stage);
      await new Promise((r) => setTimeout(r, 10));
    }
    assert.equal(stages.at(-1), 'TIMED_OUT');
    await assert.rejects(
      async () => await handle,
      { code: 'ASK_TIMEOUT' },
      'the outcome is still there for whoever awaits it',
    );
    // Cancelled and left: the caller asked for the AskCancelledError.
    const left = node.askHandle('never', 2);
    left.cancel();
    await new Promise((r) => setTimeout(r, 20));
    await assert.rejects(left.result, { code: 'ASK_CANCELLED' });
    await node.close();
    await new Promise((r) => setTimeout(r, 10));
  });
  assert.deepEqual(unhandled, []);
});

test('the pool closing cancels a request being handled (ctx.signal)', async () => {
  const node = new Node();
  let signal;
  let started;
  const running = new Promise((r) => (started = r));
  const pool = node.pool('closing');
  pool.handle((m, ctx) => {
    signal = ctx.signal;
    started();
    return new Promise(() => {});
  });
  const asked = node.ask('closing', 1, { timeoutMs: 2000, maxAttempts: 1 });
  await running;
  assert.equal(signal.aborted, false);
  assert.equal(node.stats().requests, 1);
  await node.close();
  await assert.rejects(asked, { code: 'UNAVAILABLE' });
  assert.equal(signal.aborted, true, 'closing cancelled the running request');
  assert.equal(node.stats().requests, 0, 'no request is held after close');
});

test('a processing timeout cancels the request from the runtime thread', async () => {
  const node = new Node();
  let signal;
  node.pool('overdue', { processingTimeoutMs: 30 }).handle((m, ctx) => {
    signal = ctx.signal;
    return new Promise(() => {});
  });
  const before = node.stats().threadWakes;
  await assert.rejects(node.ask('overdue', 1, { timeoutMs: 5000, maxAttempts: 1 }), {
    code: 'ASK_CANCELLED',
  });
  assert.equal(signal.aborted, true);
  assert.ok(node.stats().threadWakes > before, 'the wake crossed from the tokio thread');
  await node.close();
});

test('node.close() under a running handler: ctx reports cancelled, progress is a no-op', async () => {
  const node = new Node();
  let started;
  const running = new Promise((r) => (started = r));
  let saw;
  const handlerDone = new Promise((done) => {
    node.pool('poll').handle(async (m, ctx) => {
      started();
      try {
        while (!ctx.cancelled) await new Promise((r) => setTimeout(r, 5));
        ctx.progress(0.5, 'after close');
        saw = {
          cancelled: ctx.cancelled,
          aborted: ctx.signal.aborted,
          requestId: ctx.requestId,
          pool: ctx.pool,
        };
      } catch (e) {
        saw = e;
      }
      done();
    });
  });
  const caller = node.ask('poll', 1).catch((e) => e.code);
  await running;
  await node.close();
  assert.equal(await caller, 'UNAVAILABLE');
  await handlerDone;
  assert.ok(!(saw instanceof Error), `the handler got ${saw?.name}: ${saw?.message}`);
  assert.equal(saw.cancelled, true);
  assert.equal(saw.aborted, true);
  assert.match(saw.requestId, /^[0-9a-f]{32}$/);
  assert.equal(saw.pool, 'poll');
});

test('node.close() aborts the signal a running handler watches', async () => {
  const node = new Node();
  let started;
  const running = new Promise((r) => (started = r));
  let reason;
  const handlerDone = new Promise((done) => {
    node.pool('watch').handle((m, ctx) => {
      ctx.signal.addEventListener('abort', () => {
        reason = ctx.signal.reason;
        done();
      });
      started();
      return new Promise(() => {});
    });
  });
  const caller = node.ask('watch', 1).catch((e) => e.code);
  await running;
  await node.close();
  await handlerDone;
  assert.ok(reason instanceof AskCancelledError);
  assert.equal(await caller, 'UNAVAILABLE');
});

test('pool.close() under a running handler: ctx.signal aborts, and its reply still reaches the caller', async () => {
  const node = new Node();
  let started;
  const running = new Promise((r) => (started = r));
  const pool = node.pool('closing-pool');
  pool.handle((m, ctx) => {
    started();
    return new Promise((resolve) => ctx.signal.addEventListener('abort', () => resolve('told of the close')));
  });
  const asked = node.ask('closing-pool', 1, { timeoutMs: 30000 });
  await running;
  pool.close();
  assert.equal(await asked, 'told of the close');
  await node.close();
});

test('a handler giving up on its cancel (throwing what ctx.signal carries) answers ASK_CANCELLED, as in every binding', async () => {
  const node = new Node();
  // The pool closes under the handler, which then stops as `how` says.
  const closedUnder = async (name, how) => {
    let started;
    const running = new Promise((r) => (started = r));
    const pool = node.pool(name);
    pool.handle(async (m, ctx) => {
      started();
      await new Promise((resolve) => ctx.signal.addEventListener('abort', resolve));
      how(ctx);
    });
    const asked = node.ask(name, 1, { timeoutMs: 30000 });
    await running;
    pool.close();
    return asked.catch((e) => e);
  };
  const throwIfAborted = await closedUnder('a', (ctx) => ctx.signal.throwIfAborted());
  assert.ok(throwIfAborted instanceof AskCancelledError, `${throwIfAborted}`);
  assert.equal(throwIfAborted.code, 'ASK_CANCELLED');
  const abortError = await closedUnder('b', () => {
    throw new DOMException('stopped', 'AbortError');
  });
  assert.equal(abortError.code, 'ASK_CANCELLED');
  // Its own error after the cancel still fails the ask.
  const own = await closedUnder('c', () => {
    throw new TypeError('cleanup failed');
  });
  assert.equal(own.code, 'HANDLER_FAILED');
  assert.equal(own.handlerName, 'TypeError');
  await node.close();
});

// Asks a handler that waits on a gate, cancels the ask while it waits,
// then opens the gate: `look(ctx)` is what the handler reads after it.
// Returns the handle, the handler's ctx and what `look` gave.
async function cancelWhileRunning(node, look) {
  let release;
  const gate = new Promise((resolve) => {
    release = resolve;
  });
  let ctx;
  let seen;
  const ended = new Promise((resolve) => {
    node.pool('slow').handle(async (msg, c) => {
      ctx = c;
      await gate;
      seen = look(c);
      resolve();
      return 'late';
    });
  });
  const handle = node.askHandle('slow', 1);
  handle.result.catch(() => {});
  await tick();
  handle.cancel();
  await tick();
  release();
  await ended;
  return { handle, ctx, seen };
}

test("a handler's cancel: signal aborted when first read, cancelled kept once seen", async () => {
  const node = new Node();
  // Cancelled while waiting: both say so at once.
  const { ctx, seen } = await cancelWhileRunning(node, (c) => ({
    cancelled: c.cancelled,
    aborted: c.signal.aborted,
  }));
  assert.deepEqual(seen, { cancelled: true, aborted: true });
  await tick();
  // After the handler ended: still cancelled, as it saw.
  assert.equal(ctx.cancelled, true);
  await node.close();
});

test("a handler's cancel, seen through ctx.cancelled only (no signal): still cancelled after the handler ended", async () => {
  // No signal read: nothing but the memo of what ctx.cancelled saw keeps it
  // true once the request has left the addon.
  const node = new Node();
  const { handle, ctx, seen } = await cancelWhileRunning(node, (c) => c.cancelled);
  assert.equal(seen, true, 'cancelled while running');
  await assert.rejects(handle.result, { code: 'ASK_CANCELLED' });
  await tick();
  await tick();
  // After the handler ended: still cancelled, as it saw.
  assert.equal(ctx.cancelled, true);
  await node.close();
});

test("a tell's signal: aborted before, nothing is sent; aborted while the pool refuses it (BUFFER_FULL), it is cancelled", async () => {
  const node = new Node();
  let runs = 0;
  node.pool('full', { maxInFlight: 1 }).handle(() => {
    runs++;
    return new Promise(() => {});
  });
  node.pool('free').handle(() => {
    runs++;
  });
  const blocker = node.ask('full', 0, { maxAttempts: 1 }).catch((e) => e);
  await tick();
  assert.equal(runs, 1);
  const early = new AbortController();
  early.abort(new Error('not wanted'));
  const refused = await node.tell('free', 1, { signal: early.signal }).catch((e) => e);
  assert.ok(refused instanceof AskCancelledError, `${refused?.name}: ${refused?.message}`);
  assert.equal(refused.cause.message, 'not wanted');
  // The pool refuses it, and the tell retries until its timeout: the abort
  // ends it there.
  const controller = new AbortController();
  const started = Date.now();
  const told = node.tell('full', 2, { signal: controller.signal, timeoutMs: 3_000 }).catch((e) => e);
  setTimeout(() => controller.abort(new Error('stop')), 20);
  const cancelled = await told;
  assert.ok(cancelled instanceof AskCancelledError, `${cancelled?.name}: ${cancelled?.message}`);
  assert.equal(cancelled.code, 'ASK_CANCELLED');
  assert.equal(cancelled.cause.message, 'stop', "the signal's reason is the cause");
  assert.ok(Date.now() - started < 2_000, `cancelled at once, not at the timeout (${Date.now() - started} ms)`);
  assert.equal(node.stats().outstanding, 1, 'only the blocking ask is left');
  // A tell the pool took before the abort reached it stands: it resolves,
  // and its handler runs.
  const late = new AbortController();
  const taken = node.tell('free', 3, { signal: late.signal });
  late.abort(new Error('too late'));
  assert.match(await taken, /^[0-9a-f]{32}$/);
  await tick();
  assert.equal(runs, 2);
  assert.equal(node.stats().pools.find((p) => p.name === 'full').admitted, 1, 'the cancelled tell was never admitted');
  await node.close();
  assert.equal((await blocker).code, 'UNAVAILABLE');
});

test("a tell aborted once its re-send came due is not sent by the abort", async () => {
  // The abort looked at the tell by polling it, which made the re-send that
  // had come due: the pool, free again, took the tell the caller gave up,
  // its handler ran and the tell resolved.
  const node = new Node({ breaker: false });
  const ran = [];
  let release;
  node.pool('full', { maxInFlight: 1 }).handle((m) => {
    ran.push(m);
    if (m === 'blocker') return new Promise((r) => (release = r));
  });
  const blocker = node.ask('full', 'blocker');
  await tick();
  const controller = new AbortController();
  const told = node
    .tell('full', 'told', { signal: controller.signal, timeoutMs: 10_000 })
    .then((id) => `resolved ${id}`, (e) => e.code);
  await new Promise((r) => setTimeout(r, 30)); // refused, waiting to re-send
  release('done');
  await blocker; // the pool has room again
  const until = Date.now() + 1_500; // the re-send comes due; no drain runs
  while (Date.now() < until);
  controller.abort(new Error('stop'));
  assert.equal(await told, 'ASK_CANCELLED');
  await tick();
  assert.deepEqual(ran, ['blocker']);
  assert.equal(node.stats().pools.find((p) => p.name === 'full').admitted, 1);
  await node.close();
});

test('a handler answering after node.close() (a reply or a throw, in its body or later): no warning, the caller gets UNAVAILABLE', async () => {
  // The close took the request out of the addon: an answer sent anyway was
  // refused there ("request 0 was already answered"), a process warning.
  for (const how of ['reply in its body', 'throw in its body', 'reply later', 'throw later']) {
    let asked;
    const warnings = await collect('warning', async () => {
      const node = new Node();
      let release;
      const gate = new Promise((r) => (release = r));
      node.pool('p').handle((m) => {
        if (how.endsWith('later')) {
          return gate.then(() => {
            if (how.startsWith('throw')) throw new Error('after the close');
            return 'after the close';
          });
        }
        node.close();
        if (how.startsWith('throw')) throw new Error('after the close');
        return 'after the close';
      });
      asked = node.ask('p', 1).catch((e) => e.code);
      if (how.endsWith('later')) {
        await tick();
        await node.close();
        release();
      }
      assert.equal(await asked, 'UNAVAILABLE', how);
      await tick();
    });
    assert.deepEqual(
      warnings.map((w) => w.message),
      [],
      how,
    );
  }
});

test('a handler that watched ctx.signal and closed the node in its body: the cancel of its ended request is no warning', async () => {
  // The close cancels the request, whose watch reports it at the next drain,
  // after the handler's return ended it in the wrapper.
  const warnings = await collect('warning', async () => {
    const node = new Node();
    let signal;
    node.pool('p').handle((m, ctx) => {
      signal = ctx.signal;
      node.close();
      return 'closed';
    });
    await assert.rejects(node.ask('p', 1), { code: 'UNAVAILABLE' });
    await tick();
    assert.equal(signal.aborted, true);
  });
  assert.deepEqual(
    warnings.map((w) => w.message),
    [],
  );
});

test("pool.close() from a ctx.signal listener as the node closes: the pool's queued asks reject UNAVAILABLE, as the close's others", async () => {
  // The node's close aborts the handlers' signals before it shuts the node
  // down: a pool closed by a listener then must not end its queued asks
  // first (they were cancelled by the pool, ASK_CANCELLED).
  const node = new Node();
  let started;
  const running = new Promise((r) => (started = r));
  const pool = node.pool('p', { concurrency: 1 });
  pool.handle((m, ctx) => {
    ctx.signal.addEventListener('abort', () => pool.close());
    started();
    return new Promise(() => {});
  });
  const first = node.ask('p', 1, { timeoutMs: 60_000 }).catch((e) => e.code);
  const queued = node.ask('p', 2, { timeoutMs: 60_000 }).catch((e) => e.code);
  await running;
  await node.close();
  assert.deepEqual([await first, await queued], ['UNAVAILABLE', 'UNAVAILABLE']);
  assert.equal(node.stats().outstanding, 0);
});

test('a handler that watched ctx.signal and answered leaves no cancel watch running', async () => {
  // The watch of an answered request, never to fire, was left among the
  // node's tasks, one per request.
  const node = new Node();
  const signals = [];
  node.pool('p', { concurrency: 2 }).handle((m, ctx) => {
    signals.push(ctx.signal);
    return m;
  });
  await node.ask('p', 0);
  const idle = node.stats().tasks;
  for (let i = 1; i <= 20; i++) assert.equal(await node.ask('p', i), i);
  await tick();
  assert.equal(node.stats().tasks, idle, 'each watch ended with its request');
  assert.equal(signals.filter((s) => s.aborted).length, 0);
  await node.close();
});
