/**
 * The release artefacts as an operator gets them: `scripts/package.ts` packs the tarball from
 * the built bundle, `npm install --global` puts it into an empty prefix with a temporary HOME
 * (no repository, no workspace, no pnpm store: only Node.js, npm and its registry), and the
 * installed `llmgw` runs the demo and the inventory. The .deb is laid out from that same
 * install and checked with dpkg-deb (and lintian where the machine has it); its extracted tree
 * runs too. The install compiles better-sqlite3 (a few minutes on 2 cores): the one dependency
 * that builds.
 */
import { execFile, execFileSync } from "node:child_process";
import { existsSync, mkdirSync, readdirSync, readFileSync, readlinkSync, statSync } from "node:fs";
import { homedir } from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { gunzipSync } from "node:zlib";
import { findLlamaServer } from "@llmgw/engine-sim";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { installedPackageDir, npmInstallArgs } from "../../../scripts/package.js";
import { ensureCliBuilt, repoRoot, stopAll, tempRoot } from "./cluster-harness.js";

const run = promisify(execFile);
const roots: string[] = [];
afterAll(() => stopAll(roots));

const root = tempRoot("llmgw-package-");
roots.push(root);
const home = path.join(root, "home");
const prefix = path.join(root, "prefix");
const out = path.join(root, "out");
mkdirSync(home, { recursive: true });

/**
 * The environment of a machine that has never seen this repository: this machine's own (its
 * CA bundle and proxy settings are the operator's), a fresh HOME, and none of the npm/pnpm
 * settings the test runner was started with.
 */
const env: NodeJS.ProcessEnv = {
  ...Object.fromEntries(
    Object.entries(process.env).filter(
      ([k]) => !/^(npm_|pnpm_|PNPM_|INIT_CWD$|NODE_OPTIONS$)/i.test(k),
    ),
  ),
  HOME: home,
  // An empty llmgw cache: no llama-server built yet.
  LLMGW_CACHE_DIR: path.join(home, ".cache", "llmgw"),
  // Reuse one download cache between runs (the registry is the network; the cache is npm's own).
  npm_config_cache: path.join(process.env.HOME ?? "/root", ".cache", "llmgw", "npm"),
  npm_config_update_notifier: "false",
  // node-gyp builds better-sqlite3 against these headers rather than downloading them, as on
  // any machine whose Node.js came from a distribution package.
  ...(existsSync("/usr/include/node/node.h") ? { npm_config_nodedir: "/usr" } : {}),
};

let tarball = "";
let deb = "";
let installed = "";

/**
 * Runs the installed `llmgw`. A failure carries the command's stdout as well as its stderr:
 * the demo reports a failed step on stdout, and execFile's own message has only stderr.
 */
async function llmgw(bin: string, args: string[], timeout = 240_000) {
  try {
    return await run(bin, args, { env, timeout, maxBuffer: 16 * 1024 * 1024 });
  } catch (e) {
    const x = e as Error & { stdout?: string; stderr?: string; signal?: string; code?: number };
    x.message += `\n(exit ${x.code ?? "?"}, signal ${x.signal ?? "none"})\n--- stdout ---\n${(x.stdout ?? "").slice(-8_000)}\n--- stderr ---\n${(x.stderr ?? "").slice(-8_000)}`;
    throw x;
  }
}

/**
 * The demo picks its own ports (8080 and 7070, or free ones when those are taken) and binds
 * them at once. Ports chosen here would sit unbound while the installed CLI starts, long enough
 * for another test's connection to take one of them.
 */
function demoArgs(): string[] {
  return ["demo", "--exit-after-check", "--no-llamacpp"];
}

