import type { IncomingMessage, ServerResponse } from "node:http";
import { type DescMessage, fromBinary, type MessageShape, toBinary } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import {
  codeToHttpStatus,
  endStreamToJson,
  errorToJsonBytes,
} from "@connectrpc/connect/protocol-connect";
import {
  AgentService,
  HeartbeatRequestSchema,
  HeartbeatResponseSchema,
  ReportLoadRequestSchema,
  ReportLoadResponseSchema,
  StreamHeartbeatRequestSchema,
  StreamHeartbeatResponseSchema,
  StreamLoadRequestSchema,
  StreamLoadResponseSchema,
} from "@llmgw/proto";
import type { AgentCalls, AgentStreams, ClientStreamSession } from "./agent-service.js";
import { malformedBodyError } from "./decode-errors.js";
import { toConnectError } from "./errors.js";

/**
 * The agents' frequent calls served straight off the socket, in the one encoding agents use
 * (Connect, binary, uncompressed): the two client streams (`StreamLoad`, `StreamHeartbeat`),
 * each envelope cut from the request body, decoded and handed to its session synchronously;
 * and the two unary calls (`Heartbeat`, `ReportLoad`), the body read whole, decoded, answered
 * once what the call changed is durable.
 *
 * Why: the streams carry ~1,500 messages a second at 1,000 agents, and in Connect's own
 * handler each message passes a chain of async iterables (envelope split, decode, invoke, the
 * handler's `for await`) that took ~22% of the control plane's CPU (bench/control-plane's
 * churn profile), more than the decoding and llmgw's handling together. A unary call there
 * builds a `Headers` object, a URL, an abort controller and its `DOMException`, a handler
 * context and a chain of promises and async iterables around a synchronous answer: for a
 * heartbeat (500 a second at 1,000 agents on calls) more than all of llmgw's own handling.
 * Everything else (JSON, compression, gRPC, gRPC-web, GET, every other method) goes to
 * Connect's handler, which serves these methods too, and both run the same
 * {@link AgentStreams} sessions and {@link AgentCalls}.
 *
 * The wire format (https://connectrpc.com/docs/protocol/): a unary request's body is the
 * message; the answer is HTTP 200 `application/proto` with the response message, or the
 * code's HTTP status, `application/json` `{"code", "message"}` and the error's metadata as
 * headers. A stream's body is envelopes of 1 flags byte (bit 0: compressed; bit 1: end of
 * stream, answers only) and a 4-byte big-endian length; the answer is HTTP 200 with the
 * response message's envelope and an end-of-stream envelope holding JSON `{}`, or only the
 * end of stream with `{"error": {"code", "message"}, "metadata": {…}}`. A
 * `connect-timeout-ms` is not enforced: these answers are synchronous but for the wait on
 * durability, which has its own bound (`ClusterStore.flush`), as in Connect's handler.
 */

/** One method the fast path serves. */
interface FastClientStream<I extends DescMessage, O extends DescMessage> {
  readonly input: I;
  readonly output: O;
  open(headers: Headers): ClientStreamSession<MessageShape<I>, MessageShape<O>>;
}

/** One unary method the fast path serves. */
interface FastUnary<I extends DescMessage, O extends DescMessage> {
  readonly input: I;
  readonly output: O;
  call(req: MessageShape<I>, headers: Headers): MessageShape<O>;
}

const UNARY_PROTO = "application/proto";
const STREAM_PROTO = "application/connect+proto";
const COMPRESSED = 0b01;
const END_STREAM = 0b10;
const HEADER_BYTES = 5;

/** What {@link createAgentFastPath} serves, and how. */
export interface AgentFastPathOptions {
  readonly streams: AgentStreams;
  readonly calls: AgentCalls;
  /** Resolves once what a unary call changed is durable; its answer waits (`ClusterStore.flush`). */
  readonly durable: () => Promise<void>;
  /** Bounds each message, as Connect's own `readMaxBytes` does. */
  readonly readMaxBytes: number;
}

/**
 * A listener step for the control listener: true when it took the request (one of the agent
 * calls above in the binary uncompressed Connect encoding), false to hand it to Connect.
 */
