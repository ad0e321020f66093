/**
 * The router's last-known routing state on disk: `<state-dir>/routing-state.json`, so that a
 * router restarted while no control plane answers serves at once. The file holds engine API
 * keys, so the dir is 0700 and the file 0600, written whole (temp file, fsync, rename, fsync of
 * the dir) so a crash leaves the old file or the new one, never half of one.
 *
 * The snapshot is stored in its protobuf JSON form and read back through the same checks as
 * the live stream (`routingMessageFromProto`): the file is outside input like the stream, and
 * protobuf JSON keeps old files readable as fields are added. Fields it does not know (a file
 * a newer release wrote, before a rollback) are skipped, as the binary stream skips them.
 */
import { randomBytes } from "node:crypto";
import { chmod, lstat, mkdir, open, readFile, rename, rm } from "node:fs/promises";
import path from "node:path";
import { create, fromJson, type JsonValue, toJson } from "@bufbuild/protobuf";
import { RoutingSnapshotSchema, WatchRoutingResponseSchema } from "@llmgw/proto";
import { isRouterError, type RoutingSnapshot } from "@llmgw/router";
import { routingMessageFromProto, routingMessageToProto } from "@llmgw/wire";
import { ROUTER_ID_PATTERN } from "./config.js";
import { RouterServiceError } from "./errors.js";

/** The state file's name in the state dir. */
export const ROUTING_STATE_FILE = "routing-state.json";
/** Where a state file that could not be read is moved (the previous one is replaced). */
export const CORRUPT_ROUTING_STATE_FILE = `${ROUTING_STATE_FILE}.corrupt`;
/** The router id's file in the state dir. */
export const ROUTER_ID_FILE = "router-id";
/** `format` of the envelope this version writes and reads. */
export const ROUTING_STATE_FORMAT = "llmgw.routing-state.v1";
/** Largest state file read or written (a snapshot of 100 000 replicas is about 30 MiB). */
export const MAX_ROUTING_STATE_BYTES = 64 * 1024 * 1024;

/** What the state file holds. */
export interface SavedRoutingState {
  /** When it was written (epoch ms). */
  readonly savedAtMs: number;
  /** When a control plane was last heard before it was written (epoch ms). */
  readonly lastHeardAtMs: number;
  readonly snapshot: RoutingSnapshot;
}

/**
 * Creates the state dir 0700 (tightening an existing one), refusing a symlink, a non-directory
 * or a dir owned by another user (`uid`; undefined skips that check).
 * @throws RouterServiceError `LLMGW_ROUTER_STATE_FAILED` naming the dir and what is wrong.
 */
export async function prepareStateDir(dir: string, uid: number | undefined): Promise<void> {
  try {
    await mkdir(dir, { recursive: true, mode: 0o700 });
  } catch (cause) {
    throw new RouterServiceError(
      "LLMGW_ROUTER_STATE_FAILED",
      `cannot create the state dir ${dir}: ${(cause as Error).message}`,
      { cause },
    );
  }
  const stat = await lstat(dir);
  if (!stat.isDirectory()) {
    throw new RouterServiceError(
      "LLMGW_ROUTER_STATE_FAILED",
      `state dir ${dir} is ${stat.isSymbolicLink() ? "a symbolic link" : "not a directory"}; refusing to use it`,
    );
  }
  if (uid !== undefined && stat.uid !== uid) {
    throw new RouterServiceError(
      "LLMGW_ROUTER_STATE_FAILED",
      `state dir ${dir} is owned by uid ${stat.uid}, not the router's uid ${uid}; refusing to use it`,
    );
  }
  if ((stat.mode & 0o777) !== 0o700) await chmod(dir, 0o700);
}

/**
 * Reads the saved state; undefined when there is none.
 *
 * The file holds engine API keys, so no error quotes its content: a parse failure names the
 * position, a decoding failure the field, a check the field and the rule.
 * @throws RouterServiceError `LLMGW_ROUTER_STATE_CORRUPT` saying what is wrong with the file
 *   (too large, not a regular file, not JSON, another format, a snapshot the stream's checks
 *   refuse): only then may it be moved aside. `LLMGW_ROUTER_STATE_FAILED` when it could not be
 *   opened or read (EACCES, EMFILE, EIO…): the file may be good, so it is left where it is.
 */