describe("the npm package and the Debian package", () => {
  beforeAll(async () => {
    ensureCliBuilt();
    const packed = await run("npx", ["tsx", "scripts/package.ts", "--no-build", "--out", out], {
      cwd: repoRoot,
      timeout: 120_000,
    });
    tarball = packed.stdout.trim().split("\n").pop() ?? "";
    await run("npm", npmInstallArgs(tarball, prefix), { env, cwd: root, timeout: 900_000 });
    installed = installedPackageDir(prefix);
  }, 1_000_000);

  it("packs one tarball whose dependencies are the npm packages the bundle imports", async () => {
    expect(path.basename(tarball)).toMatch(/^llmgw-\d+\.\d+\.\d+\.tgz$/);
    const manifest = JSON.parse(
      execFileSync("tar", ["-xzOf", tarball, "package/package.json"], { encoding: "utf8" }),
    ) as { dependencies: Record<string, string>; devDependencies?: unknown; scripts?: unknown };
    expect(manifest.devDependencies).toBeUndefined();
    expect(manifest.scripts).toBeUndefined();
    expect(Object.keys(manifest.dependencies).some((d) => d.startsWith("@llmgw/"))).toBe(false);
    const files = execFileSync("tar", ["-tzf", tarball], { encoding: "utf8" }).split("\n");
    expect(files).toContain("package/dist/main.js");
    expect(files).toContain("package/dist/router-worker.js");
    expect(files).toContain("package/systemd/llmgw-agent.service");
    expect(files.filter((f) => f.includes("metafile"))).toEqual([]);
  });

  it("installs with npm into an empty prefix and says what it is", async () => {
    const bin = path.join(prefix, "bin", "llmgw");
    const { stdout } = await llmgw(bin, ["version", "--json"]);
    const v = JSON.parse(stdout) as Record<string, unknown>;
    const cli = JSON.parse(
      execFileSync("node", ["-p", "JSON.stringify(require('./apps/cli/package.json'))"], {
        cwd: repoRoot,
        encoding: "utf8",
      }),
    ) as { version: string };
    expect(v.version).toBe(cli.version);
    expect(v.commit).toMatch(/^[0-9a-f]{40}(-dirty)?$/);
    expect(v.proto).toBe("llmgw.v1");
    expect(v.storeSchema).toBeGreaterThanOrEqual(6);
    // better-sqlite3 was compiled by the install, inside the package, not borrowed from the repo.
    expect(
      existsSync(
        path.join(
          installed,
          "node_modules",
          "better-sqlite3",
          "build",
          "Release",
          "better_sqlite3.node",
        ),
      ),
    ).toBe(true);
  });

  it("runs the demo and the inventory from the npm install", async () => {
    const bin = path.join(prefix, "bin", "llmgw");
    const demo = await llmgw(bin, demoArgs());
    expect(`${demo.stdout}${demo.stderr}`).toContain("every step worked");
    const inv = JSON.parse((await llmgw(bin, ["agent", "inventory", "--json"])).stdout) as {
      agentVersion: string;
      host: { cpuCount: number };
    };
    expect(inv.agentVersion).toBe(
      JSON.parse((await llmgw(bin, ["version", "--json"])).stdout).version,
    );
    expect(inv.host.cpuCount).toBeGreaterThan(0);
    // Without a cached llama-server an install says how to get one, rather than failing to run
    // a build script it does not have.
    const withLlama = demoArgs().filter((a) => a !== "--no-llamacpp");
    const refused = await llmgw(bin, withLlama).catch(
      (e: { code?: number; stdout?: string; stderr?: string }) => e,
    );
    expect((refused as { code?: number }).code).not.toBe(0);
    expect(`${refused.stdout}${refused.stderr}`).toContain("this install cannot build one");
  }, 300_000);

  it.skipIf(llamaServerCache() === undefined)(
    `runs the demo's real llama.cpp model from the npm install with this machine's cached llama-server${llamaServerCache() === undefined ? " (skipped: scripts/build-llamacpp.sh has not built one here)" : ""}`,
    async () => {
      const bin = path.join(prefix, "bin", "llmgw");
      const args = demoArgs().filter((a) => a !== "--no-llamacpp");
      const demo = await run(bin, args, {
        env: { ...env, LLMGW_CACHE_DIR: llamaServerCache() },
        timeout: 300_000,
        maxBuffer: 16 << 20,
      });
      const out = `${demo.stdout}${demo.stderr}`;
      expect(out).toContain(`llama-server: ${llamaServerCache()}/llama.cpp/`);
      expect(out).toContain("every step worked");
    },
    300_000,
  );

  it("lays out a .deb from the same install that dpkg-deb reads and that runs", async () => {
    const built = await run(
      "npx",
      ["tsx", "scripts/package.ts", "--no-build", "--out", out, "--deb", "--installed", installed],
      { cwd: repoRoot, timeout: 300_000 },
    );
    deb = built.stdout.trim().split("\n").pop() ?? "";
    expect(path.basename(deb)).toMatch(/^llmgw_\d+\.\d+\.\d+_[a-z0-9]+\.deb$/);
    const field = async (name: string) =>
      (await run("dpkg-deb", ["--field", deb, name])).stdout.trim();
    expect(await field("Package")).toBe("llmgw");
    expect(await field("Depends")).toMatch(
      /^nodejs \(>= \d+\), nodejs \(<< \d+\), libc6, libstdc\+\+6, adduser$/,
    );
    const contents = (await run("dpkg-deb", ["--contents", deb], { maxBuffer: 64 << 20 })).stdout;
    for (const want of [
      "./usr/bin/llmgw -> ../lib/llmgw/dist/main.js",
      "./lib/systemd/system/llmgw-agent.service",
      "./lib/systemd/system/llmgw-control-plane.service",
      "./lib/systemd/system/llmgw-router.service",
      "./usr/share/doc/llmgw/copyright",
      "./usr/share/man/man1/llmgw.1.gz",
    ]) {
      expect(contents).toContain(want);
    }
    // The env files hold join and HF tokens: root only, and the operator's edits survive upgrades.
    expect(contents).toMatch(
      /-rw------- root\/root +\d+ [\d-]+ [\d:]+ \.\/etc\/llmgw\/agent\.env\n/,
    );
    const control = path.join(root, "control");
    await run("dpkg-deb", ["--control", deb, control]);
    expect(readFileSync(path.join(control, "conffiles"), "utf8").split("\n").sort()).toEqual([
      "",
      "/etc/llmgw/agent.env",
      "/etc/llmgw/control-plane.env",
      "/etc/llmgw/router.env",
    ]);
    // Maintainer scripts create the user and never start or restart a unit.
    const postinst = readFileSync(path.join(control, "postinst"), "utf8");
    expect(postinst).toContain("adduser --system");
    expect(postinst).not.toMatch(/systemctl (start|restart|try-restart|reload-or-restart)/);
    const x = path.join(root, "deb");
    await run("dpkg-deb", ["-x", deb, x]);
    expect(readlinkSync(path.join(x, "usr", "bin", "llmgw"))).toBe("../lib/llmgw/dist/main.js");
    expect(statSync(path.join(x, "etc", "llmgw", "agent.env")).mode & 0o777).toBe(0o600);
    // llmgw(1) is the installed binary's own help: the overview and every command's --help.
    const page = gunzipSync(
      readFileSync(path.join(x, "usr", "share", "man", "man1", "llmgw.1.gz")),
    ).toString();
    expect(page).toMatch(/^\.TH LLMGW 1 /);
    for (const c of ["agent", "control-plane", "router", "deploy", "gpu clear", "version"]) {
      expect(page).toContain(`.SS "llmgw ${c}"`);
    }
    expect(page).toContain("Usage: llmgw deploy NAME --model M --engine E [options]");
    // Nothing built for another system, or for building, is shipped.
    const zmqBuilds = path.join(x, "usr", "lib", "llmgw", "node_modules", "zeromq", "build");
    expect(readdirSync(zmqBuilds).sort()).toEqual(["linux", "manifest.json"]);
    const demo = await llmgw(path.join(x, "usr", "bin", "llmgw"), demoArgs());
    expect(`${demo.stdout}${demo.stderr}`).toContain("every step worked");
  }, 600_000);

  it.skipIf(!hasLintian())(
    `lintian finds no errors in the .deb${hasLintian() ? "" : " (skipped: lintian is not installed)"}`,
    async () => {
      expect(deb).not.toBe("");
      const lint = await run(
        "lintian",
        ["--fail-on", "error", "--suppress-tags-from-file", suppressions(), deb],
        {
          timeout: 300_000,
          maxBuffer: 16 << 20,
        },
      ).catch((e: { stdout?: string; stderr?: string; code?: number }) => e);
      expect(lint.stdout ?? "", lint.stderr).not.toMatch(/^E: /m);
    },
    300_000,
  );
});

/** This machine's llmgw cache when it holds a built llama-server (the README's set-up builds one). */
function llamaServerCache(): string | undefined {
  const cacheDir = process.env.LLMGW_CACHE_DIR ?? path.join(homedir(), ".cache", "llmgw");
  return findLlamaServer({ cacheDir }) === undefined ? undefined : cacheDir;
}

function hasLintian(): boolean {
  try {
    execFileSync("lintian", ["--version"], { stdio: "ignore" });
    return true;
  } catch {
    return false;
  }
}

function suppressions(): string {
  return path.join(repoRoot, "deploy", "debian", "lintian-suppressions");
}