export function createAgentFastPath(
  options: AgentFastPathOptions,
): (req: IncomingMessage, res: ServerResponse) => boolean {
  const { streams, calls, durable, readMaxBytes } = options;
  const path = (method: { name: string }) => `/${AgentService.typeName}/${method.name}`;
  const streamRoutes = new Map<string, FastClientStream<DescMessage, DescMessage>>([
    [
      path(AgentService.method.streamLoad),
      {
        input: StreamLoadRequestSchema,
        output: StreamLoadResponseSchema,
        open: (headers) => streams.streamLoad(headers),
      } as FastClientStream<DescMessage, DescMessage>,
    ],
    [
      path(AgentService.method.streamHeartbeat),
      {
        input: StreamHeartbeatRequestSchema,
        output: StreamHeartbeatResponseSchema,
        open: (headers) => streams.streamHeartbeat(headers),
      } as FastClientStream<DescMessage, DescMessage>,
    ],
  ]);
  const unaryRoutes = new Map<string, FastUnary<DescMessage, DescMessage>>([
    [
      path(AgentService.method.heartbeat),
      unaryRoute(HeartbeatRequestSchema, HeartbeatResponseSchema, (req, headers) =>
        calls.heartbeat(req, headers),
      ),
    ],
    [
      path(AgentService.method.reportLoad),
      unaryRoute(ReportLoadRequestSchema, ReportLoadResponseSchema, (req, headers) =>
        calls.reportLoad(req, headers),
      ),
    ],
  ]);
  return (req, res) => {
    if (req.method !== "POST") return false;
    const url = req.url ?? "";
    const type = req.headers["content-type"]?.toLowerCase();
    const unary = unaryRoutes.get(url);
    if (unary !== undefined) {
      if (type !== UNARY_PROTO) return false;
      const encoding = req.headers["content-encoding"];
      if (encoding !== undefined && encoding !== "identity") return false;
      // Connect answers a malformed deadline with an error of its own.
      const timeout = req.headers["connect-timeout-ms"];
      if (timeout !== undefined && (typeof timeout !== "string" || !/^\d{1,10}$/.test(timeout)))
        return false;
      serveUnary(unary, req, res, readMaxBytes, durable);
      return true;
    }
    const stream = streamRoutes.get(url);
    if (stream === undefined) return false;
    if (type !== STREAM_PROTO) return false;
    const encoding = req.headers["connect-content-encoding"];
    if (encoding !== undefined && encoding !== "identity") return false;
    serveStream(stream, req, res, readMaxBytes);
    return true;
  };
}

/** A unary route, its types checked here and erased for the table. */
function unaryRoute<I extends DescMessage, O extends DescMessage>(
  input: I,
  output: O,
  call: (req: MessageShape<I>, headers: Headers) => MessageShape<O>,
): FastUnary<DescMessage, DescMessage> {
  return { input, output, call } as unknown as FastUnary<DescMessage, DescMessage>;
}

/** The request's `Authorization`, all the agent calls read of its headers. */
function authorizationOf(req: IncomingMessage): Headers {
  const headers = new Headers();
  const authorization = req.headers.authorization;
  if (authorization !== undefined) headers.set("authorization", authorization);
  return headers;
}

function serveUnary(
  route: FastUnary<DescMessage, DescMessage>,
  req: IncomingMessage,
  res: ServerResponse,
  readMaxBytes: number,
  durable: () => Promise<void>,
): void {
  const fail = (error: unknown) => answerUnaryError(res, toConnectError(error));
  const declared = Number(req.headers["content-length"] ?? 0);
  if (declared > readMaxBytes) {
    // The body is read and dropped, so that the connection stays usable.
    req.resume();
    fail(tooLarge(declared, readMaxBytes));
    return;
  }
  const chunks: Buffer[] = [];
  let received = 0;
  let over = false;
  req.on("data", (chunk: Buffer) => {
    if (over) return;
    received += chunk.length;
    if (received > readMaxBytes) {
      over = true;
      chunks.length = 0;
      fail(tooLarge(received, readMaxBytes));
      return;
    }
    chunks.push(chunk);
  });
  req.on("end", () => {
    if (over) return;
    let message: MessageShape<DescMessage>;
    try {
      const body = chunks.length === 1 ? (chunks[0] as Buffer) : Buffer.concat(chunks, received);
      message = decode(route.input, body);
    } catch (error) {
      fail(error);
      return;
    }
    let out: Uint8Array;
    try {
      out = toBinary(route.output, route.call(message, authorizationOf(req)));
    } catch (error) {
      fail(error);
      return;
    }
    durable().then(() => {
      if (res.headersSent) return;
      res.writeHead(200, { "content-type": UNARY_PROTO, "content-length": out.byteLength });
      res.end(out);
    }, fail);
  });
}

