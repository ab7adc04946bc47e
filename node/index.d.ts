// Types of the askpool package (hand-written for the wrapper in lib/; the
// addon's own declarations are generated into native.d.ts). `cargo xtask
// test` checks both for drift: native.d.ts against a fresh build, this file
// against the wrapper's runtime exports, and compiles test/types/usage.ts
// with `tsc --strict`.

// Numeric options are checked before use: a negative, NaN, fractional (for
// counts) or out-of-range value throws (or rejects with) InvalidArgumentError.

export interface NodeOptions {
  /**
   * Timeout of an ask that sets none (default 30 000): milliseconds above 0
   * (an ask needs time for one attempt), at most 2^53 - 1.
   */
  defaultTimeoutMs?: number;
  /** Most dead letters kept (default 1 000). */
  dlqCapacity?: number;
  /** Record each ask's ACK stages (default true). */
  trackStages?: boolean;
  /** A circuit breaker per target pool (default true). */
  breaker?: boolean;
  /** Timed-out asks remembered for late outcomes (default 10 000). */
  reconcileCapacity?: number;
  /** Processing timeout of this node's pools (default 300 000). */
  processingTimeoutMs?: number;
  /**
   * Largest byte payload an ask, askHandle or tell may carry: an integer
   * number of bytes (default 16 777 216, 16 MiB); `null` lifts the bound.
   * Byte payloads (Buffer, Uint8Array and other typed arrays, DataView,
   * ArrayBuffer, SharedArrayBuffer) are sized by their `byteLength`: over
   * the bound the call rejects with OversizePayloadError (OVERSIZE_PAYLOAD)
   * and nothing is sent.
   * Other payloads (objects, strings, numbers) pass by reference and are not
   * sized, so this bound does not apply to them.
   */
  maxPayloadBytes?: number | null;
}

export interface PoolOptions {
  /** Requests handled at once: an integer from 1 to 65 536 (default 1). */
  concurrency?: number;
  /** Admitted, unfinished requests before BUFFER_FULL (default 10 000). */
  maxInFlight?: number;
  /**
   * Replies cached for duplicates (default 100 000). The cache holds each
   * reply object itself, by reference, until it is evicted; its bounds are
   * this count and `dedupTtlMs`, not bytes. A pool whose replies are large
   * (big Buffers, long arrays) keeps up to this many of them alive, each for
   * up to `dedupTtlMs`: give it a smaller `dedupMax` or `dedupTtlMs`. A
   * closed pool (or a closed node) lets go of its cached replies at once.
   */
  dedupMax?: number;
  /**
   * How long a reply stays cached, in milliseconds (default 120 000),
   * holding the reply object alive meanwhile (see `dedupMax`); 0 keeps
   * none, so a duplicate arriving after the reply runs the handler again.
   */
  dedupTtlMs?: number;
  processingTimeoutMs?: number;
}

export interface AskOptions {
  /**
   * The ask's timeout (default: the node's `defaultTimeoutMs`): milliseconds
   * above 0 (0 would leave no time for one attempt), at most 2^53 - 1.
   */
  timeoutMs?: number;
  /**
   * Aborting it cancels the ask (a protocol cancel reaches the pool): it
   * rejects with AskCancelledError whose `cause` is the signal's `reason`.
   * One signal may serve any number of asks.
   */
  signal?: AbortSignal;
  /** Route to this worker (`w0`, `w1`, ...) while it lives. */
  preferredWorker?: string;
  /** 32 hex digits: reuse to be deduplicated across caller restarts. */
  requestId?: string;
  /** 32 hex digits, propagated unchanged to the handler. */
  correlationId?: string;
  /** 32 hex digits: the request that caused this one (`ctx.causationId`). */
  causationId?: string;
  /** Total sends, the first included (default 4). */
  maxAttempts?: number;
  /**
   * Guards a reused `requestId` against another payload: the pool refuses a
   * request whose fingerprint differs from the one that first used the id
   * (PayloadMismatchError). A string (hashed as UTF-8) or bytes (a typed
   * array, DataView, ArrayBuffer or SharedArrayBuffer). Byte payloads are
   * fingerprinted by themselves when this is absent and a `requestId` is
   * given; any other payload (an object, a string, a number) is checked only
   * with an explicit fingerprint. Bytes whose ArrayBuffer was detached
   * (transferred) have none to fingerprint: InvalidArgumentError, as for a
   * fingerprint of any other type.
   */
  fingerprint?: string | ArrayBufferView | ArrayBuffer | SharedArrayBuffer;
}

/**
 * A tell's options: an ask's, but for `preferredWorker` (a tell has none).
 * `correlationId` and `causationId` reach the handler as on an ask.
 */
