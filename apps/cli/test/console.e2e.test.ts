/**
 * The web console end to end in a real headless Chromium (Debian's `chromium`, driven by
 * playwright-core: no browser download), against a real control plane and two agents on
 * simulated nodes running simulated engines. Every page is screenshotted into
 * test-artifacts/console/ (not committed) and checked with axe-core.
 */
import { appendFileSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";
import { BudgetPeriod, PriorityClass, ReplicaState } from "@llmgw/proto";
import OpenAI from "openai";
import { type Browser, chromium, type Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  AgentProc,
  ControlPlaneProc,
  deployment,
  deploySimReady,
  ensureCliBuilt,
  freePort,
  repoRoot,
  simDeployment,
  stopAll,
  tempRoot,
  waitFor,
} from "./cluster-harness.js";

const CHROMIUM = "/usr/bin/chromium";
const haveChromium = (() => {
  try {
    readFileSync(CHROMIUM);
    return true;
  } catch {
    return false;
  }
})();
const artifacts = path.join(repoRoot, "test-artifacts", "console");
const axeSource = readFileSync(
  createRequire(import.meta.url).resolve("axe-core/axe.min.js"),
  "utf8",
);

/** health-formats.md §1.3, verbatim but for its PCI id (the simulated GPU 0's bus). */
const XID79 = "NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.";

const root = tempRoot("llmgw-e2e-console-");
let cp: ControlPlaneProc;
let kernelLog: string;
let browser: Browser;
let page: Page;

/** Waits for the page to show `selector` (playwright's own polling; no sleeps). */
async function shows(selector: string, timeout = 15_000): Promise<void> {
  await page.locator(selector).first().waitFor({ state: "visible", timeout });
}

/** axe-core on the page as it is: serious and critical violations, described. */
async function accessibilityProblems(): Promise<string[]> {
  await page.evaluate(axeSource);
  // A string, not a function: this file is typed for Node, without the DOM's names.
  const result = (await page.evaluate("axe.run(document)")) as {
    violations: { id: string; impact: string; help: string; nodes: { target: string[] }[] }[];
  };
  return result.violations
    .filter((v) => v.impact === "serious" || v.impact === "critical")
    .map(
      (v) =>
        `${v.id} (${v.impact}): ${v.help} at ${v.nodes.map((n) => n.target.join(" ")).join(", ")}`,
    );
}

/** Screenshot and accessibility check of the page now shown. */
async function checkPage(name: string): Promise<void> {
  await page.screenshot({ path: path.join(artifacts, `${name}.png`), fullPage: true });
  expect(await accessibilityProblems(), `axe on the ${name} page`).toEqual([]);
}

beforeAll(async () => {
  if (!haveChromium) return;
  ensureCliBuilt();
  mkdirSync(artifacts, { recursive: true });
  cp = new ControlPlaneProc(root, await freePort(), await freePort(), [
    "--heartbeat-interval",
    "500ms",
    // "broken" fails on one node, moves to the other and fails there too: it then stays, and
    // its deployment avoids the first node. The Xid below takes gpu-a out whole (its action is
    // a reboot); gpu-b and gpu-c each have a GPU free for it even with both of chat's
    // replicas there.
    "--move-failed-after",
    "2s",
  ]);
  await cp.start();
  kernelLog = path.join(root, "gpu-a.kmsg");
  writeFileSync(kernelLog, "");
  // "broken" below must stay failed while the page shows it: no relaunch within the test.
  const noRelaunch = ["--relaunch-failed", "3600"];
  new AgentProc(root, "gpu-a", "2xh100-80g@ib-a", cp).start([
    "--kernel-log",
    kernelLog,
    ...noRelaunch,
  ]);
  new AgentProc(root, "gpu-b", "3xh100-80g@ib-a", cp).start(noRelaunch);
  new AgentProc(root, "gpu-c", "3xh100-80g@ib-a", cp).start(noRelaunch);
  await waitFor("the three agents to register", async () => {
    const res = await cp.admin().listNodes({}, cp.adminHeaders());
    return res.nodes.length === 3 ? true : undefined;
  });
  await deploySimReady(cp, "chat");
  // An engine that fails while loading: its replica ends FAILED with the engine's last lines.
  await cp.admin().applyDeployment(
    {
      deployment: simDeployment("broken", {
        gpuClass: "h100-80g",
        replicas: 1,
        extraArgs: ["--fail-load"],
      }),
    },
    cp.adminHeaders(),
  );
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    // Chromium's sandbox needs an unprivileged user; tests run as root here.
    args: process.getuid?.() === 0 ? ["--no-sandbox"] : [],
  });
  page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
  // Any script error or CSP refusal on any page fails the run.
  const consoleErrors: string[] = [];
  page.on("pageerror", (e) => consoleErrors.push(e.message));
  page.on("console", (m) => {
    if (m.type() === "error" && !/Failed to load resource/.test(m.text()))
      consoleErrors.push(m.text());
  });
  (globalThis as { consoleErrors?: string[] }).consoleErrors = consoleErrors;
}, 180_000);

