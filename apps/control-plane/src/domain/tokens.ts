import * as nodeCrypto from "node:crypto";
import { createHash, randomBytes, timingSafeEqual } from "node:crypto";
import { chmodSync, existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { ControlPlaneError } from "../errors.js";

/** The files a control plane keeps in its data dir. */
export const DATA_DIR_FILES = {
  database: "state.db",
  joinToken: "join-token",
  adminToken: "admin-token",
  routerToken: "router-token",
} as const;

/**
 * Which token: agents join with `join`, operators use `admin`, routers watch the routing state
 * with `router` (it opens nothing else, and nothing else opens the routing stream, which
 * carries the engines' API keys).
 */
export type TokenKind = "join" | "admin" | "router";

const TOKEN_FILES: Readonly<Record<TokenKind, string>> = {
  join: DATA_DIR_FILES.joinToken,
  admin: DATA_DIR_FILES.adminToken,
  router: DATA_DIR_FILES.routerToken,
};

/** The data dir after {@link initDataDir}. */
export interface DataDir {
  readonly dir: string;
  readonly databaseFile: string;
  readonly joinToken: string;
  readonly adminToken: string;
  readonly routerToken: string;
  /** True when the tokens already existed: the dir was initialised by an earlier start. */
  readonly initialisedBefore: boolean;
}

/** A high-entropy secret with a readable prefix, e.g. `llmgw-join-3q2…` (256 bits, base64url). */
export function generateSecret(prefix: string): string {
  return `${prefix}${randomBytes(32).toString("base64url")}`;
}

/** `crypto.hash` is Node ≥ 20.12; `engines` allows 20.11 (a named import would not link there). */
const oneShotHash = (nodeCrypto as { hash?: (alg: string, data: string, enc: "hex") => string })
  .hash;

/** Hex sha256 of a secret; only this is stored for credentials and API keys. */
export function hashSecret(secret: string): string {
  // One-shot where there is one: no Hash object per call (a node credential is hashed on
  // every heartbeat).
  return oneShotHash !== undefined
    ? oneShotHash("sha256", secret, "hex")
    : createHash("sha256").update(secret).digest("hex");
}

/** Compares two secrets (or hashes) in constant time. */
export function secretsEqual(a: string, b: string): boolean {
  const ab = Buffer.from(a, "utf8");
  const bb = Buffer.from(b, "utf8");
  return ab.length === bb.length && timingSafeEqual(ab, bb);
}

function tokenFile(dir: string, kind: TokenKind): string {
  return join(dir, TOKEN_FILES[kind]);
}

/**
 * Creates the data dir (mode 0700) and, on first start, the join, admin and router tokens
 * (0600). Existing tokens are kept, so agents, operators and routers keep working across
 * restarts; a token missing from an existing dir (the router token of a dir made before
 * routers existed) is generated on this start.
 */
export function initDataDir(dir: string): DataDir {
  try {
    mkdirSync(dir, { recursive: true, mode: 0o700 });
    chmodSync(dir, 0o700);
  } catch (cause) {
    throw new ControlPlaneError(
      "LLMGW_CONTROL_PLANE_STORE_FAILED",
      `cannot create the data dir ${dir}: ${(cause as Error).message}`,
      { cause },
    );
  }
  const initialisedBefore =
    existsSync(tokenFile(dir, "join")) || existsSync(tokenFile(dir, "admin"));
  const ensure = (kind: TokenKind): string => {
    const file = tokenFile(dir, kind);
    if (existsSync(file)) {
      chmodSync(file, 0o600);
      return readTokenFile(file);
    }
    const token = generateSecret(`llmgw-${kind}-`);
    writeFileSync(file, `${token}\n`, { mode: 0o600, flag: "wx" });
    return token;
  };
  return {
    dir,
    databaseFile: join(dir, DATA_DIR_FILES.database),
    joinToken: ensure("join"),
    adminToken: ensure("admin"),
    routerToken: ensure("router"),
    initialisedBefore,
  };
}

function readTokenFile(file: string): string {
  const token = readFileSync(file, "utf8").trim();
  if (token === "") {
    throw new ControlPlaneError(
      "LLMGW_CONTROL_PLANE_STORE_CORRUPT",
      `the token file ${file} is empty; restore it from a backup or delete it to generate a new one (agents then need the new join token)`,
    );
  }
  return token;
}

/**
 * Reads a token written by a control plane (for `llmgw control-plane token`). Throws
 * `LLMGW_CONTROL_PLANE_NOT_FOUND` when the data dir was never initialised.
 */
export function readToken(dir: string, kind: TokenKind): string {
  const file = tokenFile(dir, kind);
  if (!existsSync(file)) {
    throw new ControlPlaneError(
      "LLMGW_CONTROL_PLANE_NOT_FOUND",
      `no ${kind} token in ${dir}: start the control plane once with --data-dir ${dir} to create it`,
    );
  }
  return readTokenFile(file);
}