export interface TellOptions extends Omit<AskOptions, 'signal' | 'preferredWorker'> {
  /**
   * Aborted before the tell is sent, it rejects with AskCancelledError and
   * nothing is sent; aborted while the tell waits for the pool to accept it
   * (a pool that refuses it with BUFFER_FULL is asked again until the
   * timeout or `maxAttempts`), the tell is cancelled and rejects the same
   * way, the signal's `reason` as its `cause`. Once the pool accepted it
   * the tell stands (its promise resolves): a later abort changes nothing.
   * One signal may serve any number of tells and asks.
   */
  signal?: AbortSignal;
}

export type AckStage =
  | 'SENT'
  | 'RECEIVED'
  | 'READ'
  | 'PARTIAL'
  | 'FULFILLED'
  | 'REJECTED'
  | 'FAILED'
  | 'TIMED_OUT';

export interface StageEvent {
  stage: AckStage;
  sinceSentMs: number;
  sincePreviousMs: number;
  fraction?: number;
  note?: string;
}

export type ErrorCode =
  | 'UNAVAILABLE'
  | 'DEADLINE_EXCEEDED'
  | 'ASK_TIMEOUT'
  | 'BUFFER_FULL'
  | 'NO_ROUTE'
  | 'INVALID_ARGUMENT'
  | 'VALIDATION_ERROR'
  | 'PAYLOAD_MISMATCH'
  | 'PERMISSION_DENIED'
  | 'OVERSIZE_PAYLOAD'
  | 'FAILED_PRECONDITION'
  | 'DECODE_FAILURE'
  | 'INTERNAL'
  | 'ASK_CANCELLED'
  | 'HANDLER_FAILED';

/** TRANSIENT: retrying may help; PERMANENT: it will not; POISON: dead-lettered. */
export type ErrorClass = 'TRANSIENT' | 'PERMANENT' | 'POISON';
export class AskError extends Error {
  readonly code: ErrorCode;
  /** The code's class in the taxonomy. */
  readonly errorClass: ErrorClass;
  static readonly code: ErrorCode;
  static readonly errorClass: ErrorClass;
  constructor(message?: string, options?: { cause?: unknown });
}
export class UnavailableError extends AskError {}
export class DeadlineExceededError extends AskError {}
export class AskTimeoutError extends AskError {}
export class BufferFullError extends AskError {}
export class NoRouteError extends AskError {}
export class InvalidArgumentError extends AskError {}
export class ValidationError extends AskError {}
export class PayloadMismatchError extends AskError {}
export class PermissionDeniedError extends AskError {}
export class OversizePayloadError extends AskError {}
export class FailedPreconditionError extends AskError {}
export class DecodeFailureError extends AskError {}
export class InternalError extends AskError {}
export class AskCancelledError extends AskError {}
/** The handler threw: what it threw is in `handlerName` and `handlerMessage`. */
export class HandlerFailedError extends AskError {
  readonly handlerName: string;
  readonly handlerMessage: string;
  constructor(
    message?: string,
    options?: { cause?: unknown; handlerName?: string; handlerMessage?: string },
  );
}
export const errorCodes: readonly ErrorCode[];

/**
 * What a handler gets besides the message; valid while the handler runs.
 * Once the handler ended (returned, threw, or its promise settled), the id
 * getters and `progress()` throw `FailedPreconditionError` ("the context of
 * a request ended with its handler"), whether or not they were read before:
 * keep an id you need later while the handler runs
 * (`const id = ctx.requestId`). `cancelled` and `signal` still answer.
 */
export class Context {
  private constructor();
  /** @throws {FailedPreconditionError} once the handler ended (as every id getter). */
  readonly requestId: string;
  readonly correlationId: string;
  /** The request that caused this one, if its caller named it. */
  readonly causationId: string | undefined;
  readonly pool: string;
  readonly attempt: number;
  readonly workerId: string;
  /**
   * True once the request is cancelled, and once the node closed. After
   * the handler ended (its request answered), true only if it had seen its
   * cancel (here or through `signal`) or the node closed.
   */
  readonly cancelled: boolean;
  /**
   * Aborts when the request is cancelled (caller cancel, timeout, pool or
   * node close); read first after the handler ended, it is already aborted.
   */
  readonly signal: AbortSignal;
  /**
   * Reports progress to the caller (a PARTIAL stage): `fraction` is clamped
   * to 0..1 (NaN, an infinity or a non-number is InvalidArgumentError), as in Python and
   * Kotlin; a `note` past 4096 UTF-8 bytes is InvalidArgumentError too (the
   * caller keeps the newest reports of each ask). Does nothing once the node closed while
   * the handler runs; throws FailedPreconditionError once the handler ended.
   */
  progress(fraction: number, note?: string): void;
}

