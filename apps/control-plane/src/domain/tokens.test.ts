import { mkdtempSync, readFileSync, rmSync, statSync, unlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { hashSecret, initDataDir, readToken, secretsEqual } from "./tokens.js";

let root: string;
beforeEach(() => {
  root = mkdtempSync(join(tmpdir(), "llmgw-tokens-"));
});
afterEach(() => rmSync(root, { recursive: true, force: true }));

describe("initDataDir", () => {
  it("creates an owner-only dir and token files on first start, and keeps them after", () => {
    const dir = join(root, "cp");
    const first = initDataDir(dir);
    expect(first.initialisedBefore).toBe(false);
    expect(statSync(dir).mode & 0o777).toBe(0o700);
    for (const f of ["join-token", "admin-token", "router-token"])
      expect(statSync(join(dir, f)).mode & 0o777).toBe(0o600);
    expect(first.joinToken).toMatch(/^llmgw-join-[A-Za-z0-9_-]{43}$/);
    expect(first.adminToken).toMatch(/^llmgw-admin-[A-Za-z0-9_-]{43}$/);
    expect(first.routerToken).toMatch(/^llmgw-router-[A-Za-z0-9_-]{43}$/);
    expect(new Set([first.joinToken, first.adminToken, first.routerToken]).size).toBe(3);
    expect(readFileSync(join(dir, "join-token"), "utf8")).toBe(`${first.joinToken}\n`);
    const again = initDataDir(dir);
    expect(again).toMatchObject({
      joinToken: first.joinToken,
      adminToken: first.adminToken,
      routerToken: first.routerToken,
      initialisedBefore: true,
    });
    expect(readToken(dir, "admin")).toBe(first.adminToken);
    expect(readToken(dir, "router")).toBe(first.routerToken);
  });

  it("gives a data dir made before routers existed a router token on its next start", () => {
    const dir = join(root, "cp");
    const first = initDataDir(dir);
    unlinkSync(join(dir, "router-token"));
    expect(() => readToken(dir, "router")).toThrow(`no router token in ${dir}`);
    const again = initDataDir(dir);
    expect(again).toMatchObject({
      joinToken: first.joinToken,
      adminToken: first.adminToken,
      initialisedBefore: true,
    });
    expect(again.routerToken).toMatch(/^llmgw-router-/);
    expect(again.routerToken).not.toBe(first.routerToken);
    expect(statSync(join(dir, "router-token")).mode & 0o777).toBe(0o600);
    expect(readToken(dir, "router")).toBe(again.routerToken);
  });

  it("refuses an emptied token file and explains a missing one", () => {
    const dir = join(root, "cp");
    initDataDir(dir);
    writeFileSync(join(dir, "admin-token"), "\n");
    expect(() => initDataDir(dir)).toThrow(/token file .*admin-token is empty/);
    expect(() => readToken(join(root, "other"), "join")).toThrow(
      `no join token in ${join(root, "other")}: start the control plane once with --data-dir ${join(root, "other")} to create it`,
    );
  });
});

describe("secrets", () => {
  it("hashes with sha256 and compares in constant time", () => {
    expect(hashSecret("abc")).toBe(
      "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
    );
    expect(secretsEqual("a", "a")).toBe(true);
    expect(secretsEqual("a", "b")).toBe(false);
    expect(secretsEqual("a", "ab")).toBe(false);
  });
});
