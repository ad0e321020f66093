import { execFileSync, spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { chownSync, existsSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { freePort } from "@llmgw/supervisor";
import pg from "pg";

/**
 * A throwaway PostgreSQL cluster for tests: Debian's `postgresql` binaries, `initdb` in a
 * temp dir, password (scram) auth on a free loopback port, no fsync. Started and stopped by
 * the test that needs it; `scripts/setup.sh` installs the package. PostgreSQL refuses to
 * run as root, so as root the server runs as the `postgres` user the package creates.
 */
export interface TestPostgres {
  /** `postgres://llmgw:SECRET@127.0.0.1:PORT/` — append a database name. */
  readonly baseUrl: string;
  readonly password: string;
  readonly port: number;
  /** A fresh, empty database and its URL. */
  createDatabase(): Promise<string>;
  /** Stops the server at once (`-m immediate`): connections break as in a crash. */
  stop(): void;
  /** Starts it again on the same port and data. */
  start(): void;
  /** Stops it and removes its files. */
  destroy(): void;
}

/** The directory of `initdb`/`pg_ctl`, or undefined when PostgreSQL is not installed. */
export function postgresBinDir(): string | undefined {
  const fromConfig = spawnSync("pg_config", ["--bindir"], { encoding: "utf8" });
  if (fromConfig.status === 0) {
    const dir = fromConfig.stdout.trim();
    if (existsSync(join(dir, "initdb"))) return dir;
  }
  const root = "/usr/lib/postgresql";
  if (!existsSync(root)) return undefined;
  const versions = readdirSync(root)
    .filter((v) => existsSync(join(root, v, "bin", "initdb")))
    .sort((a, b) => Number(b) - Number(a));
  return versions[0] === undefined ? undefined : join(root, versions[0], "bin");
}

/**
 * Why PostgreSQL tests cannot run here, or undefined when they can. Under CI a missing
 * PostgreSQL is an error, not a skip: the test command installs it.
 */
export function postgresUnavailable(): string | undefined {
  if (postgresBinDir() !== undefined) return undefined;
  const why = "PostgreSQL is not installed (scripts/setup.sh installs Debian's postgresql)";
  if (process.env.CI) throw new Error(`${why}; CI must run the PostgreSQL tests`);
  return why;
}

/** Starts a throwaway cluster (about 2 s). */
export async function startTestPostgres(): Promise<TestPostgres> {
  const bin = postgresBinDir();
  if (bin === undefined) throw new Error("PostgreSQL is not installed");
  const root = process.getuid?.() === 0;
  const dir = mkdtempSync(join(tmpdir(), "llmgw-pg-"));
  const data = join(dir, "data");
  const password = randomBytes(12).toString("hex");
  const pwfile = join(dir, "pw");
  writeFileSync(pwfile, `${password}\n`, { mode: 0o600 });
  if (root) {
    const uid = Number(execFileSync("id", ["-u", "postgres"], { encoding: "utf8" }).trim());
    const gid = Number(execFileSync("id", ["-g", "postgres"], { encoding: "utf8" }).trim());
    chownSync(dir, uid, gid);
    chownSync(pwfile, uid, gid);
  }
  const run = (tool: string, args: string[]) => {
    const cmd = root ? "runuser" : join(bin, tool);
    const argv = root ? ["-u", "postgres", "--", join(bin, tool), ...args] : args;
    const r = spawnSync(cmd, argv, { encoding: "utf8" });
    if (r.status !== 0) throw new Error(`${tool} failed: ${r.stderr || r.stdout}`);
  };
  run("initdb", [
    "-D",
    data,
    "-U",
    "llmgw",
    "--auth=scram-sha-256",
    `--pwfile=${pwfile}`,
    "--no-sync",
    "-E",
    "UTF8",
  ]);
  const port = await freePort();
  const opts = `-p ${port} -k ${dir} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200`;
  const start = () =>
    run("pg_ctl", ["-D", data, "-o", opts, "-l", join(dir, "log"), "-w", "start"]);
  let running = false;
  const stop = () => {
    if (!running) return;
    running = false;
    run("pg_ctl", ["-D", data, "-m", "immediate", "-w", "stop"]);
  };
  start();
  running = true;
  const baseUrl = `postgres://llmgw:${password}@127.0.0.1:${port}/`;
  let databases = 0;
  return {
    baseUrl,
    password,
    port,
    async createDatabase() {
      const name = `t${++databases}`;
      const client = new pg.Client({ connectionString: `${baseUrl}postgres` });
      await client.connect();
      try {
        await client.query(`CREATE DATABASE ${name}`);
      } finally {
        await client.end();
      }
      return `${baseUrl}${name}`;
    },
    stop,
    start() {
      if (running) return;
      start();
      running = true;
    },
    destroy() {
      try {
        stop();
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    },
  };
}