export async function readRoutingStateFile(dir: string): Promise<SavedRoutingState | undefined> {
  const file = path.join(dir, ROUTING_STATE_FILE);
  let handle: Awaited<ReturnType<typeof open>>;
  try {
    handle = await open(file, "r");
  } catch (cause) {
    if ((cause as NodeJS.ErrnoException).code === "ENOENT") return undefined;
    throw unreadable(file, "open", cause);
  }
  let text: string;
  try {
    let stat: Awaited<ReturnType<typeof handle.stat>>;
    try {
      stat = await handle.stat();
    } catch (cause) {
      throw unreadable(file, "stat", cause);
    }
    if (!stat.isFile()) throw corrupt(file, "it is not a regular file");
    if (stat.size > MAX_ROUTING_STATE_BYTES)
      throw corrupt(file, `it is ${stat.size} bytes, over the ${MAX_ROUTING_STATE_BYTES} limit`);
    // Read at most one byte over the limit: a file that grows while read is still bounded.
    const buffer = Buffer.alloc(Math.min(stat.size, MAX_ROUTING_STATE_BYTES) + 1);
    let bytesRead: number;
    try {
      ({ bytesRead } = await handle.read(buffer, 0, buffer.length, 0));
    } catch (cause) {
      throw unreadable(file, "read", cause);
    }
    if (bytesRead > MAX_ROUTING_STATE_BYTES)
      throw corrupt(file, `it is over the ${MAX_ROUTING_STATE_BYTES} byte limit`);
    text = buffer.toString("utf8", 0, bytesRead);
  } finally {
    await handle.close();
  }
  return parseRoutingStateFile(text, file);
}

/**
 * Parses the state file's text (`file` names it in errors, which never quote the text).
 * @throws RouterServiceError `LLMGW_ROUTER_STATE_CORRUPT`.
 */
export function parseRoutingStateFile(text: string, file: string): SavedRoutingState {
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (cause) {
    throw corrupt(file, `it is not JSON (${describeJsonError(cause)})`);
  }
  if (typeof json !== "object" || json === null || Array.isArray(json))
    throw corrupt(file, "it is not a JSON object");
  const envelope = json as Record<string, unknown>;
  if (envelope.format !== ROUTING_STATE_FORMAT) {
    // Another llmgw version's format is worth naming; anything else is not quoted.
    const format = envelope.format;
    if (format === undefined || (typeof format === "string" && FORMAT_NAME.test(format)))
      throw corrupt(
        file,
        `its format is ${JSON.stringify(format) ?? "undefined"}, not "${ROUTING_STATE_FORMAT}"`,
      );
    throw corrupt(
      file,
      `its format is not an llmgw format name (expected "${ROUTING_STATE_FORMAT}")`,
    );
  }
  for (const key of ["savedAtMs", "lastHeardAtMs"] as const) {
    const v = envelope[key];
    if (typeof v !== "number" || !Number.isSafeInteger(v) || v < 0)
      throw corrupt(file, `${key} is not a time in epoch ms`);
  }
  let snapshot: RoutingSnapshot;
  try {
    const proto = fromJson(RoutingSnapshotSchema, envelope.snapshot as JsonValue, {
      ignoreUnknownFields: true,
    });
    const message = routingMessageFromProto(
      create(WatchRoutingResponseSchema, { message: { case: "snapshot", value: proto } }),
    );
    if (message.kind !== "snapshot") throw new Error("not a snapshot");
    snapshot = message;
  } catch (cause) {
    throw corrupt(file, `its snapshot is invalid: ${describeSnapshotError(cause)}`);
  }
  return {
    savedAtMs: envelope.savedAtMs as number,
    lastHeardAtMs: envelope.lastHeardAtMs as number,
    snapshot,
  };
}

/** What an llmgw state-file format name looks like (only such a value is quoted back). */
const FORMAT_NAME = /^llmgw\.[a-z0-9.-]{1,64}$/;

/**
 * A JSON.parse failure without its text: V8 quotes about ten characters each side of the bad
 * token ("Unexpected token 's', …"), which in this file may be an engine key.
 */
function describeJsonError(cause: unknown): string {
  const message = (cause as Error)?.message ?? "";
  const position = /\bat position (\d+)/.exec(message)?.[1];
  if (position !== undefined) return `a syntax error at position ${position}`;
  if (/^Unexpected end of JSON input$/.test(message)) return "it ends before the JSON does";
  if (/^Unexpected token\b/.test(message)) return "an unexpected token";
  return "a syntax error";
}

/**
 * A snapshot decoding or check failure as the field (and the rule) only. protobuf-es quotes
 * the offending value ("cannot decode field … from JSON: \"…\""), and the stream's checks
 * echo most values ("…, got …") besides an engine key's: neither is repeated here.
 */
