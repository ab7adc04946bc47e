'use strict';
// askpool for Node: reliable ask (request/reply) between callers and worker
// pools, on the askpool Rust core. See index.d.ts for the API.

const errors = require('./lib/errors');
const { Node, Pool, AskHandle, Context, DurableAsk, DurablePromises } = require('./lib/node');

module.exports = {
  Node,
  Pool,
  AskHandle,
  Context,
  DurableAsk,
  DurablePromises,
  AskError: errors.AskError,
  UnavailableError: errors.UnavailableError,
  DeadlineExceededError: errors.DeadlineExceededError,
  AskTimeoutError: errors.AskTimeoutError,
  BufferFullError: errors.BufferFullError,
  NoRouteError: errors.NoRouteError,
  InvalidArgumentError: errors.InvalidArgumentError,
  ValidationError: errors.ValidationError,
  PayloadMismatchError: errors.PayloadMismatchError,
  PermissionDeniedError: errors.PermissionDeniedError,
  OversizePayloadError: errors.OversizePayloadError,
  FailedPreconditionError: errors.FailedPreconditionError,
  DecodeFailureError: errors.DecodeFailureError,
  InternalError: errors.InternalError,
  AskCancelledError: errors.AskCancelledError,
  HandlerFailedError: errors.HandlerFailedError,
  errorCodes: errors.errorCodes,
};