afterAll(async () => {
  await browser?.close();
  await stopAll([root]);
});

describe.skipIf(!haveChromium)("the web console in Chromium", { timeout: 120_000 }, () => {
  it("refuses a wrong admin token and logs in with the right one", async () => {
    await page.goto(`${cp.controlUrl}/ui/`);
    await shows("#token");
    await checkPage("login");
    await page.fill("#token", "not-the-token");
    await page.click("button[type=submit]");
    await shows("[role=alert]");
    expect(await page.textContent("[role=alert]")).toMatch(/wrong token/);
    await page.fill("#token", cp.token(true));
    await page.click("button[type=submit]");
    await shows("h1:text('Fleet')");
    // The token is in no URL and nothing the page stored.
    expect(page.url()).not.toContain(cp.token(true));
    const stored = await page.evaluate("JSON.stringify({ ...localStorage, ...sessionStorage })");
    expect(stored).toBe("{}");
    const cookies = await page.context().cookies();
    expect(cookies.map((c) => [c.name, c.httpOnly, c.sameSite])).toEqual([
      ["llmgw_session", true, "Strict"],
    ]);
  });

  it("shows the fleet: every node, their simulated GPUs with the right classes", async () => {
    await shows('[data-node="gpu-a"] [data-gpu]');
    await shows('[data-node="gpu-b"] [data-gpu]');
    await shows('[data-node="gpu-c"] [data-gpu]');
    expect(await page.locator('[data-node="gpu-a"] [data-gpu]').count()).toBe(2);
    expect(await page.locator('[data-node="gpu-b"] [data-gpu]').count()).toBe(3);
    expect(await page.locator('[data-node="gpu-c"] [data-gpu]').count()).toBe(3);
    const classes = await page.locator("[data-gpu] .gpu-class").allTextContents();
    expect(classes).toEqual(Array(8).fill("h100-80g"));
    expect(await page.locator('[data-gpu][data-health="healthy"]').count()).toBe(8);
    expect(await page.textContent('[data-island="h100-80g/ib-a"]')).toMatch(/h100-80g/);
    await checkPage("fleet");
  });

  it("shows a GPU made unhealthy by an Xid as unhealthy, with its reason, without a reload", async () => {
    const started = Date.now();
    appendFileSync(kernelLog, `${XID79}\n`);
    const sick = '[data-node="gpu-a"] [data-gpu="0"][data-health="unhealthy"]';
    await shows(sick);
    const elapsed = Date.now() - started;
    console.log(`console: GPU unhealthy on the page ${elapsed} ms after the Xid was logged`);
    expect(await page.textContent(`${sick} [data-reasons]`)).toMatch(/79|fallen off the bus/i);
    await checkPage("fleet-unhealthy");
  });

  it("scales a deployment from the deployments page, after a confirmation", async () => {
    await page.click("nav a[href='#/deployments']");
    const chat = page.locator('[data-deployment="chat"]');
    await chat.waitFor();
    await checkPage("deployments");
    await chat.locator("input[type=number]").fill("2");
    await chat.locator("button[type=submit]").click();
    const dialog = page.locator("dialog[open]");
    await dialog.waitFor();
    expect(await dialog.textContent()).toMatch(/from 1 to 2 replicas/);
    await dialog.locator("button:text('Scale to 2')").click();
    await waitFor(
      "chat to have 2 ready replicas",
      async () => {
        const d = await deployment(cp, "chat");
        return d?.desiredReplicas === 2 && d.readyReplicas === 2 ? true : undefined;
      },
      60_000,
    );
    await shows('[data-deployment="chat"] .badge:text("2/2 ready")');
  });

  it("shows a failing replica's engine log tail, and the node its deployment avoids", async () => {
    const { failed, avoided } = await waitFor(
      "broken's replica to fail with its log on the second node",
      async () => {
        const d = await deployment(cp, "broken");
        const r = d?.replicas[0];
        return r?.ranks[0]?.status?.state === ReplicaState.FAILED &&
          (r.ranks[0].status.logTail.length ?? 0) > 0 &&
          d?.avoided.length === 1
          ? { failed: r, avoided: d.avoided[0]?.message ?? "" }
          : undefined;
      },
      150_000,
    );
    expect(avoided).toMatch(
      /^gpu-[ab] is avoided until \S+Z: a replica kept failing there and moved; 'llmgw unavoid broken gpu-[ab]-\w+' lifts it$/,
    );
    await page.click("nav a[href='#/deployments']");
    await shows('[data-deployment="broken"] [data-avoided]');
    expect(await page.textContent('[data-deployment="broken"] [data-avoided]')).toContain(avoided);
    await checkPage("deployments-avoided");
    await page.locator(`[data-replica="${failed.replicaId}"] a`).click();
    await shows("[data-log-tail]");
    expect(await page.textContent("[data-log-tail]")).toMatch(/simulated fault --fail-load/);
    expect(await page.textContent("main")).toMatch(/failed/);
    await checkPage("replica");
  }, 180_000);

  it("creates a key that works with the openai client, and shows its secret once", async () => {
    const model = (await deployment(cp, "chat"))?.spec?.servedModelName ?? "";
    expect(model).not.toBe("");
    await page.click("nav a[href='#/keys']");
    await shows("#key-name");
    await page.fill("#key-name", "from-the-console");
    await page.fill("#key-models", model);
    await page.click("button:text('Create key')");
    await shows("[data-secret]");
    const secret = ((await page.textContent("[data-secret]")) ?? "").trim();
    expect(secret.length).toBeGreaterThan(20);
    await checkPage("keys-created");
    await page.click("button:text('I have copied it')");
    await shows('[data-key="from-the-console"]');
    expect(await page.content()).not.toContain(secret);
    await page.reload();
    await shows('[data-key="from-the-console"]');
    expect(await page.content()).not.toContain(secret);

    const openai = new OpenAI({ baseURL: `${cp.publicUrl}/v1`, apiKey: secret, maxRetries: 0 });
    const answer = await openai.chat.completions.create({
      model,
      messages: [{ role: "user", content: "hello from the console test" }],
      max_tokens: 8,
    });
    expect(answer.choices[0]?.message.content?.length).toBeGreaterThan(0);
    // The key is limited to that model: another one is refused.
    await expect(
      openai.chat.completions.create({
        model: "broken",
        messages: [{ role: "user", content: "x" }],
      }),
    ).rejects.toThrow();
    await checkPage("keys");
  });

  it("shows each tenant, and what its keys used by model", async () => {
    const model = (await deployment(cp, "chat"))?.spec?.servedModelName ?? "";
    await cp.admin().createTenant(
      {
        tenant: {
          name: "search",
          requestsPerMinute: 600,
          budgets: [{ period: BudgetPeriod.DAY, tokens: 1_000_000n }],
          priority: PriorityClass.CRITICAL,
          weight: 2,
        },
      },
      cp.adminHeaders(),
    );
    const { secret } = await cp
      .admin()
      .createApiKey({ name: "search-key", tenant: "search" }, cp.adminHeaders());
    const openai = new OpenAI({ baseURL: `${cp.publicUrl}/v1`, apiKey: secret, maxRetries: 0 });
    const answer = await openai.chat.completions.create({
      model,
      messages: [{ role: "user", content: "what did the search team use?" }],
      max_tokens: 8,
    });
    await page.click("nav a[href='#/tenants']");
    await shows('[data-tenant="search"]');
    const cells = await page.locator('[data-tenant="search"] td').allTextContents();
    expect(cells).toEqual([
      "search",
      "critical",
      "2",
      "as each router is set",
      "600",
      "none",
      "none",
      "day: 1,000,000",
      "1",
      "Edit Delete",
    ]);
    // The router reports usage every few seconds, and the page asks every 15 s.
    const row = `[data-usage="search/${model}"]`;
    await shows(row, 60_000);
    expect(await page.textContent(`${row} [data-requests]`)).toBe("1");
    expect(await page.textContent(`${row} [data-completion]`)).toBe(
      String(answer.usage?.completion_tokens),
    );
    // The answer's cached tokens where it had some; "—" where the router cannot tell a 0 left
    // out from an engine that never reports them (it had seen none from this replica yet).
    const cached = answer.usage?.prompt_tokens_details?.cached_tokens;
    expect(await page.textContent(`${row} [data-cached]`)).toBe(
      cached === undefined ? "—" : String(cached),
    );
    await checkPage("tenants");

    // A tenant made on the page, refused first for its name, then deleted after a confirmation.
    await page.fill("#tenant-name", "Ops Team");
    await page.click("button:text('Create tenant')");
    await shows("[role=alert]");
    expect(await page.textContent("[role=alert]")).toMatch(/Ops Team/);
    await page.fill("#tenant-name", "ops");
    await page.selectOption("#tenant-priority", "batch");
    await page.fill("#tenant-day", "5000000000");
    await page.click("button:text('Create tenant')");
    await shows('[data-tenant="ops"]');
    expect(await page.locator('[data-tenant="ops"] td').allTextContents()).toEqual([
      "ops",
      "batch",
      "1",
      "as each router is set",
      "none",
      "none",
      "none",
      "day: 5,000,000,000",
      "0",
      "Edit Delete",
    ]);
    const [made] = (await cp.admin().listTenants({}, cp.adminHeaders())).tenants.filter(
      (t) => t.name === "ops",
    );
    expect(made?.budgets.map((b) => [b.period, b.tokens])).toEqual([
      [BudgetPeriod.DAY, 5_000_000_000n],
    ]);
    await page.click('[data-tenant="ops"] button:text("Delete")');
    await page.click('dialog button.danger:text("Delete")');
    await page.locator('[data-tenant="ops"]').waitFor({ state: "detached" });
    // A tenant with keys is not deleted: the dialog says why and stays.
    await page.click('[data-tenant="search"] button:text("Delete")');
    await page.click('dialog button.danger:text("Delete")');
    await shows("dialog [role=alert]");
    expect(await page.textContent("dialog [role=alert]")).toMatch(/key/);
    await page.click('dialog button:text("Cancel")');
    await shows('[data-tenant="search"]');

    // A key made on the keys page for the tenant counts among its keys.
    await page.click("nav a[href='#/keys']");
    // An option of a closed select is never "visible": wait for it to be there.
    await page.locator("#key-tenant option[value='search']").waitFor({ state: "attached" });
    await page.fill("#key-name", "search-two");
    await page.selectOption("#key-tenant", "search");
    await page.click("button:text('Create key')");
    await shows("[data-secret]");
    await page.click("button:text('I have copied it')");
    await shows('[data-key="search-two"]');
    expect(await page.locator('[data-key="search-two"] td').nth(1).textContent()).toBe("search");
    await page.click("nav a[href='#/tenants']");
    await page.locator('[data-tenant="search"] td:nth-child(9):text-is("2")').waitFor();
  });

  it("edits a tenant on the page: only what changed, its budgets of one model kept", async () => {
    const model = (await deployment(cp, "chat"))?.spec?.servedModelName ?? "";
    const search = async () =>
      (await cp.admin().listTenants({}, cp.adminHeaders())).tenants.find(
        (t) => t.name === "search",
      );
    // A budget of one model, set through the API: the page shows it but does not edit it.
    await cp.admin().updateTenant(
      {
        tenant: {
          name: "search",
          budgets: [
            ...((await search())?.budgets ?? []),
            { period: BudgetPeriod.MONTH, model, tokens: 40_000_000n },
          ],
        },
        fields: ["budgets"],
      },
      cp.adminHeaders(),
    );
    // Another page and back: the table asks again now rather than at its next poll.
    await page.click("nav a[href='#/keys']");
    await page.click("nav a[href='#/tenants']");
    const row = page.locator('[data-tenant="search"]');
    await row.locator(`td:nth-child(8):has-text("month (${model})")`).waitFor();

    await row.locator('button:text("Edit")').click();
    const dialog = page.locator("dialog[open]");
    await dialog.waitFor();
    const shown = async () =>
      Promise.all(
        ["priority", "weight", "isolation", "rpm", "tpm", "concurrency", "day", "month"].map((f) =>
          page.inputValue(`#edit-tenant-${f}`),
        ),
      );
    // Filled in as the row reads; an unset limit or budget is empty, never 0.
    expect(await shown()).toEqual(["critical", "2", "", "600", "", "", "1000000", ""]);
    expect(await dialog.textContent()).toContain(`month (${model}): 40,000,000`);
    await checkPage("tenants-edit");

    // Refused on the page before anything is sent: the dialog says why and stays.
    await page.fill("#edit-tenant-weight", "0");
    await dialog.locator('button:text("Save changes")').click();
    await shows("dialog [role=alert]");
    expect(await page.textContent("dialog [role=alert]")).toBe("weight: a whole number in 1–1000");
    await page.fill("#edit-tenant-weight", "2");
    await page.fill("#edit-tenant-rpm", "");
    await page.fill("#edit-tenant-tpm", "20000");
    await page.fill("#edit-tenant-day", "2000000");
    await page.selectOption("#edit-tenant-isolation", "tenant");
    await dialog.locator('button:text("Save changes")').click();
    await dialog.waitFor({ state: "detached" });
    const after = await search();
    expect(after?.requestsPerMinute).toBeUndefined();
    expect(after?.tokensPerMinute).toBe(20_000);
    expect([after?.priority, after?.weight, after?.maxConcurrency]).toEqual([
      PriorityClass.CRITICAL,
      2,
      undefined,
    ]);
    expect(after?.cacheIsolation).toBe("tenant");
    expect(after?.budgets.map((b) => [b.period, b.model, b.tokens])).toEqual([
      [BudgetPeriod.DAY, "", 2_000_000n],
      [BudgetPeriod.MONTH, model, 40_000_000n],
    ]);
    // The table shows the change without waiting for its next poll.
    await row.locator('td:nth-child(6):text-is("20000")').waitFor({ timeout: 5_000 });
    expect(await row.locator("td").allTextContents()).toEqual([
      "search",
      "critical",
      "2",
      "apart from other tenants",
      "none",
      "20000",
      "none",
      `day: 2,000,000; month (${model}): 40,000,000`,
      "2",
      "Edit Delete",
    ]);

    // Refused by the control plane: a day's budget on top of the 32 budgets of one model a
    // tenant may have. Its message shows in the dialog, which keeps what was typed.
    await cp.admin().createTenant(
      {
        tenant: {
          name: "crowded",
          budgets: Array.from({ length: 32 }, (_, i) => ({
            period: BudgetPeriod.DAY,
            model: `model-${i}`,
            tokens: 1_000n,
          })),
        },
      },
      cp.adminHeaders(),
    );
    await page.click("nav a[href='#/keys']");
    await page.click("nav a[href='#/tenants']");
    await page.click('[data-tenant="crowded"] button:text("Edit")');
    await dialog.waitFor();
    await page.fill("#edit-tenant-day", "5000");
    await dialog.locator('button:text("Save changes")').click();
    await shows("dialog [role=alert]");
    expect(await page.textContent("dialog [role=alert]")).toBe(
      "tenant crowded may have at most 32 budgets (got 33)",
    );
    expect(await page.inputValue("#edit-tenant-day")).toBe("5000");
    await dialog.locator('button:text("Cancel")').click();
    await dialog.waitFor({ state: "detached" });
    const crowded = (await cp.admin().listTenants({}, cp.adminHeaders())).tenants.find(
      (t) => t.name === "crowded",
    );
    expect(crowded?.budgets.length).toBe(32);
    await cp.admin().deleteTenant({ name: "crowded" }, cp.adminHeaders());
  });

  it("shows new events live, without a reload", async () => {
    await page.click("nav a[href='#/events']");
    await shows("table.events tbody tr");
    expect(await page.locator('[data-event="node.cordoned"]').count()).toBe(0);
    await cp.admin().cordonNode({ node: "gpu-b" }, cp.adminHeaders());
    await shows('[data-event="node.cordoned"]');
    expect(await page.textContent('[data-event="node.cordoned"]')).toMatch(/gpu-b/);
    await cp.admin().uncordonNode({ node: "gpu-b" }, cp.adminHeaders());
    await shows('[data-event="node.uncordoned"]');
    await checkPage("events");
  });

  it("lists the routers, the in-process one among them", async () => {
    await page.click("nav a[href='#/routers']");
    await shows('[data-router="in-process"]');
    // How it keeps tenants' caches apart, as it told the control plane.
    expect(await page.textContent('[data-router="in-process"] [data-isolation]')).toBe("none");
    await checkPage("routers");
  });

  it("logs out: the page asks for the token again and the old session is dead", async () => {
    await page.click("button:text('Log out')");
    await shows("#token");
    await page.reload();
    await shows("#token");
    const status = await page.evaluate(async () => (await fetch("/ui/api/session")).status);
    expect(status).toBe(401);
    expect((globalThis as { consoleErrors?: string[] }).consoleErrors).toEqual([]);
  });
});
