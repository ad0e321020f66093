import {
  Code,
  ConnectError,
  type StreamResponse,
  type Transport,
  type UnaryResponse,
} from "@connectrpc/connect";

/*
 * One Connect transport over several control-plane instances, of which one leads. Calls go
 * to the instance that answered last. A follower refuses every call `Unavailable` with
 * `llmgw-error-code: LLMGW_CONTROL_PLANE_NOT_LEADER` and, when it knows, the leader's URL in
 * `llmgw-leader`; an instance that is down refuses the connection. Neither ran the call, so
 * a unary call moves on at once: to the named leader when it is one of the listed URLs
 * (a follower cannot send a client to a host the operator did not list), else to the next
 * URL, each at most once per call. A follower answers reads from its copy of the state,
 * marked `llmgw-served-by: follower`: such an answer naming a listed leader is asked again
 * of the leader (a read is safe to repeat), whose answer wins; the follower's stands when
 * the leader fails. Streams cannot be replayed: their failure moves the transport along,
 * and the caller's next stream goes there.
 */

/** Header of a follower's refusal, and of its read answers: the leader's URL when known. */
export const LEADER_HEADER = "llmgw-leader";
const ERROR_CODE_HEADER = "llmgw-error-code";
/** Header of a read a follower answered from its copy of the state: "follower". */
export const SERVED_BY_HEADER = "llmgw-served-by";
/** Header of a follower's read answer: how old its copy of the state is, in ms. */
export const COPY_AGE_HEADER = "llmgw-copy-age-ms";
const NOT_LEADER = "LLMGW_CONTROL_PLANE_NOT_LEADER";
const SHUTTING_DOWN = "LLMGW_CONTROL_PLANE_SHUTTING_DOWN";

/** Connection failures: nothing reached the instance. */
const NOT_SENT = ["ECONNREFUSED", "EHOSTUNREACH", "ENETUNREACH", "ENOTFOUND", "EAI_AGAIN"];
/** A connection that broke after the request went out. */
const BROKEN = ["ECONNRESET", "EPIPE", "ETIMEDOUT", "ECONNABORTED"];

/** Splits `URL[,URL…]` into URLs without trailing slashes; empty parts are dropped. */
export function splitControlPlaneUrls(list: string): string[] {
  return list
    .split(",")
    .map((u) => u.trim().replace(/\/+$/, ""))
    .filter((u) => u !== "");
}

/** Options of {@link createFailoverTransport}. */
export interface FailoverTransportOptions {
  /** The instances, in the order to try them. At least one. */
  readonly urls: readonly string[];
  /** The transport of one instance (created once per URL). */
  readonly transportFor: (url: string) => Transport;
  /** Told each time calls move to another instance, and why. */
  readonly onMove?: (from: string, to: string, why: string) => void;
}

/** A {@link Transport} that follows the leader; `current` is where the next call goes. */
export interface FailoverTransport extends Transport {
  readonly current: string;
}

/**
 * The network error code under `error`: a `code` string down its causes, else one of ours
 * named in a message (connect-node reports a refused connection as `[internal] connect
 * ECONNREFUSED …` without the cause when it happens while sending a request).
 */
function networkCode(error: unknown): string | undefined {
  let cur: unknown = error;
  for (let depth = 0; depth < 6 && cur; depth++) {
    const code = (cur as { code?: unknown }).code;
    if (typeof code === "string") return code;
    const message = (cur as { message?: unknown }).message;
    if (typeof message === "string") {
      const named = [...NOT_SENT, ...BROKEN].find((c) => message.includes(c));
      if (named !== undefined) return named;
    }
    cur = (cur as { cause?: unknown }).cause;
  }
  return undefined;
}

/**
 * How `error` bears on where calls go: `retry` (the call did not run: a follower's refusal, a
 * refused connection), `move` (the instance is going away or unreachable mid-call: later
 * calls go elsewhere, this one fails), or `stay`.
 */