export type Handler<Msg, Reply> = (msg: Msg, ctx: Context) => Reply | PromiseLike<Reply>;

export class Pool<Msg = any, Reply = any> {
  #private;
  private constructor();
  readonly name: string;
  /**
   * Runs `handler` for each request; its (awaited) result is the reply.
   * Throws FailedPreconditionError once the pool is closed, and
   * UnavailableError once its node is.
   */
  handle(handler: Handler<Msg, Reply>): this;
  /** This pool's counters; FailedPreconditionError once it or its node is closed. */
  stats(): PoolStats;
  /** New asks get NO_ROUTE; queued requests are cancelled. Again: nothing. */
  close(): void;
}

export class AskHandle<Reply = any> implements PromiseLike<Reply> {
  private constructor();
  /** The ask's request id ('' for an ask refused before it had one). */
  readonly requestId: string;
  /** Its correlation id (the request id unless one was given). */
  readonly correlationId: string;
  readonly result: Promise<Reply>;
  then<A = Reply, B = never>(
    onFulfilled?: ((value: Reply) => A | PromiseLike<A>) | null,
    onRejected?: ((reason: unknown) => B | PromiseLike<B>) | null,
  ): Promise<A | B>;
  catch<B = never>(onRejected?: ((reason: unknown) => B | PromiseLike<B>) | null): Promise<Reply | B>;
  finally(onFinally?: (() => void) | null): Promise<Reply>;
  /**
   * Rejects the ask with AskCancelledError and cancels it at the pool. A
   * cancelled handle nobody awaits is no unhandled rejection.
   */
  cancel(): void;
  /**
   * The ask's ACK stages, once per handle; the last is the terminal one.
   * A handle read this way may fail before it is awaited without an
   * unhandled rejection (awaiting it later still rejects).
   */
  stages(): AsyncIterableIterator<StageEvent>;
}

export interface DeadLetter<Msg = unknown> {
  requestId: string;
  correlationId: string;
  pool: string;
  payload: Msg;
  error: AskError;
  attempts: number;
  reason: 'RETRIES_EXHAUSTED' | 'POISON';
  /** What was sent, and what its replay sends. */
  kind: 'ASK' | 'TELL';
}

export interface PoolStats {
  name: string;
  inFlight: number;
  queued: number;
  admitted: number;
  handlerRuns: number;
  /** Duplicates of a running request, answered with an Ack. */
  duplicateAcks: number;
  /** Duplicates of a finished request, answered from the reply cache. */
  replays: number;
  /** Replies dropped because their request was cancelled first. */
  suppressedReplies: number;
  rejectedFull: number;
  cancels: number;
  /** Running requests cancelled at their processing timeout. */
  expired: number;
  dedupInProgress: number;
  dedupTerminal: number;
}

export interface NodeStats {
  pending: number;
  armedTimers: number;
  retries: number;
  /** Outcomes that arrived after their ask timed out, reconciled once. */
  lateOutcomes: number;
  timedOutRecords: number;
  dlqDepth: number;
  /** Dead letters dropped because the queue was full. */
  dlqDropped: number;
  tasks: number;
  requests: number;
  streams: number;
  /** Wakes that came from another thread (tokio timers) and called into JS. */
  threadWakes: number;
  pools: PoolStats[];
  /** Host objects the addon still references. */
  objects: number;
  /** Asks, tells and stage reads awaiting the addon. */
  outstanding: number;
}

export type PromiseState = 'PENDING' | 'RESOLVED' | 'REJECTED' | 'CANCELED' | 'TIMED_OUT';

/** A durable promise; `param` and `value` are stored as JSON. */
export interface DurablePromise<P = unknown, V = unknown> {
  id: string;
  state: PromiseState;
  param: P;
  value: V | undefined;
  timeoutAt: number;
  createdAt: number;
  settledAt?: number;
}

export class DurablePromises {
  private constructor();
  create<P = unknown>(
    id: string,
    options?: { timeoutMs?: number; param?: P; key?: string },
  ): DurablePromise<P>;
  get<P = unknown, V = unknown>(id: string): DurablePromise<P, V>;
  resolve<V = unknown>(id: string, value?: V, options?: { key?: string }): DurablePromise<unknown, V>;
  reject<V = unknown>(id: string, value?: V, options?: { key?: string }): DurablePromise<unknown, V>;
  cancel<V = unknown>(id: string, value?: V, options?: { key?: string }): DurablePromise<unknown, V>;
  /**
   * Deletes the promises settled more than `olderThanMs` ago (after timing
   * out the pending ones past their timeout); returns how many. The store
   * keeps every promise until pruned: call this on a schedule.
   */
  prune(options: { olderThanMs: number }): number;
  /**
   * Resolves once the promise has settled, whichever way, looking at the
   * store every `pollMs` (default 10). `timeoutMs`: AskTimeoutError after
   * that long; `signal`: AskCancelledError once aborted. A duration that is
   * not a finite number above 0 is InvalidArgumentError.
   */
  await<P = unknown, V = unknown>(
    id: string,
    options?: { pollMs?: number; timeoutMs?: number; signal?: AbortSignal },
  ): Promise<DurablePromise<P, V>>;
}

