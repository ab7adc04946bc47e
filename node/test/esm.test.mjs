import test from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import askpool, { Node, AskTimeoutError } from '../index.mjs';

const require = createRequire(import.meta.url);

test('the ESM entry exports the same classes as the CommonJS one', async () => {
  const cjs = require('..');
  assert.equal(Node, cjs.Node);
  assert.equal(AskTimeoutError, cjs.AskTimeoutError);
  assert.equal(askpool, cjs);
  const node = new Node();
  const msg = { esm: true };
  node.pool('esm').handle((m) => m);
  assert.equal(await node.ask('esm', msg), msg);
  await node.close();
});
