'use strict';
// The error taxonomy (DESIGN section 6) as Error subclasses with a `.code`.

class AskError extends Error {
  constructor(message, options) {
    super(message, options);
    this.name = new.target.name;
    this.code = new.target.code;
    this.errorClass = new.target.errorClass;
  }
}
// The base itself (thrown by user code, or a subclass of their own) is an
// error of no more specific kind: INTERNAL, a code of the taxonomy, as
// Python's base AskpoolError says, so `.code` is always an ErrorCode.
AskError.code = 'INTERNAL';
// The code's class in the taxonomy (DESIGN section 6): TRANSIENT (retry),
// PERMANENT (don't) or POISON (to the dead-letter queue).
AskError.errorClass = 'PERMANENT';

const byCode = new Map();

function define(name, code, errorClass = 'PERMANENT') {
  const cls = { [name]: class extends AskError {} }[name];
  cls.code = code;
  cls.errorClass = errorClass;
  byCode.set(code, cls);
  return cls;
}

const UnavailableError = define('UnavailableError', 'UNAVAILABLE', 'TRANSIENT');
const DeadlineExceededError = define('DeadlineExceededError', 'DEADLINE_EXCEEDED', 'TRANSIENT');
const AskTimeoutError = define('AskTimeoutError', 'ASK_TIMEOUT', 'TRANSIENT');
const BufferFullError = define('BufferFullError', 'BUFFER_FULL', 'TRANSIENT');
const NoRouteError = define('NoRouteError', 'NO_ROUTE');
const InvalidArgumentError = define('InvalidArgumentError', 'INVALID_ARGUMENT');
const ValidationError = define('ValidationError', 'VALIDATION_ERROR');
const PayloadMismatchError = define('PayloadMismatchError', 'PAYLOAD_MISMATCH');
const PermissionDeniedError = define('PermissionDeniedError', 'PERMISSION_DENIED');
const OversizePayloadError = define('OversizePayloadError', 'OVERSIZE_PAYLOAD');
const FailedPreconditionError = define('FailedPreconditionError', 'FAILED_PRECONDITION');
const DecodeFailureError = define('DecodeFailureError', 'DECODE_FAILURE', 'POISON');
const InternalError = define('InternalError', 'INTERNAL');
const AskCancelledError = define('AskCancelledError', 'ASK_CANCELLED');

/** A handler threw: `handlerName` and `handlerMessage` are what it threw. */
class HandlerFailedError extends AskError {
  constructor(message, options) {
    super(message, options);
    this.handlerName = options?.handlerName ?? 'Error';
    this.handlerMessage = options?.handlerMessage ?? message;
  }
}
HandlerFailedError.code = 'HANDLER_FAILED';
byCode.set('HANDLER_FAILED', HandlerFailedError);

/** The error for an `ErrorInfo` from the addon; `options` as Error's (`cause`). */
function fromInfo(info, options) {
  const cls = byCode.get(info.code) ?? InternalError;
  if (cls === HandlerFailedError) {
    return new HandlerFailedError(info.message, {
      handlerName: info.handlerName,
      handlerMessage: info.handlerMessage,
    });
  }
  return new cls(info.message, options);
}

const PREFIX = 'askpool:';

/** Turns an error thrown by the addon into its AskError subclass. */
function fromNative(error) {
  const text = error?.message;
  if (typeof text !== 'string' || !text.startsWith(PREFIX)) {
    // An argument of the wrong type, refused by the addon's conversion.
    if (typeof error?.code === 'string' && /^(InvalidArg|\w+Expected)$/.test(error.code)) {
      return new InvalidArgumentError(`invalid argument: ${text}`, { cause: error });
    }
    // A Rust panic caught at the boundary.
    return new InternalError(String(text ?? error), { cause: error });
  }
  const rest = text.slice(PREFIX.length);
  const colon = rest.indexOf(':');
  return fromInfo({ code: rest.slice(0, colon), message: rest.slice(colon + 1) });
}

// `read()` as a string, or `fallback` when reading or converting it throws
// (a getter that throws, an object with no primitive value, a revoked proxy).
function text(read, fallback) {
  try {
    return String(read());
  } catch {
    return fallback;
  }
}

/**
 * What a handler's throw becomes: [code or null, name, message], all
 * strings. Never throws, whatever was thrown: the request must be answered.
 */
function describeThrown(thrown) {
  let kind;
  try {
    kind =
      thrown instanceof AskError && byCode.has(thrown.code)
        ? thrown.code
        : thrown instanceof Error
          ? null
          : undefined;
  } catch {
    kind = undefined; // a revoked proxy: not even its prototype can be read
  }
  if (kind !== undefined) {
    const name = text(() => thrown.name || 'Error', 'Error');
    return [kind, name, text(() => thrown.message, `<the ${name}'s message could not be read>`)];
  }
  const type = typeof thrown;
  return [
    null,
    type,
    text(
      () => thrown,
      text(() => Object.prototype.toString.call(thrown), `<a thrown ${type} with no text>`),
    ),
  ];
}

module.exports = {
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
  errorCodes: Object.freeze([...byCode.keys()]),
  fromInfo,
  fromNative,
  describeThrown,
};