/**
 * A durable ask in flight: its promise id (the request id) and its outcome.
 * The outcome is kept in the promise (`awaitDurable(id)` reads it, after a
 * restart too), so a durable ask left unawaited is no unhandled rejection
 * when it fails or its node closes; awaiting it still rejects.
 */
export class DurableAsk<Reply = any> implements PromiseLike<Reply> {
  private constructor();
  readonly id: string;
  readonly result: Promise<Reply>;
  then<A = Reply, B = never>(
    onFulfilled?: ((value: Reply) => A | PromiseLike<A>) | null,
    onRejected?: ((reason: unknown) => B | PromiseLike<B>) | null,
  ): Promise<A | B>;
  catch<B = never>(onRejected?: ((reason: unknown) => B | PromiseLike<B>) | null): Promise<Reply | B>;
  finally(onFinally?: (() => void) | null): Promise<Reply>;
  /**
   * The ACK stages of the asks it makes, once per handle: SENT to a
   * terminal stage for each (an ask made again after a transient failure
   * starts at SENT again), ending with its outcome. Empty when the store
   * already had the outcome, or while it only waits for an ask of the same
   * id made by another handle.
   */
  stages(): AsyncIterableIterator<StageEvent>;
}

/**
 * A pool to ask: its name, or a Pool of the node asking. Another node's
 * Pool (or any other object) is InvalidArgumentError; a Pool closed with
 * `pool.close()` is NoRouteError, even once a new pool took its name (ask
 * that one by name or through its own Pool).
 */
export type PoolRef = string | Pool;

export class Node {
  constructor(options?: NodeOptions);
  readonly closed: boolean;
  /** This node's caller id: requests are deduplicated per caller id and request id. */
  readonly callerId: string;
  pool<Msg = any, Reply = any>(name: string, options?: PoolOptions): Pool<Msg, Reply>;
  ask<Reply = any>(pool: PoolRef, msg: unknown, options?: AskOptions): Promise<Reply>;
  askHandle<Reply = any>(pool: PoolRef, msg: unknown, options?: AskOptions): AskHandle<Reply>;
  /** Resolves to the request id once the pool accepted the message. */
  tell(pool: PoolRef, msg: unknown, options?: TellOptions): Promise<string>;
  deadLetters<Msg = unknown>(): DeadLetter<Msg>[];
  /**
   * Sends a dead letter again with its ids, as what it was; a handle as
   * `askHandle` gives (awaited, an ask's resolves like `ask`, a tell's like
   * `tell`, to its request id, with no stages; FailedPreconditionError if
   * there is no such letter). A replay that fails puts the letter back (its pool is
   * gone: NO_ROUTE). Replaying a durable ask's letter records its outcome
   * in the ask's promise. Once the node is closed it rejects with
   * UnavailableError.
   */
  replayDeadLetter<Reply = any>(requestId: string): AskHandle<Reply>;
  purgeDeadLetters(): number;
  evictExpired(): void;
  /**
   * Opens (or creates) the SQLite file of durable asks and promises.
   * `timeoutMs`: how long a durable ask's promise stays pending at most
   * (default one hour); at least 1, else `InvalidArgumentError`. Once the
   * node is closed: UnavailableError, and no file is opened or made.
   */
  openPromises(path: string | URL, options?: { timeoutMs?: number }): this;
  /** An ask recorded as a durable promise; message and reply are stored as JSON. */
  askDurable<Reply = any>(pool: PoolRef, msg: unknown, options?: { id?: string }): DurableAsk<Reply>;
  /** The outcome of a durable ask by id: stored, or asked again if pending. */
  awaitDurable<Reply = any>(id: string): Promise<Reply>;
  /**
   * As `awaitDurable`, as a DurableAsk handle: its (canonical) id, its
   * outcome, and the stages of the ask it makes again (none when the
   * promise has settled).
   */
  resumeDurable<Reply = any>(id: string): DurableAsk<Reply>;
  /**
   * Durable promises in the file opened by `openPromises`; once the node is
   * closed, every call throws UnavailableError (`await` rejects with it).
   */
  readonly promises: DurablePromises;
  stats(): NodeStats;
  close(): Promise<void>;
}
