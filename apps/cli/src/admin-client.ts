import { type Client, Code, ConnectError, createClient, type Transport } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { escapeOutsideText } from "@llmgw/control-plane/client";
import { ClusterService } from "@llmgw/proto";
import {
  createFailoverTransport,
  type FailoverTransport,
  splitControlPlaneUrls,
} from "@llmgw/wire";
import { type CliIo, UsageError } from "./command.js";
import { plainHttpToOtherHosts } from "./plain-http.js";

/** Default control listener when neither `--control-plane` nor `LLMGW_CONTROL_PLANE` is set. */
export const DEFAULT_CONTROL_PLANE_URL = "http://127.0.0.1:7070";

/**
 * How long one admin call (a unary RPC) may go unanswered before it fails with
 * DeadlineExceeded: a frozen leader or a network that drops packets must not hang a command.
 * Streams (`llmgw events`) have no such deadline.
 */
export const ADMIN_CALL_TIMEOUT_MS = 30_000;

/** Flags every admin command takes (spread into `parseCommandArgs` options). */
export const ADMIN_FLAGS = {
  "control-plane": { type: "string" },
  token: { type: "string" },
  json: { type: "boolean" },
} as const;

/** Lines every admin command's usage ends with. */
export const ADMIN_FLAGS_USAGE = `  --control-plane URL  control listener (env LLMGW_CONTROL_PLANE, default ${DEFAULT_CONTROL_PLANE_URL});
                       several comma-separated instances: the command follows the leader
  --token T            admin token ('llmgw control-plane token --admin'); prefer the env
                       LLMGW_ADMIN_TOKEN: argv is visible in ps
  --json               machine-readable output
`;

/** A connected admin client and the output mode. */
export interface AdminContext {
  /** The instance calls go to now (the leader, once one answered). */
  readonly url: string;
  readonly client: Client<typeof ClusterService>;
  readonly json: boolean;
}

/**
 * `transport` with every call tied to `signal` (Ctrl-C cancels it) and every unary call given
 * `timeoutMs` unless the caller set its own.
 */
function withCallDefaults(transport: Transport, signal: AbortSignal, timeoutMs: number): Transport {
  const tied = (own: AbortSignal | undefined) => (own ? AbortSignal.any([own, signal]) : signal);
  return {
    unary: (method, own, ownTimeoutMs, header, input, contextValues) =>
      transport.unary(method, tied(own), ownTimeoutMs ?? timeoutMs, header, input, contextValues),
    stream: (method, own, ownTimeoutMs, header, input, contextValues) =>
      transport.stream(method, tied(own), ownTimeoutMs, header, input, contextValues),
  };
}

/**
 * Builds the admin client from flags and env; a missing token is a usage error. Warns on
 * `io.stderr` when the token came from `--token` (argv is public) and for each plain-HTTP URL
 * to another host (the token would cross the network in clear). Every call
 * stops when `io.signal` aborts; a unary call not answered within `callTimeoutMs` (default
 * {@link ADMIN_CALL_TIMEOUT_MS}) fails with DeadlineExceeded.
 */
