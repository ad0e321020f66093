/**
 * The baselines: nginx and HAProxy as their own processes with a generated config in a temp
 * dir, loopback only, in the foreground (`daemon off;` / `-db`), torn down with the dir.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { chmodSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { findBinary, freePort, processTreeCpuUs, waitForPort } from "./children.js";

/** A running proxy in front of the engines. */
export interface RunningProxy {
  readonly url: string;
  /** The proxy's root process (nginx's master, HAProxy). */
  readonly pid: number | undefined;
  /** CPU time of the proxy's processes (master and workers) so far, µs; undefined off Linux. */
  cpuUs(): number | undefined;
  stop(): Promise<void>;
}

/** nginx balancing: `round-robin` (its default) or `least_conn`. */
export type NginxBalance = "round-robin" | "least_conn";

/**
 * HAProxy balancing: `leastconn`, consistent hashing on the `x-session-id` header, or
 * `roundrobin` (how routers sit behind one: docs/operations.md).
 */
export type HaproxyBalance = "leastconn" | "session-hash" | "roundrobin";

/** Options of {@link startHaproxy}. */
export interface HaproxyOptions {
  readonly upstreams: readonly string[];
  readonly balance: HaproxyBalance;
  /**
   * `http` (default): HAProxy parses requests and balances each one, keeping client
   * connections when a server goes away. `tcp`: it balances connections and passes bytes
   * through (the operations example, which leaves TLS to the routers).
   */
  readonly mode?: "http" | "tcp";
  /**
   * An HTTP health check on every server (e.g. `/readyz`): 200 keeps it in the pool, anything
   * else or no answer takes it out after `fall` checks and back after `rise`.
   */
  readonly healthCheck?: {
    readonly path: string;
    readonly intervalMs?: number;
    readonly fall?: number;
    readonly rise?: number;
  };
}

async function runProxy(
  name: string,
  args: (dir: string) => string[],
  config: (dir: string, port: number) => string,
  configFile: string,
): Promise<RunningProxy> {
  const bin = findBinary(name);
  if (bin === undefined) throw new Error(`${name} is not installed`);
  const dir = mkdtempSync(join(tmpdir(), `llmgw-bench-${name}-`));
  chmodSync(dir, 0o777); // nginx workers drop to `nobody` when the master runs as root
  const port = await freePort();
  writeFileSync(join(dir, configFile), config(dir, port));
  const proc: ChildProcess = spawn(bin, args(dir), { stdio: ["ignore", "ignore", "pipe"] });
  let stderr = "";
  proc.stderr?.on("data", (d: Buffer) => {
    stderr += d.toString();
  });
  const exited = new Promise<void>((resolve) => proc.once("exit", () => resolve()));
  try {
    await Promise.race([
      waitForPort(port),
      exited.then(() => {
        throw new Error(`${name} exited: ${stderr.trim()}`);
      }),
    ]);
  } catch (err) {
    proc.kill("SIGKILL");
    let log = "";
    try {
      log = readFileSync(join(dir, "error.log"), "utf8");
    } catch {}
    rmSync(dir, { recursive: true, force: true });
    throw new Error(`${(err as Error).message} ${log}`.trim());
  }
  return {
    url: `http://127.0.0.1:${port}`,
    pid: proc.pid,
    cpuUs: () => processTreeCpuUs(proc.pid),
    async stop() {
      if (proc.exitCode === null && proc.signalCode === null) {
        // nginx: QUIT waits for connections; TERM is the fast shutdown.
        proc.kill("SIGTERM");
        const t = setTimeout(() => proc.kill("SIGKILL"), 3000);
        await exited;
        clearTimeout(t);
      }
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

const hostPort = (url: string): string => {
  const u = new URL(url);
  return `${u.hostname}:${u.port}`;
};

/** nginx (1 worker, upstream keepalive 64, HTTP/1.1 upstream, no response buffering for SSE). */
export function startNginx(options: {
  readonly upstreams: readonly string[];
  readonly balance?: NginxBalance;
}): Promise<RunningProxy> {
  const servers = options.upstreams.map((u) => `server ${hostPort(u)};`).join(" ");
  const balance = options.balance === "least_conn" ? "least_conn;" : "";
  return runProxy(
    "nginx",
    (dir) => ["-p", dir, "-c", join(dir, "nginx.conf")],
    (dir, port) => `worker_processes 1;
daemon off;
pid ${dir}/nginx.pid;
error_log ${dir}/error.log warn;
events { worker_connections 8192; }
http {
  access_log off;
  client_body_temp_path ${dir}/body; proxy_temp_path ${dir}/proxy;
  fastcgi_temp_path ${dir}/fcgi; uwsgi_temp_path ${dir}/uwsgi; scgi_temp_path ${dir}/scgi;
  client_max_body_size 16m; client_body_buffer_size 1m;
  keepalive_requests 1000000;
  upstream engines { ${balance} ${servers} keepalive 64; keepalive_requests 1000000; }
  server {
    listen 127.0.0.1:${port};
    location / {
      proxy_pass http://engines;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_read_timeout 300s;
    }
  }
}
`,
    "nginx.conf",
  );
}

/**
 * HAProxy (1 thread; HTTP mode with server-side connection reuse, or TCP passthrough), with
 * connect failures retried on another server (`option redispatch`, `retries 2`).
 */
export function startHaproxy(options: HaproxyOptions): Promise<RunningProxy> {
  const mode = options.mode ?? "http";
  const balance =
    options.balance === "leastconn"
      ? "balance leastconn"
      : options.balance === "roundrobin"
        ? "balance roundrobin"
        : "balance hdr(x-session-id)\n  hash-type consistent";
  const check = options.healthCheck;
  const checkLines =
    check === undefined
      ? ""
      : `  option httpchk GET ${check.path}
  http-check expect status 200
  default-server inter ${check.intervalMs ?? 1000} fall ${check.fall ?? 2} rise ${check.rise ?? 2} on-marked-down shutdown-sessions
`;
  const servers = options.upstreams
    .map((u, i) => `  server s${i} ${hostPort(u)} maxconn 4000${check ? " check" : ""}`)
    .join("\n");
  const httpOnly =
    mode === "http"
      ? `  option http-keep-alive
  # Streaming: without it HAProxy sends with MSG_MORE and small SSE chunks wait for the
  # kernel's cork timeout (~200 ms), which shows up as TTFT, not routing.
  option http-no-delay
`
      : "";
  return runProxy(
    "haproxy",
    (dir) => ["-f", join(dir, "haproxy.cfg"), "-db"],
    (_dir, port) => `global
  nbthread 1
  maxconn 8000
defaults
  mode ${mode}
  timeout connect 5s
  timeout client 300s
  timeout server 300s
  option redispatch
  retries 2
${httpOnly}frontend fe
  bind 127.0.0.1:${port}
  default_backend be
backend be
  ${balance}
${mode === "http" ? "  http-reuse always\n" : ""}${checkLines}${servers}
`,
    "haproxy.cfg",
  );
}
