import { Code, ConnectError, type ConnectRouter } from "@connectrpc/connect";
import {
  createAsyncIterable,
  readAllBytes,
  type UniversalHandler,
  type UniversalServerResponse,
} from "@connectrpc/connect/protocol";
import { codeToHttpStatus, errorToJsonBytes } from "@connectrpc/connect/protocol-connect";
import type { ControlPlaneErrorCode } from "../errors.js";
import { ERROR_CODE_HEADER } from "./errors.js";

/** connect-es's message prefix for a request body that is not valid protobuf binary. */
const PARSE_BINARY = "parse binary:";
const INVALID: ControlPlaneErrorCode = "LLMGW_CONTROL_PLANE_INVALID_ARGUMENT";
/** Error bodies are a few hundred bytes; anything bigger is not the error looked for. */
const ERROR_BODY_MAX_BYTES = 64 * 1024;

/**
 * Makes a unary request whose body is not valid protobuf binary answer `invalid_argument`
 * (HTTP 400, `llmgw-error-code: LLMGW_CONTROL_PLANE_INVALID_ARGUMENT`) instead of
 * `internal` (HTTP 500): it is the caller's mistake, and a 500 sends operators looking for a
 * control-plane bug. connect-es 2.1 maps binary decode failures to `Code.Internal` (JSON
 * ones to `InvalidArgument`), and for unary calls it decodes before any interceptor runs, so
 * the error-mapping interceptor never sees them; this rewrites that one answer of the
 * Connect protocol after the fact, costing nothing on calls that succeed. Call after every
 * service is registered on `router`. gRPC and gRPC-web answers, and server-streaming calls
 * (their error travels in the stream's end message), are left as they are.
 */
export function answerMalformedRequestsAsInvalidArgument(router: ConnectRouter): void {
  const handlers = router.handlers;
  for (let i = 0; i < handlers.length; i++) {
    const inner = handlers[i] as UniversalHandler;
    if (inner.method.methodKind !== "unary") continue;
    // Only a 500 goes through the async rewrite: a call that succeeded (every heartbeat)
    // costs one `then`, not two more promises.
    const wrapped = (req: Parameters<UniversalHandler>[0]) =>
      inner(req).then((res) => (mayRewrite(res) ? rewrite(res) : res));
    const handler: UniversalHandler = Object.assign(wrapped, {
      requestPath: inner.requestPath,
      method: inner.method,
      service: inner.service,
      protocolNames: inner.protocolNames,
      allowedMethods: inner.allowedMethods,
      supportedContentType: inner.supportedContentType,
    });
    handlers[i] = handler;
  }
}

/** The answer to a request body that is not valid protobuf binary (`detail`: the decoder's why). */
export function malformedBodyError(detail: string): ConnectError {
  return new ConnectError(
    `the request body is not a valid protobuf message (${detail})`,
    Code.InvalidArgument,
    { [ERROR_CODE_HEADER]: INVALID },
  );
}

/** Connect answers Internal with 500 and a JSON error body; everything else passes untouched. */
const mayRewrite = (res: UniversalServerResponse) =>
  res.status === codeToHttpStatus(Code.Internal) && res.body !== undefined;

async function rewrite(res: UniversalServerResponse): Promise<UniversalServerResponse> {
  if (res.body === undefined) return res;
  const bytes = await readAllBytes(res.body, ERROR_BODY_MAX_BYTES);
  const message = decodeErrorMessage(bytes);
  if (message === undefined || !message.startsWith(PARSE_BINARY)) {
    return { ...res, body: createAsyncIterable([bytes]) };
  }
  const error = malformedBodyError(message.slice(PARSE_BINARY.length).trim());
  const body = errorToJsonBytes(error, {});
  const header = new Headers(res.header);
  header.set("content-length", String(body.byteLength));
  error.metadata.forEach((value, key) => {
    header.set(key, value);
  });
  return {
    ...res,
    status: codeToHttpStatus(Code.InvalidArgument),
    header,
    body: createAsyncIterable([body]),
  };
}

function decodeErrorMessage(bytes: Uint8Array): string | undefined {
  try {
    const json = JSON.parse(new TextDecoder().decode(bytes)) as {
      code?: unknown;
      message?: unknown;
    };
    return json.code === "internal" && typeof json.message === "string" ? json.message : undefined;
  } catch {
    return undefined;
  }
}
