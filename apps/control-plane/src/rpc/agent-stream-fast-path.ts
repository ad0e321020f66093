import type { IncomingMessage, ServerResponse } from "node:http";
import { type DescMessage, fromBinary, type MessageShape, toBinary } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import {
  AgentService,
  StreamHeartbeatRequestSchema,
  StreamHeartbeatResponseSchema,
  StreamLoadRequestSchema,
  StreamLoadResponseSchema,
} from "@llmgw/proto";
import type { AgentStreams, ClientStreamSession } from "./agent-service.js";
import { toConnectError } from "./errors.js";

/**
 * The agents' two client streams (`StreamLoad`, `StreamHeartbeat`) served straight off the
 * socket, for the one encoding agents use (Connect streaming, binary, uncompressed): each
 * envelope is cut from the request body, decoded and handed to its session synchronously.
 *
 * Why: these carry ~1,500 messages a second at 1,000 agents, and in Connect's own handler each
 * message passes a chain of async iterables (envelope split, decode, invoke, the handler's
 * `for await`) that took ~22% of the control plane's CPU (bench/control-plane's churn
 * profile), more than the decoding and llmgw's handling together. Everything else (JSON,
 * compression, gRPC, gRPC-web, every other method) goes to Connect's handler, which serves
 * these methods too, and both feed the same {@link AgentStreams} sessions.
 *
 * The wire format (https://connectrpc.com/docs/protocol/#streaming-rpcs): the body is
 * envelopes of 1 flags byte (bit 0: compressed; bit 1: end of stream, answers only) and a
 * 4-byte big-endian length; the answer is HTTP 200 with the response message's envelope and
 * an end-of-stream envelope holding JSON `{}`, or only the end of stream with `{"error":
 * {"code", "message"}, "metadata": {…}}`.
 */

/** One method the fast path serves. */
interface FastClientStream<I extends DescMessage, O extends DescMessage> {
  readonly input: I;
  readonly output: O;
  open(headers: Headers): ClientStreamSession<MessageShape<I>, MessageShape<O>>;
}

const STREAM_PROTO = "application/connect+proto";
const COMPRESSED = 0b01;
const END_STREAM = 0b10;
const HEADER_BYTES = 5;

/**
 * A listener step for the control listener: true when it took the request (one of the agent
 * streams in the binary uncompressed Connect encoding), false to hand it to Connect.
 * `readMaxBytes` bounds each message, as Connect's own `readMaxBytes` does.
 */
export function createAgentStreamFastPath(
  streams: AgentStreams,
  options: { readonly readMaxBytes: number },
): (req: IncomingMessage, res: ServerResponse) => boolean {
  const path = (method: { name: string }) => `/${AgentService.typeName}/${method.name}`;
  const routes = new Map<string, FastClientStream<DescMessage, DescMessage>>([
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
  return (req, res) => {
    if (req.method !== "POST") return false;
    const route = routes.get(req.url ?? "");
    if (route === undefined) return false;
    if (req.headers["content-type"]?.toLowerCase() !== STREAM_PROTO) return false;
    const encoding = req.headers["connect-content-encoding"];
    if (encoding !== undefined && encoding !== "identity") return false;
    serve(route, req, res, options.readMaxBytes);
    return true;
  };
}

function serve(
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
    const headers = new Headers();
    const authorization = req.headers.authorization;
    if (authorization !== undefined) headers.set("authorization", authorization);
    session = route.open(headers);
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
  const end = Buffer.from(JSON.stringify(endStream(error)));
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

/** The end-of-stream JSON: `{}`, or the error with its metadata (e.g. `llmgw-error-code`). */
function endStream(error: ConnectError | undefined): object {
  if (error === undefined) return {};
  const metadata: Record<string, string[]> = {};
  error.metadata.forEach((value, key) => {
    metadata[key] = [value];
  });
  return {
    error: { code: codeName(error.code), message: error.rawMessage },
    ...(Object.keys(metadata).length > 0 ? { metadata } : {}),
  };
}

/** The Connect protocol's name of a code: `InvalidArgument` → `invalid_argument`. */
function codeName(code: Code): string {
  return (Code[code] ?? "Unknown").replace(/[A-Z]/g, (c, i: number) =>
    i === 0 ? c.toLowerCase() : `_${c.toLowerCase()}`,
  );
}
