'use strict';
// The public API over the addon's Core: Node, Pool, AskHandle, Context.

const native = require('./native');
const errors = require('./errors');
const { ObjectTable } = require('./table');
const { isAnyArrayBuffer } = require('node:util').types;

const {
  fromInfo,
  fromNative,
  describeThrown,
  AskCancelledError,
  AskTimeoutError,
  FailedPreconditionError,
  InvalidArgumentError,
  NoRouteError,
  UnavailableError,
} = errors;

// Event kinds of Core.drain (bindings/node/src/core.rs, mod event).
const FREE = 0;
const ASK_OK = 1;
const ASK_ERR = 2;
const TELL_OK = 3;
const REQUEST = 4;
const STAGE = 5;
const STAGE_END = 6;
const CANCELLED = 7;
const REQUEST_BYTES = 8;
const ASK_OK_BYTES = 9;
const DURABLE = 0x8000_0000;
// Core.poolRef's reference for a name it keeps no reference for.
const SCRATCH_REF = 0xffff_ffff;

const EVENTS = 1024;

// Durable payloads are stored as JSON.
function encode(value) {
  return Buffer.from(JSON.stringify(value === undefined ? null : value), 'utf8');
}
// `encode` for a value the caller gave: one JSON cannot hold (a BigInt, a
// cycle) is INVALID_ARGUMENT, before anything is stored or sent.
function encodeArg(value, what) {
  try {
    return encode(value);
  } catch (e) {
    throw new InvalidArgumentError(`invalid argument: ${what} must be JSON: ${e?.message}`, { cause: e });
  }
}
function decode(buffer) {
  return buffer == null || buffer.length === 0 ? undefined : JSON.parse(buffer.toString('utf8'));
}

// A store's file: a path string or a file: URL. Anything else would be
// turned into a file named after it ("undefined", "[object Object]").
function storePath(path) {
  if (path instanceof URL) {
    try {
      return require('node:url').fileURLToPath(path);
    } catch (e) {
      throw new InvalidArgumentError(`invalid argument: ${e.message}`, { cause: e });
    }
  }
  if (typeof path === 'string' && path.length > 0) return path;
  throw new InvalidArgumentError('invalid argument: openPromises needs a file path (a non-empty string or a file: URL)');
}

const NODE_OPTIONS = [
  'defaultTimeoutMs',
  'dlqCapacity',
  'trackStages',
  'breaker',
  'reconcileCapacity',
  'processingTimeoutMs',
  'maxPayloadBytes',
];
const POOL_OPTIONS = ['concurrency', 'maxInFlight', 'dedupMax', 'dedupTtlMs', 'processingTimeoutMs'];

// Options read here, not by the addon: a getter or Proxy trap that throws
// reaches the caller as its own error, not as a failure of the addon.
function snapshot(options, keys) {
  if (options === undefined || options === null) return {};
  if (typeof options !== 'object') {
    throw new InvalidArgumentError(`invalid argument: options are an object, not ${typeof options}`);
  }
  const out = {};
  for (const key of keys) {
    const value = options[key];
    if (value !== undefined) out[key] = value;
  }
  return out;
}

// An ask's or tell's options: an object, or absent (null too, as for a
// pool's); a number or a string is a mistake, not "no options".
function askOptions(options) {
  if (options !== undefined && options !== null && typeof options !== 'object') {
    throw new InvalidArgumentError(`invalid argument: options are an object, not ${typeof options}`);
  }
  return options ?? NO_OPTIONS;
}

// A JS-side duration in milliseconds: absent, or a finite number above 0.
function positiveMillis(value, what) {
  if (value === undefined) return undefined;
  if (typeof value !== 'number' || !(value > 0) || !Number.isFinite(value)) {
    throw new InvalidArgumentError(
      `invalid argument: ${what} must be a finite number of milliseconds above 0, got ${String(value)}`,
    );
  }
  return value;
}