function describeSnapshotError(cause: unknown): string {
  if (isRouterError(cause) && cause.code === "LLMGW_ROUTER_ROUTING_INVALID") {
    return cause.message
      .replace(/^routing \w+: /, "")
      .replace(/, got [\s\S]*$/, "")
      .replace(/ repeats [\s\S]*$/, " repeats an earlier entry");
  }
  const message = (cause as Error)?.message ?? "";
  const decode = /^cannot decode ((?:field |message )?[\w.]+) from JSON/.exec(message)?.[1];
  if (decode !== undefined) return `cannot decode ${decode} from protobuf JSON`;
  return "it does not decode as a routing snapshot";
}

/** The state file's text for `state`. */
export function formatRoutingStateFile(state: SavedRoutingState): string {
  const proto = routingMessageToProto(state.snapshot);
  if (proto.message.case !== "snapshot") throw new TypeError("not a snapshot");
  return JSON.stringify({
    format: ROUTING_STATE_FORMAT,
    savedAtMs: state.savedAtMs,
    lastHeardAtMs: state.lastHeardAtMs,
    snapshot: toJson(RoutingSnapshotSchema, proto.message.value),
  });
}

/**
 * Writes the state file atomically, owner-only (the dir must exist: {@link prepareStateDir}).
 * @throws RouterServiceError `LLMGW_ROUTER_STATE_FAILED` (disk full, read-only, too large).
 */
export async function writeRoutingStateFile(dir: string, state: SavedRoutingState): Promise<void> {
  const file = path.join(dir, ROUTING_STATE_FILE);
  const text = formatRoutingStateFile(state);
  const bytes = Buffer.byteLength(text);
  if (bytes > MAX_ROUTING_STATE_BYTES) {
    throw new RouterServiceError(
      "LLMGW_ROUTER_STATE_FAILED",
      `not saving ${file}: the state is ${bytes} bytes, over the ${MAX_ROUTING_STATE_BYTES} limit a router would read back`,
    );
  }
  await writeAtomically(file, text);
}

/** Moves an unreadable state file aside; returns where it went. */
export async function moveAsideRoutingStateFile(dir: string): Promise<string> {
  const to = path.join(dir, CORRUPT_ROUTING_STATE_FILE);
  try {
    await rename(path.join(dir, ROUTING_STATE_FILE), to);
  } catch (cause) {
    if ((cause as NodeJS.ErrnoException).code !== "ENOENT") {
      // Could not move it: remove it, so that it is not read again on every start.
      await rm(path.join(dir, ROUTING_STATE_FILE), { force: true, recursive: true });
      return "(removed)";
    }
  }
  return to;
}

/**
 * The router's id: `preferred` when given, else the one kept in `<dir>/router-id`, made
 * (`router-` + 12 hex digits) and saved on first use. An unreadable or malformed file is
 * replaced by a new id.
 */
export async function resolveRouterId(
  dir: string | undefined,
  preferred: string | undefined,
): Promise<string> {
  if (preferred !== undefined) return preferred;
  const fresh = `router-${randomBytes(6).toString("hex")}`;
  if (dir === undefined) return fresh;
  const file = path.join(dir, ROUTER_ID_FILE);
  const text = await readFile(file, "utf8").catch(() => "");
  if (ROUTER_ID_PATTERN.test(text.trim())) return text.trim();
  await writeAtomically(file, `${fresh}\n`);
  return fresh;
}

async function writeAtomically(file: string, text: string): Promise<void> {
  const tmp = `${file}.tmp-${process.pid}`;
  try {
    await rm(tmp, { force: true });
    const handle = await open(tmp, "wx", 0o600);
    try {
      await handle.writeFile(text);
      await handle.sync();
    } finally {
      await handle.close();
    }
    await rename(tmp, file);
    // The rename itself must reach the disk too, or a crash may bring the old file back.
    const dirHandle = await open(path.dirname(file), "r");
    try {
      await dirHandle.sync();
    } finally {
      await dirHandle.close();
    }
  } catch (cause) {
    await rm(tmp, { force: true }).catch(() => {});
    throw new RouterServiceError(
      "LLMGW_ROUTER_STATE_FAILED",
      `cannot write ${file}: ${(cause as Error).message}`,
      { cause },
    );
  }
}

/** A file whose content is wrong: no `cause`, which would carry the text or a value of it. */
function corrupt(file: string, problem: string): RouterServiceError {
  return new RouterServiceError("LLMGW_ROUTER_STATE_CORRUPT", `${file}: ${problem}`);
}

/** A file that could not be opened or read: it may be good, so it is not "corrupt". */
function unreadable(
  file: string,
  step: "open" | "stat" | "read",
  cause: unknown,
): RouterServiceError {
  return new RouterServiceError(
    "LLMGW_ROUTER_STATE_FAILED",
    `cannot ${step} ${file}: ${(cause as NodeJS.ErrnoException).code ?? (cause as Error).message}`,
    { cause },
  );
}
