// Compiled (not run) by types.test.js with tsc --strict.
import {
  Node,
  AskError,
  AskTimeoutError,
  HandlerFailedError,
  type AskHandle,
  type Context,
  type StageEvent,
  type NodeStats,
  type PoolStats,
  type DeadLetter,
  type ErrorCode,
  type DurableAsk,
  type DurablePromise,
  type TellOptions,
} from '../../index.js';

interface Order {
  id: number;
  items: string[];
}
interface Receipt {
  orderId: number;
  total: number;
}

export async function usage(): Promise<void> {
  const node = new Node({ defaultTimeoutMs: 1_000, breaker: true });
  const pool = node.pool<Order, Receipt>('orders', { concurrency: 4, maxInFlight: 100 });
  pool.handle(async (order: Order, ctx: Context): Promise<Receipt> => {
    ctx.progress(0.5, `order ${order.id}`);
    if (ctx.signal.aborted || ctx.cancelled) throw new AskTimeoutError('gave up');
    const worker: string = ctx.workerId;
    void worker;
    const cause: string | undefined = ctx.causationId;
    void cause;
    return { orderId: order.id, total: order.items.length };
  });
  const controller = new AbortController();
  const receipt: Receipt = await node.ask<Receipt>(pool, { id: 1, items: [] }, {
    timeoutMs: 500,
    signal: controller.signal,
    preferredWorker: 'w0',
    requestId: '0123456789abcdef0123456789abcdef',
    correlationId: 'fedcba9876543210fedcba9876543210',
    causationId: '00000000000000000000000000000001',
    fingerprint: 'order-1',
  });
  await node.ask('orders', new Uint8Array([7]), { fingerprint: new Uint8Array([1, 2]) });
  const total: number = receipt.total;
  void total;

  const handle: AskHandle<Receipt> = node.askHandle<Receipt>('orders', { id: 2, items: ['a'] });
  const id: string = handle.requestId;
  const correlation: string = handle.correlationId;
  void id;
  void correlation;
  const callerId: string = node.callerId;
  void callerId;
  const failedCode: string | undefined = await node
    .askHandle('orders', { id: 9, items: [] })
    .catch((e: unknown) => (e instanceof AskError ? e.code : undefined));
  void failedCode;
  for await (const s of handle.stages()) {
    const e: StageEvent = s;
    if (e.stage === 'PARTIAL') void e.fraction;
  }
  handle.cancel();
  try {
    await handle;
  } catch (e) {
    if (e instanceof HandlerFailedError) {
      const name: string = e.handlerName;
      void name;
    } else if (e instanceof AskError) {
      const code: ErrorCode = e.code;
      void code;
      if (e.errorClass === 'TRANSIENT') void 0; // retry
    }
  }
  const requestId: string = await node.tell('orders', { id: 3, items: [] }, { fingerprint: 'order-3' });
  void requestId;
  const caused: string = await node.tell('orders', new Uint8Array([1]), {
    causationId: requestId,
    correlationId: requestId,
    signal: controller.signal,
  });
  void caused;
  const shared: TellOptions = { fingerprint: new SharedArrayBuffer(4), signal: AbortSignal.timeout(1_000) };
  await node.tell(pool, new SharedArrayBuffer(8), shared);
  // @ts-expect-error a tell has no preferred worker
  await node.tell('orders', 1, { preferredWorker: 'w0' });
  // An object shaped like a Pool is no Pool (the runtime refuses it too).
  const lookalike = { name: 'orders', handle: pool.handle, stats: pool.stats, close: pool.close };
  // @ts-expect-error only a Pool of a node, or a pool's name
  void node.ask(lookalike, 1).catch(() => undefined);
  const unbounded = new Node({ maxPayloadBytes: null });
  const bounded = new Node({ maxPayloadBytes: 1 << 20 });
  await Promise.all([unbounded.close(), bounded.close()]);
  const letters: DeadLetter<Order>[] = node.deadLetters<Order>();
  for (const l of letters) void l.payload.items;
  if (letters[0]) {
    const replay: AskHandle<Receipt> = node.replayDeadLetter<Receipt>(letters[0].requestId);
    for await (const s of replay.stages()) void s.stage;
    const replayed: Receipt = await replay;
    void replayed;
  }
  const stats: NodeStats = node.stats();
  void stats.pools[0]?.inFlight;
  const drops: number = stats.dlqDropped + stats.lateOutcomes;
  void drops;
  const poolStats: PoolStats = pool.stats();
  void (poolStats.duplicateAcks + poolStats.suppressedReplies + poolStats.expired);
  node.purgeDeadLetters();

  node.openPromises('/tmp/promises.db', { timeoutMs: 60_000 });
  const durable: DurableAsk<Receipt> = node.askDurable<Receipt>('orders', { id: 4, items: [] });
  const durableId: string = durable.id;
  for await (const stage of durable.stages()) {
    const name: string = stage.stage;
    void name;
  }
  const again: Receipt = await node.awaitDurable<Receipt>(durableId);
  void again;
  const pending: Promise<Receipt> = node.awaitDurable<Receipt>(durableId);
  void pending;
  const resumed: DurableAsk<Receipt> = node.resumeDurable<Receipt>(durableId);
  const resumedId: string = resumed.id;
  void resumedId;
  const created: DurablePromise<Order> = node.promises.create<Order>('p-1', {
    param: { id: 5, items: [] },
    key: 'k',
  });
  const settled = await node.promises.await<Order, Receipt>(created.id, {
    pollMs: 5,
    timeoutMs: 1_000,
    signal: AbortSignal.timeout(2_000),
  });
  if (settled.state === 'RESOLVED') void settled.value?.total;
  const pruned: number = node.promises.prune({ olderThanMs: 7 * 24 * 3_600_000 });
  void pruned;
  pool.close();
  await node.close();
}
