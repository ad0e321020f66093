/**
 * Writes the fixture stores of apps/control-plane/test/fixtures/stores/: for each schema
 * version an earlier release shipped, the last commit of main at that version is built from git
 * history (apps/cli/test/previous-release.ts), its control plane and agent run on loopback, and
 * state goes in through its own API — an API key, a simulated deployment its agent makes ready,
 * a node. The store file it leaves is compacted into `v<N>-<commit>.sqlite`, beside a manifest
 * of what that release reported holding (never written by hand). The fixture test opens each
 * with this release.
 *
 *   node --conditions=@llmgw/source --import tsx scripts/make-store-fixtures.ts [COMMIT...]
 *
 * Without arguments, the commits of RELEASE_COMMITS.
 */
import { execFileSync } from "node:child_process";
import { mkdirSync, rmSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";
import {
  AgentProc,
  ControlPlaneProc,
  deploySimReady,
  freePort,
  repoRoot,
  stopAll,
  tempRoot,
  waitFor,
} from "../apps/cli/test/cluster-harness.js";
import { previousControlPlane } from "../apps/cli/test/previous-release.js";

// The control plane's own better-sqlite3 (the repository root does not depend on it).
const Database = createRequire(path.join(repoRoot, "apps", "control-plane", "package.json"))(
  "better-sqlite3",
) as typeof import("better-sqlite3");

const FIXTURES = path.join(repoRoot, "apps", "control-plane", "test", "fixtures", "stores");
const say = (msg: string) => process.stderr.write(`make-store-fixtures: ${msg}\n`);
const git = (...args: string[]) =>
  execFileSync("git", ["-C", repoRoot, ...args], {
    encoding: "utf8",
    maxBuffer: 64 << 20,
    stdio: ["ignore", "pipe", "ignore"],
  }).trim();

/** What a fixture's manifest records, from the old release's own answers. */
export interface FixtureManifest {
  commit: string;
  committedAt: string;
  version: string;
  schemaVersion: number;
  deployments: { name: string; replicas: number; ready: number }[];
  apiKeys: { id: string; prefix: string }[];
  nodes: { id: string; hostname: string }[];
}

/** How many migrations a commit's store code lists. */
function schemaAt(commit: string): number | undefined {
  for (const f of [
    "apps/control-plane/src/store/migrations.ts",
    "apps/control-plane/src/store/sqlite-store.ts",
  ]) {
    let text: string;
    try {
      text = git("show", `${commit}:${f}`);
    } catch {
      continue;
    }
    const body = /export const MIGRATIONS[^=]*=\s*\[([\s\S]*?)\n\];/.exec(text)?.[1];
    if (body !== undefined) return body.split("\n").filter((l) => /^ {2}[`"]/.test(l)).length;
  }
  return undefined;
}

/**
 * One commit of main per schema version: for each earlier one the last at that version whose
 * control plane runs (v5's very last, 0f23957, is mid-way through the lifecycle work: its
 * cluster code already wants schema 6's tables), and for the current one a commit that writes
 * it, whose store must open with neither a migration nor a backup. When a migration is added,
 * replace the current one's with the last commit at that version and append the new one.
 */
const RELEASE_COMMITS = [
  "d49bdae",
  "b9e1633",
  "501984c",
  "013e902",
  "7e87454",
  "767f360",
  "5fce0e9",
  "09dc684",
  "c14dd55",
];

async function makeFixture(commit: string): Promise<void> {
  const { main, unavailable } = previousControlPlane(commit);
  if (unavailable)
    throw new Error(`${commit.slice(0, 7)}: its control plane cannot run: ${unavailable}`);
  const root = tempRoot("llmgw-fixture-");
  try {
    const cp = new ControlPlaneProc(root, await freePort(), await freePort(), [], main);
    await cp.start();
    const admin = cp.admin();
    const auth = cp.adminHeaders();
    const agent = new AgentProc(root, "fixture-node", "1xh100-80g", cp);
    agent.main = main;
    agent.start(["--stop-engines"]);
    await waitFor("the old agent's node", async () =>
      (await admin.listNodes({}, auth)).nodes.length === 1 ? true : undefined,
    );
    await deploySimReady(cp);
    await admin.createApiKey({ name: "fixture", models: ["chat"], requestsPerMinute: 60 }, auth);
    const [deployments, keys, nodes, status] = await Promise.all([
      admin.listDeployments({}, auth),
      admin.listApiKeys({}, auth),
      admin.listNodes({}, auth),
      admin.getClusterStatus({}, auth),
    ]);
    await agent.kill("SIGTERM");
    await cp.stop();
    const file = path.join(cp.dataDir, "state.db");
    const db = new Database(file, { readonly: true });
    const schemaVersion = db.pragma("user_version", { simple: true }) as number;
    const name = `v${schemaVersion}-${commit.slice(0, 7)}`;
    const out = path.join(FIXTURES, `${name}.sqlite`);
    rmSync(out, { force: true });
    db.prepare("VACUUM INTO ?").run(out);
    db.close();
    const manifest: FixtureManifest = {
      commit,
      committedAt: git("log", "-1", "--format=%cI", commit),
      version: status.version,
      schemaVersion,
      deployments: deployments.deployments.map((d) => ({
        name: d.spec?.name ?? "",
        replicas: d.desiredReplicas,
        ready: d.readyReplicas,
      })),
      apiKeys: keys.keys.map((k) => ({ id: k.id, prefix: k.prefix })),
      nodes: nodes.nodes.map((n) => ({ id: n.nodeId, hostname: n.hostname })),
    };
    writeFileSync(path.join(FIXTURES, `${name}.json`), `${JSON.stringify(manifest, null, 2)}\n`);
    say(
      `${name}.sqlite: ${manifest.deployments.length} deployment, ${manifest.apiKeys.length} key, ${manifest.nodes.length} node`,
    );
  } finally {
    await stopAll([root]);
  }
}

async function main(): Promise<void> {
  const commits = process.argv.length > 2 ? process.argv.slice(2) : RELEASE_COMMITS;
  mkdirSync(FIXTURES, { recursive: true });
  for (const c of commits) {
    say(`building and running ${c.slice(0, 7)} (schema ${schemaAt(c)})`);
    await makeFixture(git("rev-parse", c));
  }
}

await main();