/** `fromBinary`, its failure as the caller's mistake (see decode-errors.ts). */
function decode(schema: DescMessage, body: Uint8Array): MessageShape<DescMessage> {
  try {
    return fromBinary(schema, body);
  } catch (error) {
    throw malformedBodyError((error as Error).message);
  }
}

function tooLarge(size: number, readMaxBytes: number): ConnectError {
  return new ConnectError(
    `message size ${size} is larger than configured readMaxBytes ${readMaxBytes}`,
    Code.ResourceExhausted,
  );
}

/** A unary error answer: the code's HTTP status, the error as JSON, its metadata as headers. */
function answerUnaryError(res: ServerResponse, error: ConnectError): void {
  if (res.headersSent) return;
  const body = errorToJsonBytes(error, {});
  const headers: Record<string, string | number> = {};
  error.metadata.forEach((value, key) => {
    headers[key] = value;
  });
  headers["content-type"] = "application/json";
  headers["content-length"] = body.byteLength;
  res.writeHead(codeToHttpStatus(error.code), headers);
  res.end(body);
}

function serveStream(
  route: FastClientStream<DescMessage, DescMessage>,
  req: IncomingMessage,
  res: ServerResponse,
  readMaxBytes: number,
): void {
  let done = false;
  const fail = (error: unknown) => {
    done = true;
    // The agent may still be writing: the rest of the body is read and dropped, and the
    // agent, once it has the answer, ends its request.
    answer(res, undefined, toConnectError(error));
  };
  let session: ClientStreamSession<unknown, unknown>;
  try {
    session = route.open(authorizationOf(req));
  } catch (error) {
    fail(error);
    req.resume();
    return;
  }
  // Bytes not yet a whole envelope, as received.
  let chunks: Buffer[] = [];
  let buffered = 0;
  req.on("data", (chunk: Buffer) => {
    if (done) return;
    chunks.push(chunk);
    buffered += chunk.length;
    let buf = chunks.length === 1 ? chunk : Buffer.concat(chunks, buffered);
    let offset = 0;
    try {
      while (buf.length - offset >= HEADER_BYTES) {
        const flags = buf[offset] as number;
        const length = buf.readUInt32BE(offset + 1);
        if (length > readMaxBytes) {
          throw new ConnectError(
            `message size ${length} is larger than configured readMaxBytes ${readMaxBytes}`,
            Code.ResourceExhausted,
          );
        }
        if (flags !== 0) {
          throw new ConnectError(
            flags & COMPRESSED
              ? "protocol error: received a compressed message, but no encoding was negotiated"
              : `protocol error: unexpected envelope flags ${flags} in a request`,
            Code.InvalidArgument,
          );
        }
        if (buf.length - offset - HEADER_BYTES < length) break;
        const start = offset + HEADER_BYTES;
        offset = start + length;
        session.take(fromBinary(route.input, buf.subarray(start, offset)));
      }
    } catch (error) {
      chunks = [];
      fail(error);
      return;
    }
    buf = buf.subarray(offset);
    chunks = buf.length === 0 ? [] : [buf];
    buffered = buf.length;
  });
  req.on("end", () => {
    if (done) return;
    done = true;
    if (buffered > 0) {
      fail(new ConnectError("protocol error: incomplete envelope", Code.InvalidArgument));
      return;
    }
    let out: unknown;
    try {
      out = session.finish();
    } catch (error) {
      fail(error);
      return;
    }
    answer(res, toBinary(route.output, out as MessageShape<DescMessage>), undefined);
  });
}

/** Writes the whole answer: the message (when there is one) and the end of the stream. */
function answer(res: ServerResponse, message: Uint8Array | undefined, error?: ConnectError) {
  if (res.headersSent) return;
  // The end-of-stream JSON: `{}`, or the error with its metadata (e.g. `llmgw-error-code`).
  const end = Buffer.from(JSON.stringify(endStreamToJson(new Headers(), error, {})));
  const parts: Buffer[] = [];
  if (message !== undefined) parts.push(envelopeHeader(0, message.length), Buffer.from(message));
  parts.push(envelopeHeader(END_STREAM, end.length), end);
  const body = Buffer.concat(parts);
  res.writeHead(200, { "content-type": STREAM_PROTO, "content-length": body.length });
  res.end(body);
}

function envelopeHeader(flags: number, length: number): Buffer {
  const header = Buffer.alloc(HEADER_BYTES);
  header[0] = flags;
  header.writeUInt32BE(length, 1);
  return header;
}
