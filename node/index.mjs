// ESM entry: the same objects as the CommonJS entry (one addon, one class
// identity whichever way the package is loaded).
import askpool from './index.js';

export const {
  Node,
  Pool,
  AskHandle,
  Context,
  DurableAsk,
  DurablePromises,
  AskError,
  UnavailableError,
  DeadlineExceededError,
  AskTimeoutError,
  BufferFullError,
  NoRouteError,
  InvalidArgumentError,
  ValidationError,
  PayloadMismatchError,
  PermissionDeniedError,
  OversizePayloadError,
  FailedPreconditionError,
  DecodeFailureError,
  InternalError,
  AskCancelledError,
  HandlerFailedError,
  errorCodes,
} = askpool;
export default askpool;