export function classifyControlPlaneError(error: unknown): {
  readonly action: "retry" | "move" | "stay";
  readonly leader?: string;
  readonly why: string;
} {
  const connectError = ConnectError.from(error);
  const llmgwCode = connectError.metadata.get(ERROR_CODE_HEADER);
  if (llmgwCode === NOT_LEADER) {
    const leader = connectError.metadata.get(LEADER_HEADER) ?? undefined;
    return {
      action: "retry",
      ...(leader ? { leader: leader.replace(/\/+$/, "") } : {}),
      why: "a follower",
    };
  }
  const net = networkCode(error);
  if (net !== undefined && NOT_SENT.includes(net)) return { action: "retry", why: net };
  // The connection broke mid-call (the instance died): the call may have run.
  if (net !== undefined && BROKEN.includes(net)) return { action: "move", why: net };
  if (llmgwCode === SHUTTING_DOWN) return { action: "move", why: "shutting down" };
  if (connectError.code === Code.Unavailable)
    return { action: "move", why: connectError.rawMessage };
  return { action: "stay", why: connectError.rawMessage };
}

/** A transport over every URL of `options.urls`, following the leader. */
export function createFailoverTransport(options: FailoverTransportOptions): FailoverTransport {
  const urls = [...new Set(options.urls)];
  if (urls.length === 0) throw new TypeError("createFailoverTransport: no URLs");
  const transports = new Map<string, Transport>();
  const transportOf = (url: string): Transport => {
    let t = transports.get(url);
    if (t === undefined) {
      t = options.transportFor(url);
      transports.set(url, t);
    }
    return t;
  };
  let current = urls[0] as string;
  /**
   * Moves `from` (if still current) to the named leader when listed and not `tried` in this
   * call (a follower may name a leader that just died), else to the next URL not tried.
   */
  const moveFrom = (
    from: string,
    leader: string | undefined,
    why: string,
    tried: ReadonlySet<string> = new Set(),
  ): string => {
    if (current !== from) return current;
    const after = (i: number) => urls[(urls.indexOf(from) + i) % urls.length] as string;
    let next = after(1);
    for (let i = 1; i < urls.length && tried.has(next); i++) next = after(i + 1);
    if (leader !== undefined && leader !== from && urls.includes(leader) && !tried.has(leader))
      next = leader;
    if (next !== from) {
      current = next;
      options.onMove?.(from, next, why);
    }
    return current;
  };

  /** A stream that failed on `url`: the next one goes where the failure points. */
  const failedOn = (url: string, error: unknown): unknown => {
    const verdict = classifyControlPlaneError(error);
    if (verdict.action !== "stay") moveFrom(url, verdict.leader, verdict.why);
    return error;
  };

  return {
    get current() {
      return current;
    },
    async unary(method, signal, timeoutMs, header, input, contextValues) {
      const tried = new Set<string>();
      let url = current;
      const call = (at: string) =>
        transportOf(at).unary(method, signal, timeoutMs, header, input, contextValues) as Promise<
          UnaryResponse<never, never>
        >;
      for (;;) {
        tried.add(url);
        try {
          const answer = await call(url);
          const leader = answer.header.get(LEADER_HEADER)?.replace(/\/+$/, "");
          if (
            answer.header.get(SERVED_BY_HEADER) !== "follower" ||
            leader === undefined ||
            !urls.includes(leader) ||
            tried.has(leader)
          )
            return answer;
          try {
            const fromLeader = await call(leader);
            moveFrom(url, leader, "a follower's copy");
            return fromLeader;
          } catch {
            return answer;
          }
        } catch (error) {
          const verdict = classifyControlPlaneError(error);
          if (verdict.action === "stay" || signal?.aborted) throw error;
          const next = moveFrom(url, verdict.leader, verdict.why, tried);
          if (verdict.action === "move" || tried.has(next)) throw error;
          url = next;
        }
      }
    },
    async stream(method, signal, timeoutMs, header, input, contextValues) {
      const url = current;
      let response: StreamResponse<never, never>;
      try {
        response = (await transportOf(url).stream(
          method,
          signal,
          timeoutMs,
          header,
          input,
          contextValues,
        )) as StreamResponse<never, never>;
      } catch (error) {
        throw failedOn(url, error);
      }
      const messages = response.message;
      return {
        ...response,
        message: (async function* () {
          try {
            yield* messages;
          } catch (error) {
            throw failedOn(url, error);
          }
        })(),
      };
    },
  };
}