export function adminContext(
  values: { "control-plane"?: string; token?: string; json?: boolean },
  io: CliIo,
  callTimeoutMs = ADMIN_CALL_TIMEOUT_MS,
): AdminContext {
  const urls = splitControlPlaneUrls(
    values["control-plane"] ?? io.env.LLMGW_CONTROL_PLANE ?? DEFAULT_CONTROL_PLANE_URL,
  );
  for (const url of urls) {
    if (!/^https?:\/\//.test(url) || !URL.canParse(url))
      throw new UsageError(`--control-plane must be an http:// or https:// URL, got "${url}"`);
  }
  if (urls.length === 0) throw new UsageError("--control-plane is empty");
  const token = values.token ?? io.env.LLMGW_ADMIN_TOKEN;
  if (!token) {
    throw new UsageError(
      "no admin token: set LLMGW_ADMIN_TOKEN or pass --token (print it with 'llmgw control-plane token --admin --data-dir DIR')",
    );
  }
  // As `llmgw agent --join-token` and `llmgw router --router-token` do: the flag works (a
  // one-off on a single-user host), but the secret is then in the process list.
  if (values.token !== undefined)
    io.stderr.write(
      "llmgw: warning: --token puts the admin token on the command line, where every local user can read it (ps, /proc); set LLMGW_ADMIN_TOKEN instead\n",
    );
  // Every call carries the admin token as a bearer header: over plain HTTP to another host,
  // anyone on the path reads it and holds the cluster. Warned, not refused: a TLS-terminating
  // proxy or tunnel on the path may make it safe, which the CLI cannot see.
  for (const url of plainHttpToOtherHosts(urls))
    io.stderr.write(
      `llmgw: warning: ${url} is plain HTTP to another host: the admin token crosses the network unencrypted; serve the control plane with --tls-cert/--tls-key and use https://\n`,
    );
  const transport: FailoverTransport = createFailoverTransport({
    urls,
    transportFor: (baseUrl) =>
      createConnectTransport({
        httpVersion: "1.1",
        baseUrl,
        interceptors: [
          (next) => (req) => {
            req.header.set("authorization", `Bearer ${token}`);
            return next(req);
          },
        ],
      }),
  });
  const client = createClient(
    ClusterService,
    withCallDefaults(transport, io.signal, callTimeoutMs),
  );
  return {
    get url() {
      return transport.current;
    },
    client,
    json: values.json ?? false,
  };
}

const NETWORK_CODES = [
  "ECONNREFUSED",
  "ENOTFOUND",
  "EHOSTUNREACH",
  "ETIMEDOUT",
  "ECONNRESET",
  "EAI_AGAIN",
  "EPROTO",
  "CERT_HAS_EXPIRED",
  "DEPTH_ZERO_SELF_SIGNED_CERT",
  "UNABLE_TO_VERIFY_LEAF_SIGNATURE",
];

function networkCode(error: unknown): string | undefined {
  let cur: unknown = error;
  for (let depth = 0; depth < 5 && cur; depth++) {
    const code = (cur as { code?: unknown }).code;
    if (typeof code === "string" && NETWORK_CODES.includes(code)) return code;
    const message = (cur as { message?: unknown }).message;
    if (typeof message === "string") {
      const found = NETWORK_CODES.find((c) => message.includes(c));
      if (found) return found;
    }
    cur = (cur as { cause?: unknown }).cause;
  }
  return undefined;
}

/** One human sentence for a failed admin call, saying what to do next. */
export function describeAdminError(error: unknown, url: string): string {
  const net = networkCode(error);
  if (net)
    return `cannot reach the control plane at ${url}: ${net} — is it running? set --control-plane or LLMGW_CONTROL_PLANE`;
  if (error instanceof ConnectError) {
    switch (error.code) {
      case Code.Unauthenticated:
        return `the control plane at ${url} refused the admin token: ${error.rawMessage}. Set LLMGW_ADMIN_TOKEN or --token to the output of 'llmgw control-plane token --admin --data-dir DIR'`;
      case Code.Unavailable:
        return `cannot reach the control plane at ${url}: ${error.rawMessage} — is it running? set --control-plane or LLMGW_CONTROL_PLANE`;
      case Code.DeadlineExceeded:
        return `the control plane at ${url} did not answer in time (${error.rawMessage}) — is it overloaded, or is the network to it dropping packets?`;
      case Code.NotFound:
      case Code.InvalidArgument:
      case Code.AlreadyExists:
        return error.rawMessage;
      default:
        return `the control plane at ${url} answered ${Code[error.code]}: ${error.rawMessage}`;
    }
  }
  return error instanceof Error ? error.message : String(error);
}

/**
 * Runs an admin action; failures print one clear line and exit 1, a call that Ctrl-C
 * (`io.signal`) cut short prints "interrupted" and exits 130.
 */
export async function runAdmin(
  io: CliIo,
  ctx: AdminContext,
  action: () => Promise<number>,
): Promise<number> {
  try {
    return await action();
  } catch (error) {
    if (io.signal.aborted) {
      io.stderr.write("llmgw: interrupted\n");
      return 130;
    }
    // The control plane's messages may quote what agents reported.
    io.stderr.write(`llmgw: ${escapeOutsideText(describeAdminError(error, ctx.url))}\n`);
    return 1;
  }
}