// Waits `ms`, or until `signal` aborts (then rejects with AskCancelledError).
function pause(ms, signal) {
  return new Promise((resolve, reject) => {
    const onAbort = () => {
      clearTimeout(timer);
      reject(waitAborted(signal));
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

function call(fn) {
  try {
    return fn();
  } catch (e) {
    throw e instanceof errors.AskError ? e : fromNative(e);
  }
}

// Reports a failure that has no caller to reject (a drain that failed on
// the event loop) without throwing into the loop.
function warn(what, e) {
  const error = e instanceof errors.AskError ? e : fromNative(e);
  process.emitWarning(`askpool: ${what}: ${error.name} (${error.code}): ${error.message}`, {
    type: 'AskpoolWarning',
    code: `ASKPOOL_${error.code}`,
  });
}

function closedReason() {
  return new AskCancelledError('ask cancelled: the node closed');
}

function aborted(signal) {
  return new AskCancelledError('ask cancelled: the signal was aborted before the ask was sent', {
    cause: signal.reason,
  });
}

function waitAborted(signal) {
  return new AskCancelledError('ask cancelled: the wait was aborted', { cause: signal.reason });
}

// What a value is, for a message, read without touching it (no getter or
// Proxy trap runs).
function kindOf(value) {
  if (value === null) return 'null';
  const type = typeof value;
  if (type === 'object') return 'an object';
  return type === 'undefined' ? 'undefined' : `a ${type}`;
}

// What the addon hashes into a payload fingerprint: a string, or the bytes
// of a typed array, DataView, ArrayBuffer or SharedArrayBuffer. `what`
// names the value in an error, which `hint` ends.
function fingerprintOf(value, what, hint = 'there is nothing to fingerprint') {
  if (typeof value === 'string') return value;
  if (!isBytes(value)) {
    throw new InvalidArgumentError(
      `invalid argument: ${what} must be a string or bytes (a typed array, DataView, ArrayBuffer ` +
        `or SharedArrayBuffer), not ${kindOf(value)}`,
    );
  }
  const view = ArrayBuffer.isView(value);
  if (isDetached(view ? value.buffer : value)) {
    throw new InvalidArgumentError(
      `invalid argument: ${what} is a detached ArrayBuffer or a view over one (its bytes were ` +
        `transferred away): ${hint}`,
    );
  }
  if (value instanceof Uint8Array) return value;
  return view ? new Uint8Array(value.buffer, value.byteOffset, value.byteLength) : new Uint8Array(value);
}

// Node 22 has ArrayBuffer#detached; before it, a detached buffer is one of
// length 0 that no view can be made over.
function isDetached(buffer) {
  if (typeof buffer.detached === 'boolean') return buffer.detached;
  if (buffer.byteLength !== 0) return false;
  try {
    new Uint8Array(buffer);
    return false;
  } catch {
    return true;
  }
}

// Byte payloads asked under a given request id are fingerprinted by
// themselves: reusing the id with other bytes is refused (PAYLOAD_MISMATCH);
// a generated id is never reused, so its bytes are not hashed. Other objects
// need `fingerprint`.
// They are also sized (their byteLength): over the node's maxPayloadBytes an
// ask or tell fails at once (OVERSIZE_PAYLOAD). Other payloads are not sized.
// Told by their internal slots, not `instanceof`: a SharedArrayBuffer or a
// buffer of another realm (vm, a worker's message) is bytes too, and a Proxy
// (a revoked one too) is an object like any other, passed through untouched
// with none of its traps run.
function isBytes(msg) {
  return typeof msg === 'object' && msg !== null && (ArrayBuffer.isView(msg) || isAnyArrayBuffer(msg));
}

// A byte payload's size. One over a detached buffer has none: a detached
// DataView's byteLength throws (a typed array's reads 0).
function byteSize(msg) {
  return isDetached(ArrayBuffer.isView(msg) ? msg.buffer : msg) ? 0 : msg.byteLength;
}

// An option the addon takes as a `type` ('string' or 'number'), or absent
// (undefined, null). Checked here, before the message enters the object
// table: a value the addon's conversion refused would leave it there.
function typed(value, type, name) {
  if (value === undefined || value === null) return undefined;
  if (typeof value !== type) {
    throw new InvalidArgumentError(`invalid argument: ${name} must be a ${type}, got ${typeof value}`);
  }
  return type === 'string' ? wellFormed(value, name) : value;
}

// A lone surrogate: in a /u pattern a well-formed pair is one code point.
const LONE_SURROGATE = /\p{Cs}/u;

// A name or id the addon takes as UTF-8. Its conversion would turn a lone
// surrogate into U+FFFD, so two different names would mean one pool: refused,
// as Python and Kotlin refuse it.
function wellFormed(s, name) {
  if (LONE_SURROGATE.test(s)) {
    throw new InvalidArgumentError(`invalid argument: ${name} is not well-formed Unicode (a lone surrogate)`);
  }
  return s;
}

// Each option read once, checked, into a plain object the addon converts
// without fail. A tell has no preferred worker (the core drops it): not
// read for a tell, which a mistyped one would refuse over an option it
// does not have.
function nativeAskOptions(o, msg, tell) {
  const given = o.fingerprint;
  const bytes = isBytes(msg);
  const requestId = typed(o.requestId, 'string', 'requestId');
  return {
    timeoutMs: typed(o.timeoutMs, 'number', 'timeoutMs'),
    preferredWorker: tell ? undefined : typed(o.preferredWorker, 'string', 'preferredWorker'),
    requestId,
    correlationId: typed(o.correlationId, 'string', 'correlationId'),
    causationId: typed(o.causationId, 'string', 'causationId'),
    maxAttempts: typed(o.maxAttempts, 'number', 'maxAttempts'),
    fingerprint:
      given !== undefined
        ? fingerprintOf(given, 'fingerprint')
        : bytes && requestId !== undefined
          ? fingerprintOf(
              msg,
              'the payload',
              'a byte payload asked under a requestId is fingerprinted by its bytes ' +
                '(give a fingerprint option to ask it anyway)',
            )
          : undefined,
    payloadSize: bytes ? byteSize(msg) : undefined,
  };
}

const NO_OPTIONS = Object.freeze({});

// The asks waiting on each signal, under one 'abort' listener however many
// share the signal (a listener per ask set off Node's
// MaxListenersExceededWarning past ten asks on one signal). The listener is
// removed when the last of them ends.
const signalWaiters = new WeakMap();

function watchSignal(signal, entry) {
  let waiters = signalWaiters.get(signal);
  if (waiters === undefined) {
    const entries = new Set();
    const listener = () => {
      signalWaiters.delete(signal);
      for (const e of [...entries]) e.onAbort();
    };
    waiters = { entries, listener };
    signal.addEventListener('abort', listener, { once: true });
    signalWaiters.set(signal, waiters);
  }
  waiters.entries.add(entry);
}

function unwatchSignal(signal, entry) {
  const waiters = signalWaiters.get(signal);
  if (waiters === undefined || !waiters.entries.delete(entry)) return;
  if (waiters.entries.size === 0) {
    signalWaiters.delete(signal);
    signal.removeEventListener('abort', waiters.listener);
  }
}

// An AbortSignal, or a signal that works like one (addEventListener('abort')).
function isSignal(signal) {
  return (
    signal instanceof AbortSignal ||
    (typeof signal === 'object' &&
      typeof signal.aborted === 'boolean' &&
      typeof signal.addEventListener === 'function' &&
      typeof signal.removeEventListener === 'function')
  );
}

// Whether a handler that threw `thrown` gave up on its request's cancel:
// its ctx.signal aborted, and it threw what the signal carried
// (`signal.throwIfAborted()`) or an abortable API's AbortError. The caller
// then gets ASK_CANCELLED (the worker's cancel), as in Python and Kotlin,
// rather than HANDLER_FAILED.
function gaveUp(signal, thrown) {
  if (signal === undefined || !signal.aborted) return false;
  if (thrown === signal.reason) return true;
  try {
    return thrown instanceof Error && thrown.name === 'AbortError';
  } catch {
    return false; // a revoked proxy: not even its prototype can be read
  }
}

// A context used after its handler ended (answered, threw, or its promise
// settled): the request is gone from the addon, its slot maybe another's.
function contextEnded(what) {
  return new FailedPreconditionError(
    `failed precondition: ctx.${what} after the handler ended: the context of a request ` +
      'ended with its handler (to use an id later, keep it while the handler runs: ' +
      'const id = ctx.requestId)',
  );
}

/**
 * What a handler gets besides the message. Valid while the handler runs:
 * once it ended, the id getters and progress() throw FailedPreconditionError
 * (`cancelled` and `signal` still answer). The ids are not kept past the
 * handler: fetching them for every request would cost each ask about 40%
 * more (1.8 us on 4.5 us), for the few handlers that read them late.
 */
class Context {
  #node;
  #request;
  #info;
  #controller;
  // Set when the node closed under the running handler: the request is gone
  // from the addon, so the context answers from what it kept.
  #closed = false;
  // Set when the handler ended.
  #ended = false;
  // Set when `cancelled` answered true.
  #sawCancel = false;
  /** @internal */
  constructor(node, request) {
    this.#node = node;
    this.#request = request;
  }
  #details(what) {
    // Also when the ids were read before: the same answer, whether or not
    // the handler happened to read them while it ran.
    if (this.#ended) throw contextEnded(what);
    this.#info ??= this.#node._request(this.#request, 'requestInfo');
    return this.#info;
  }
  get requestId() {
    return this.#details('requestId').requestId;
  }
  get correlationId() {
    return this.#details('correlationId').correlationId;
  }
  /** The request that caused this one, if its caller named it. */
  get causationId() {
    return this.#details('causationId').causationId ?? undefined;
  }
  get pool() {
    return this.#details('pool').pool;
  }
  get attempt() {
    return this.#details('attempt').attempt;
  }
  get workerId() {
    return this.#details('workerId').worker;
  }
  /** Whether the request was cancelled (by its caller, a timeout, the pool). */
  get cancelled() {
    if (this.#closed || this.#sawCancel || this.#controller?.signal.aborted) return true;
    // Kept once seen: the request leaves the addon when the handler ends
    // (asking the addon at every end would cost each ask a call).
    this.#sawCancel = this.#node._request(this.#request, 'isCancelled') ?? false;
    return this.#sawCancel;
  }
  /** Aborts when the request is cancelled. */
  get signal() {
    if (!this.#controller) {
      this.#controller = new AbortController();
      if (this.#closed) {
        this.#controller.abort(closedReason());
      } else if (this.#node._watch(this.#request, this.#controller) === undefined) {
        this.#controller.abort(new AskCancelledError('ask cancelled: the request already ended'));
      } else if (this.#node._request(this.#request, 'isCancelled')) {
        // Cancelled before the signal existed: aborted now, as `cancelled`
        // already says, not at the next drain.
        this.#controller.abort(new AskCancelledError('ask cancelled'));
      }
    }
    return this.#controller.signal;
  }
  /** Reports progress to the caller (a PARTIAL stage). */
  progress(fraction, note = '') {
    if (typeof fraction !== 'number') {
      throw new InvalidArgumentError(
        `invalid argument: progress must be a fraction from 0 to 1, got ${typeof fraction}`,
      );
    }
    if (this.#ended) throw contextEnded('progress()');
    if (this.#closed) return;
    this.#node._request(this.#request, 'progress', fraction, String(note));
  }
  /** @internal */
  _end() {
    this.#request = -1;
    this.#ended = true;
  }
  /** @internal The node is closing: keep the details, end as cancelled. */
  _close() {
    if (this.#ended) return;
    try {
      this.#details('requestId');
    } catch {
      // The details stay unknown; the request is ending anyway.
    }
    this.#closed = true;
    this.#controller?.abort(closedReason());
  }
}

// The node and state of a Pool, or undefined for anything else (read
// through the brand check, which no getter or Proxy trap can fake).
let poolState;

/** A pool hosted by a node. */
class Pool {
  #node;
  #id;
  // The addon reuses a closed pool's id for the next pool: a closed Pool
  // must never pass its id again.
  #closed = false;
  static {
    poolState = (p) => (#node in p ? { node: p.#node, closed: p.#closed } : undefined);
  }
  /** @internal */
  constructor(node, id, name) {
    this.#node = node;
    this.#id = id;
    this.name = name;
    Object.freeze(this);
  }
  /** Runs `handler(msg, ctx)` for each request; its (awaited) return value is the reply. */
  handle(handler) {
    if (typeof handler !== 'function') {
      throw new InvalidArgumentError('invalid argument: a handler must be a function');
    }
    if (this.#closed) {
      throw new FailedPreconditionError(`failed precondition: pool ${JSON.stringify(this.name)} is closed`);
    }
    this.#node._handle(this.#id, handler);
    return this;
  }
  /**
   * This pool's counters (its entry of `node.stats().pools`).
   * FailedPreconditionError once the pool or its node is closed.
   */
  stats() {
    const stats = this.#closed ? undefined : this.#node.stats().pools.find((p) => p.name === this.name);
    if (stats === undefined) {
      throw new FailedPreconditionError(`failed precondition: pool ${JSON.stringify(this.name)} is closed`);
    }
    return stats;
  }
  /** Stops the pool: new asks get NO_ROUTE, queued requests are cancelled. Closing it again does nothing. */
  close() {
    if (this.#closed) return;
    this.#closed = true;
    this.#node._closePool(this.#id);
  }
}

// An outcome in flight (`result`, awaitable as the handle itself) and the
// stage stream of the asks it makes.
class Staged {
  #node;
  #stream;
  #iterating = false;
  /** @internal */
  constructor(node, stream, result) {
    this.#node = node;
    this.#stream = stream;
    this.result = result;
  }
  then(onFulfilled, onRejected) {
    return this.result.then(onFulfilled, onRejected);
  }
  catch(onRejected) {
    return this.result.catch(onRejected);
  }
  finally(onFinally) {
    return this.result.finally(onFinally);
  }
  /** The ACK stages (SENT, RECEIVED, READ, PARTIAL..., a terminal one). */
  stages() {
    if (this.#iterating) {
      throw new InvalidArgumentError(`invalid argument: stages() can be read once per ${this.constructor.name}`);
    }
    this.#iterating = true;
    observed(this.result);
    // Refused before anything was sent (an aborted signal, a closed node):
    // an ask with no stages.
    if (this.#stream < 0) return noStages();
    unreadStreams.unregister(this);
    return this.#node._stages(this.#stream);
  }
}

// The outcome is observed another way (a cancel, the stages, whose last is
// the terminal one): a failure before anyone awaits the handle is not an
// unhandled rejection (which ends the process). It still rejects for
// whoever awaits it.
function observed(result) {
  result.catch(() => {});
}

/** One ask in flight, with its request id, `cancel()` and `stages()`. */
class AskHandle extends Staged {
  #node;
  #task;
  /** @internal */
  constructor(node, task, ids, stream, result) {
    super(node, stream, result);
    this.#node = node;
    this.#task = task;
    this.requestId = typeof ids.requestId === 'string' ? ids.requestId : '';
    this.correlationId = typeof ids.correlationId === 'string' ? ids.correlationId : '';
  }
  /** Cancels the ask: it rejects with AskCancelledError and the pool is told. */
  cancel() {
    // The caller asked for that rejection.
    observed(this.result);
    this.#node._cancel(this.#task, this.result);
  }
}

async function* noStages() {}

/**
 * A durable ask in flight: its promise id, its outcome, and `stages()`:
 * those of the asks it makes, one after another (none when the store had
 * the outcome).
 */
class DurableAsk extends Staged {
  /** @internal */
  constructor(node, id, stream, result) {
    super(node, stream, result);
    this.id = id;
    // Its outcome is kept in its promise (`awaitDurable(id)` reads it, after
    // a restart too), and a close ends it on purpose: left unawaited, it is
    // no unhandled rejection. `result` still rejects for whoever awaits it.
    observed(result);
  }
}

function promiseOf(info) {
  return {
    id: info.id,
    state: info.state,
    param: decode(info.param),
    value: decode(info.value),
    timeoutAt: info.timeoutAt,
    createdAt: info.createdAt,
    settledAt: info.settledAt ?? undefined,
  };
}

// A promise id as given: String(undefined) would make a promise named
// "undefined" (as for pool names).
function promiseId(id) {
  if (typeof id !== 'string') {
    throw new InvalidArgumentError('invalid argument: a promise id is a string');
  }
  return wellFormed(id, 'a promise id');
}

/** Durable promises: create, get, resolve, reject, cancel, prune, await. */
class DurablePromises {
  #core;
  /** @internal */
  constructor(core) {
    this.#core = core;
  }
  create(id, options = {}) {
    const timeoutMs = options?.timeoutMs ?? 3_600_000;
    return promiseOf(
      call(() =>
        this.#core.promiseCreate(
          promiseId(id),
          timeoutMs,
          encodeArg(options?.param, 'a promise param'),
          typed(options?.key, 'string', 'key'),
        ),
      ),
    );
  }
  get(id) {
    return promiseOf(call(() => this.#core.promiseGet(promiseId(id))));
  }
  resolve(id, value, options = {}) {
    return this.#complete(id, 'resolve', value, options);
  }
  reject(id, value, options = {}) {
    return this.#complete(id, 'reject', value, options);
  }
  cancel(id, value, options = {}) {
    return this.#complete(id, 'cancel', value, options);
  }
  #complete(id, how, value, options) {
    return promiseOf(
      call(() =>
        this.#core.promiseComplete(
          promiseId(id),
          how,
          encodeArg(value, 'a promise value'),
          typed(options?.key, 'string', 'key'),
        ),
      ),
    );
  }
  /**
   * Deletes the promises settled more than `olderThanMs` ago (after timing
   * out the pending ones past their timeout); returns how many.
   */
  prune(options) {
    return call(() => this.#core.promisePrune(options?.olderThanMs));
  }
  /**
   * Waits until the promise settles (looking at the store every `pollMs`);
   * resolves to it. `timeoutMs`: AskTimeoutError after that long; `signal`:
   * AskCancelledError (its reason as the cause) once aborted.
   */
  async await(id, options = {}) {
    const o = snapshot(options, ['pollMs', 'timeoutMs', 'signal']);
    const every = positiveMillis(o.pollMs, 'pollMs') ?? 10;
    const limit = positiveMillis(o.timeoutMs, 'timeoutMs');
    const signal = o.signal;
    if (signal !== undefined && !isSignal(signal)) {
      throw new InvalidArgumentError('invalid argument: signal must be an AbortSignal');
    }
    const until = limit === undefined ? Infinity : Date.now() + limit;
    for (;;) {
      if (signal?.aborted) throw waitAborted(signal);
      const p = this.get(id);
      if (p.state !== 'PENDING') return p;
      const left = until - Date.now();
      if (left <= 0) {
        throw new AskTimeoutError(`ask timeout: promise ${JSON.stringify(id)} still pending after ${limit} ms`);
      }
      await pause(Math.min(every, left), signal);
    }
  }
}

// Nodes with asks pending (held strongly while busy, see Node.#hold).
const busy = new Set();
// A collected node's keep-alive timer goes with it.
const timers = new FinalizationRegistry((timer) => clearInterval(timer));

// A handle nobody read the stages of: close its stream when it is collected.
const unreadStreams = new FinalizationRegistry(({ stream, core }) => {
  core.dropStream(stream);
});

class Node {
  #core;
  // The core's number for the plain-function hot path (native.fast*).
  #fast;
  #table = new ObjectTable();
  #buf = new Uint32Array(EVENTS * 4);
  #waiting = [];
  #handlers = [];
  #requests = [];
  #streamReaders = new Map();
  #poolRefs = new Map();
  #outstanding = 0;
  #keepAlive = null;
  #draining = false;
  #dirty = false;
  #drainQueued = false;
  #failedDrains = 0;
  #drainNow = () => this.#drainSafely();
  #closed = false;
  #promises;

  /**
   * @param {object} [options] defaultTimeoutMs, dlqCapacity, trackStages,
   *   breaker, reconcileCapacity, processingTimeoutMs, maxPayloadBytes
   */
  constructor(options = {}) {
    // The addon holds its wake callback strongly: through a WeakRef it does
    // not keep this node (and so the addon's own state) from being collected.
    const weak = new WeakRef(this);
    const wake = () => weak.deref()?._wake();
    const given = snapshot(options, NODE_OPTIONS);
    this.#core = call(() => new native.Core(wake, given));
    this.#fast = this.#core.fastPath();
  }

  /** Declares a pool hosted by this node. */
  pool(name, options = {}) {
    // String(undefined) would name a pool "undefined" that no ask could mean.
    if (typeof name !== 'string') {
      throw new InvalidArgumentError('invalid argument: a pool name is a string');
    }
    wellFormed(name, 'a pool name');
    const given = snapshot(options, POOL_OPTIONS);
    const id = call(() => this.#core.createPool(name, given));
    return new Pool(this, id, name);
  }

  /** Asks `pool` with `msg`; resolves to the handler's reply (the same object). */
  ask(pool, msg, options) {
    if (options === undefined) {
      return this.#start(pool, msg, undefined, 0);
    }
    return this.#start(pool, msg, options, 0).result;
  }

  /** Like `ask`, returning an AskHandle (`requestId`, `cancel()`, `stages()`, `result`). */
  askHandle(pool, msg, options = {}) {
    const started = this.#start(pool, msg, options ?? NO_OPTIONS, 1);
    return this.#handleOf(started);
  }

  // The AskHandle of a started ask ({ task, result }), or of one refused
  // before it started (task -1: the ids it was given, no stages).
  #handleOf(started) {
    if (started.task < 0) {
      const requestId = started.requestId ?? '';
      const correlationId = started.correlationId ?? requestId;
      return new AskHandle(this, -1, { requestId, correlationId }, -1, started.result);
    }
    const ids = {
      requestId: this.#core.requestId(started.task),
      correlationId: this.#core.correlationId(started.task),
    };
    // null: a dead tell's replay, which has no stages to read.
    const stream = this.#core.openStages(started.task) ?? -1;
    const handle = new AskHandle(this, started.task, ids, stream, started.result);
    if (stream >= 0) unreadStreams.register(handle, { stream, core: this.#core }, handle);
    return handle;
  }

  /** A one-way message; resolves to its request id once the pool accepted it. */
  tell(pool, msg, options = {}) {
    return this.#start(pool, msg, options ?? NO_OPTIONS, 2).result;
  }

  /** Opens (or creates) the SQLite file durable asks and promises live in. */
  openPromises(path, options = {}) {
    const file = storePath(path);
    call(() => this.#core.openPromises(file, options?.timeoutMs));
    return this;
  }

  /**
   * An ask recorded as a durable promise (its id is the request id): after
   * a restart, `awaitDurable(id)` on a node opened on the same file answers
   * from the promise, or asks again. Message and reply are stored as JSON.
   */
  askDurable(pool, msg, options = {}) {
    let given;
    let task;
    try {
      const name = wellFormed(this.#poolName(pool), 'a pool name');
      given = typed(options?.id, 'string', 'id');
      const bytes = encodeArg(msg, "a durable ask's message");
      const slot = this.#table.put(msg);
      task = call(() => this.#core.askDurable(name, slot, bytes, given));
    } catch (e) {
      this.#schedule();
      return new DurableAsk(this, given ?? '', -1, Promise.reject(e));
    }
    return this.#durableAsk(task);
  }

  /** The outcome of the durable ask `id` (stored, or asked again if pending). */
  awaitDurable(id) {
    let task;
    try {
      task = call(() => this.#core.awaitDurable(promiseId(id)));
    } catch (e) {
      return Promise.reject(e);
    }
    return this.#await(task, undefined, false);
  }

  /**
   * As `awaitDurable`, as a DurableAsk: its id, its outcome, and the stages
   * of the ask it makes again (none when the promise has settled).
   */
  resumeDurable(id) {
    let task;
    try {
      task = call(() => this.#core.awaitDurable(promiseId(id)));
    } catch (e) {
      return new DurableAsk(this, typeof id === 'string' ? id : '', -1, Promise.reject(e));
    }
    return this.#durableAsk(task);
  }

  #durableAsk(task) {
    const id = this.#core.requestId(task);
    const stream = this.#core.openStages(task);
    const handle = new DurableAsk(this, id, stream, this.#await(task, undefined, false));
    unreadStreams.register(handle, { stream, core: this.#core }, handle);
    return handle;
  }

  /** Durable promises in the file opened by `openPromises`. */
  get promises() {
    this.#promises ??= new DurablePromises(this.#core);
    return this.#promises;
  }

  /** The dead-letter queue, oldest first. */
  deadLetters() {
    return call(() => this.#core.deadLetters()).map((l) => ({
      requestId: l.requestId,
      correlationId: l.correlationId,
      pool: l.pool,
      // A resumed durable ask's message exists only as its stored JSON.
      payload: l.payloadJson == null ? this.#table.get(l.payload) : decode(l.payloadJson),
      error: fromInfo(l.error),
      attempts: l.attempts,
      reason: l.reason,
      kind: l.kind,
    }));
  }

  /**
   * Sends a dead letter again, with its request id, as what it was; an
   * AskHandle, as `askHandle` gives (awaited, an ask's resolves like `ask`,
   * a tell's like `tell`: to its request id once its pool accepted it).
   */
  replayDeadLetter(requestId) {
    let task;
    try {
      if (typeof requestId !== 'string') {
        throw new InvalidArgumentError('invalid argument: a request id is a string');
      }
      task = call(() => this.#core.replayDeadLetter(requestId));
    } catch (e) {
      return this.#handleOf({ task: -1, result: Promise.reject(e), requestId });
    }
    // `true`: a tell's replay resolves to its request id, as `tell` does.
    return this.#handleOf({ task, result: this.#await(task, undefined, true) });
  }

  /** Empties the dead-letter queue; returns how many letters it held. */
  purgeDeadLetters() {
    const n = call(() => this.#core.purgeDeadLetters());
    this.#schedule();
    return n;
  }

  /** Drops cached replies whose TTL passed. */
  evictExpired() {
    call(() => this.#core.evictExpired());
    this.#schedule();
  }

  /** Counters, for tests and dashboards. */
  stats() {
    const s = call(() => this.#core.stats());
    s.objects = this.#table.live;
    s.outstanding = this.#outstanding;
    return s;
  }

  get closed() {
    return this.#closed;
  }

  /** This node's caller id: requests are deduplicated per caller id and request id. */
  get callerId() {
    return this.#core.callerId();
  }

  /** Shuts down: pending asks reject with UnavailableError, pools close. */
  async close() {
    if (this.#closed) return;
    this.#closed = true;
    // Handlers still running see their request cancelled (not gone).
    for (const r of this.#requests) r?.ctx._close();
    call(() => this.#core.close());
    // Settle what the close ended (pending asks, reads): now, or, when
    // called from inside a drain (a handler's body, a ctx.signal abort
    // listener), by that drain, which a drain here would skip.
    if (this.#draining) this.#dirty = true;
    else this.#drainSafely();
    // Durable asks the close ended still settle on the runtime's threads:
    // the keep-alive goes once they did (#idle), not before.
    if (this.#outstanding > 0) return;
    busy.delete(this);
    if (this.#keepAlive) {
      clearInterval(this.#keepAlive);
      timers.unregister(this);
      this.#keepAlive = null;
    }
  }

  // Routing is by name, so a Pool stands for its name only while it is this
  // node's and open: another node's Pool, or a closed one whose name a new
  // pool took, would silently reach a pool the caller never meant.
  #poolName(pool) {
    if (typeof pool === 'string') return pool;
    const state = typeof pool === 'object' && pool !== null ? poolState(pool) : undefined;
    if (state === undefined) {
      throw new InvalidArgumentError(
        `invalid argument: a pool is a name (a string) or a Pool of this node, not ${kindOf(pool)}`,
      );
    }
    if (state.node !== this) {
      throw new InvalidArgumentError(
        `invalid argument: Pool ${JSON.stringify(pool.name)} belongs to another node: ` +
          'ask it through that node, or name the pool',
      );
    }
    // Once the node closed, every ask is UNAVAILABLE, as by name.
    if (state.closed && !this.#closed) {
      throw new NoRouteError(
        `no route to pool ${JSON.stringify(pool.name)}: this Pool was closed ` +
          '(a pool declared since under its name is another pool: ask that one by name or through its Pool)',
      );
    }
    return pool.name;
  }

  // Taken right before the addon call that uses it: a scratch reference
  // stands for its name only until the next poolRef call, which an option
  // getter or a Proxy message's trap could make (asking another name).
  #ref(name) {
    let r = this.#poolRefs.get(name);
    if (r === undefined) {
      // Checked here, once per name the cache does not hold yet.
      wellFormed(name, 'a pool name');
      r = this.#core.poolRef(name);
      // The addon gives at most 1,024 names a reference of their own; any
      // other name gets one that stands for it only until the next call
      // (the ask right after this), so it is not kept.
      if (r !== SCRATCH_REF) this.#poolRefs.set(name, r);
    }
    return r;
  }

  // kind: 0 ask (returns the promise itself when options are absent), 1
  // askHandle, 2 tell. Returns { task, result } otherwise.
  // The message enters the object table last, right before the addon call
  // that takes it: a throw before (an option refused, a getter's throw)
  // leaves nothing there.
  #start(pool, msg, options, kind) {
    let signal;
    let o;
    let task;
    try {
      askOptions(options);
      signal = options?.signal ?? undefined;
      if (signal !== undefined && !isSignal(signal)) {
        throw new InvalidArgumentError('invalid argument: signal must be an AbortSignal');
      }
      const name = this.#poolName(pool);
      // An ask with no options and no bytes takes the fast path, which
      // reads none.
      const fast = kind !== 2 && options === undefined && !isBytes(msg);
      if (!fast) o = nativeAskOptions(options ?? NO_OPTIONS, msg, kind === 2);
      // After the options are read: an ask refused for its signal still
      // has the request id it was given, and reading them ran the caller's
      // code (a getter, a Proxy trap), which may have aborted the signal
      // (its listener is added after the ask is sent and would never fire).
      if (signal?.aborted) throw aborted(signal);
      const ref = this.#ref(name);
      const slot = this.#table.put(msg);
      if (kind === 2) task = call(() => this.#core.tell(ref, slot, o));
      else if (fast) task = call(() => native.fastAsk(this.#fast, ref, slot, 0));
      else task = call(() => this.#core.askWith(ref, slot, o));
    } catch (e) {
      this.#schedule();
      const result = Promise.reject(e);
      return options === undefined
        ? result
        : { task: -1, result, requestId: o?.requestId, correlationId: o?.correlationId };
    }
    const result = this.#await(task, signal, kind === 2);
    return options === undefined ? result : { task, result };
  }

  #await(task, signal, tell) {
    const entry = { resolve: null, reject: null, signal, onAbort: null, aborted: false, tell };
    const result = new Promise((resolve, reject) => {
      entry.resolve = resolve;
      entry.reject = reject;
    });
    if (tell) entry.requestId = this.#core.requestId(task);
    if (signal) {
      entry.onAbort = () => {
        entry.aborted = true;
        this._cancel(task, result);
      };
      watchSignal(signal, entry);
    }
    entry.result = result;
    this.#waiting[task] = entry;
    if (this.#outstanding++ === 0) this.#hold();
    this.#schedule();
    return result;
  }

  // A referenced timer keeps the process alive while asks are pending; the
  // addon's threadsafe function is weak, so an idle node lets it exit.
  // While busy the node is also held strongly, so that a node dropped with
  // asks pending is not collected under them.
  #hold() {
    busy.add(this);
    if (this.#keepAlive === null) {
      this.#keepAlive = setInterval(() => {}, 1 << 30);
      timers.register(this, this.#keepAlive, this);
    } else {
      this.#keepAlive.ref();
    }
  }

  #idle() {
    busy.delete(this);
    this.#keepAlive?.unref();
  }

  /** @internal Called by the addon when a future woke on another thread. */
  _wake() {
    this.#drainSafely();
  }

  // A drain run from the event loop (a wake, a microtask, close): a failure
  // there has nobody to throw to, so it becomes a process warning.
  // What a failed drain did not report is still queued in the addon, so it
  // is tried again soon (a few times in a row at most: a drain that keeps
  // failing must not spin; the next wake or call tries again).
  #drainSafely() {
    try {
      this.#drain();
      this.#failedDrains = 0;
    } catch (e) {
      warn('a drain failed', e);
      if (++this.#failedDrains <= 3) setImmediate(this.#drainNow);
    }
  }

  // After a call into the addon that may have woken a future on this thread
  // (those wakes do not call back): drain soon, or, while draining, once more.
  #schedule() {
    if (this.#draining) {
      this.#dirty = true;
    } else if (!this.#drainQueued) {
      this.#drainQueued = true;
      queueMicrotask(this.#drainNow);
    }
  }

  #drain() {
    this.#drainQueued = false;
    if (this.#draining) return;
    this.#draining = true;
    let n;
    try {
      n = native.fastDrain(this.#fast, this.#buf);
    } catch (e) {
      this.#draining = false;
      throw e;
    }
    this.#consume(n);
  }

  // Dispatches `n` events already in the buffer, and drains again while the
  // buffer came back full or a dispatched event called into the addon.
  // Entered with #draining set.
  #consume(n) {
    try {
      const fast = this.#fast;
      const buf = this.#buf;
      for (;;) {
        this.#dirty = false;
        for (let i = 0; i < n * 4; i += 4) {
          try {
            this.#dispatch(buf[i], buf[i + 1], buf[i + 2], buf[i + 3]);
          } catch (e) {
            // One event's failure must not drop the others of the batch.
            warn('an event could not be dispatched', e);
          }
        }
        if (n < EVENTS && !this.#dirty) break;
        n = native.fastDrain(fast, buf);
      }
    } finally {
      this.#draining = false;
    }
    if (this.#outstanding === 0) this.#idle();
  }

  #dispatch(kind, a, b, c) {
    switch (kind) {
      case FREE:
        this.#table.release(a);
        return;
      case ASK_OK: {
        const entry = this.#settle(a);
        entry.resolve(this.#table.get(b));
        return;
      }
      case ASK_ERR: {
        const entry = this.#settle(a);
        const info = this.#core.error(b);
        // Cancelled by its signal: the signal's reason is the cause, as
        // when the signal was aborted before the ask.
        const cause = entry.aborted && info.code === 'ASK_CANCELLED' ? { cause: entry.signal.reason } : undefined;
        entry.reject(fromInfo(info, cause));
        return;
      }
      case TELL_OK: {
        const entry = this.#settle(a);
        entry.resolve(entry.requestId);
        return;
      }
      case REQUEST:
        this.#run(a, this.#table.get(b), c & ~DURABLE, (c & DURABLE) !== 0);
        return;
      case REQUEST_BYTES:
        this.#run(a, decode(this.#core.bytes(b)), c & ~DURABLE, true);
        return;
      case ASK_OK_BYTES: {
        const entry = this.#settle(a);
        entry.resolve(decode(this.#core.bytes(b)));
        return;
      }
      case STAGE:
        this.#streamReaders.get(a)?.(this.#core.stage(b));
        return;
      case STAGE_END: {
        const reader = this.#streamReaders.get(a);
        this.#streamReaders.delete(a);
        reader?.(null);
        return;
      }
      case CANCELLED: {
        const request = this.#requests[a];
        request?.controller?.abort(new AskCancelledError('ask cancelled'));
        return;
      }
      default:
        throw new Error(`askpool: unknown event ${kind}`);
    }
  }

  #settle(task) {
    const entry = this.#waiting[task];
    this.#waiting[task] = undefined;
    this.#outstanding--;
    if (entry.onAbort) unwatchSignal(entry.signal, entry);
    return entry;
  }

  #run(request, msg, pool, durable) {
    const ctx = new Context(this, request);
    this.#requests[request] = { ctx, controller: null, durable };
    let reply;
    try {
      // Called as a plain function (`this` undefined), not as a method of
      // the handler table: an unbound method must not reach the table.
      const handler = this.#handlers[pool];
      reply = handler(msg, ctx);
      // A `then` that throws (or a getter of it, or a revoked proxy) fails
      // the request like a throw; if it answered first, that answer stands.
      if (reply !== null && typeof reply === 'object' && typeof reply.then === 'function') {
        reply.then(
          (value) => this.#answer(request, value, false),
          (e) => this.#answer(request, e, true),
        );
        return;
      }
    } catch (e) {
      this.#fail(request, e);
      return;
    }
    this.#reply(request, reply);
  }

  // The answer of an async handler, sent from a promise reaction: a failure
  // here would be an unhandled rejection, so it becomes a warning.
  #answer(request, value, failed) {
    try {
      if (failed) this.#fail(request, value);
      else this.#reply(request, value);
    } catch (e) {
      warn("a handler's answer could not be sent", e);
    }
  }

  // The request's record, taken; undefined if it was already answered (a
  // thenable that calls back twice: the first answer stands).
  #end(request) {
    const r = this.#requests[request];
    if (r === undefined) return undefined;
    this.#requests[request] = undefined;
    r.ctx._end();
    return r;
  }

  #reply(request, value) {
    const r = this.#end(request);
    if (r === undefined || this.#closed) return;
    const { durable } = r;
    if (durable) {
      let bytes;
      try {
        bytes = encode(value);
      } catch (e) {
        const [, name, message] = describeThrown(e);
        this.#core.fail(request, null, name, `the reply of a durable ask must be JSON: ${message}`);
        this.#schedule();
        return;
      }
      this.#core.replyBytes(request, this.#table.put(value), bytes);
      this.#schedule();
      return;
    }
    const slot = this.#table.put(value);
    if (this.#draining) {
      this.#core.reply(request, slot);
      this.#dirty = true;
      return;
    }
    // Reply and drain in one call: the ask this answers resolves right here.
    this.#drainQueued = false;
    this.#draining = true;
    let n;
    try {
      n = native.fastReplyDrain(this.#fast, request, slot, this.#buf);
    } catch (e) {
      this.#draining = false;
      this.#schedule();
      throw e;
    }
    this.#consume(n);
  }

  #fail(request, thrown) {
    const r = this.#end(request);
    if (r === undefined || this.#closed) return;
    if (gaveUp(r.controller?.signal, thrown)) {
      this.#core.giveUp(request);
    } else {
      const [code, name, message] = describeThrown(thrown);
      this.#core.fail(request, code, name, message);
    }
    this.#schedule();
  }

  /** @internal */
  _request(request, method, ...args) {
    if (request < 0) return undefined;
    return call(() => this.#core[method](request, ...args));
  }

  /** @internal */
  _watch(request, controller) {
    const r = this.#requests[request];
    if (request < 0 || !r) return undefined;
    r.controller = controller;
    call(() => this.#core.watchCancel(request));
    this.#schedule();
    return true;
  }

  /** @internal */
  _handle(pool, handler) {
    if (this.#closed) throw new UnavailableError('unavailable: node closed');
    call(() => this.#core.handle(pool));
    this.#handlers[pool] = handler;
    this.#schedule();
  }

  /** @internal */
  _closePool(pool) {
    // Every pool closed with the node, and its id maybe reused since.
    if (this.#closed) return;
    call(() => this.#core.closePool(pool));
    this.#schedule();
  }

  /** @internal */
  _cancel(task, result) {
    if (task < 0 || this.#waiting[task]?.result !== result) return;
    this.#core.cancel(task);
    this.#schedule();
  }

  /** @internal */
  _stages(stream) {
    const node = this;
    // Reads asked for and not answered yet, oldest first. The addon reads
    // one stage at a time: a next() called before the previous one settled
    // waits its turn, as with an async generator.
    const waiting = [];
    let reading = false;
    let done = false;
    const finish = () => {
      done = true;
      // Ended (or returned, which drops the stream): the addon may reuse
      // its number, which a late finalizer must not drop.
      unreadStreams.unregister(iterator);
      for (const resolve of waiting.splice(0)) resolve({ value: undefined, done: true });
    };
    const onStage = (stage) => {
      node.#outstanding--;
      reading = false;
      node.#streamReaders.delete(stream);
      if (stage === null) {
        finish();
        return;
      }
      waiting.shift()?.({ value: stage, done: false });
      if (waiting.length > 0) read();
    };
    const read = () => {
      reading = true;
      node.#streamReaders.set(stream, onStage);
      if (node.#outstanding++ === 0) node.#hold();
      node.#core.nextStage(stream);
      node.#schedule();
    };
    const iterator = {
      [Symbol.asyncIterator]() {
        return this;
      },
      next() {
        if (done) return Promise.resolve({ value: undefined, done: true });
        return new Promise((resolve) => {
          waiting.push(resolve);
          if (!reading) read();
        });
      },
      // Reads still waiting end now; one the addon is doing ends (and is
      // counted off) at the next drain.
      return() {
        if (!done) {
          finish();
          node.#core.dropStream(stream);
          node.#schedule();
        }
        return Promise.resolve({ value: undefined, done: true });
      },
    };
    // An iterator dropped before its end (not read through, no return()):
    // its stream closes when it is collected, as the handle's would.
    unreadStreams.register(iterator, { stream, core: node.#core }, iterator);
    return iterator;
  }
}

module.exports = { Node, Pool, AskHandle, Context, DurableAsk, DurablePromises };
