import fc from "fast-check";
import { describe, expect, it } from "vitest";
import {
  analyzeByParsing,
  analyzeByScanning,
  analyzeRequestBody,
  SCAN_THRESHOLD_BYTES,
} from "./analyze.js";
import type { ApiKeyInfo } from "./api-keys.js";
import { promptKeys } from "./block-hash.js";
import {
  CACHE_ISOLATION_MODES,
  ISOLATED_SALT_PREFIX,
  isolatedSalt,
  isolationMembers,
  isolationScope,
} from "./cache-isolation.js";

const tenantKey: ApiKeyInfo = { id: "k1", name: "one", tenant: { name: "search", weight: 1 } };
const loneKey: ApiKeyInfo = { id: "k2", name: "two" };

describe("isolationScope", () => {
  it("is none's nothing, a tenant's name, or a key's id", () => {
    expect(isolationScope("none", tenantKey)).toBeUndefined();
    expect(isolationScope("tenant", tenantKey)).toBe("tenant\0search");
    expect(isolationScope("tenant", loneKey)).toBe("key\0k2");
    expect(isolationScope("key", tenantKey)).toBe("key\0k1");
  });

  it("tells a tenant from a deleted one of its name by its creation time, where told", () => {
    const at = (createdAtMs: number): ApiKeyInfo => ({
      ...tenantKey,
      tenant: { name: "search", weight: 1, createdAtMs },
    });
    expect(isolationScope("tenant", at(1_700_000_000_000))).toBe(
      `tenant\0search\0${1_700_000_000_000}`,
    );
    expect(isolationScope("tenant", at(1_700_000_000_000))).not.toBe(
      isolationScope("tenant", at(1_700_000_500_000)),
    );
    // A control plane that does not tell the time: the name alone, as before.
    expect(isolationScope("tenant", tenantKey)).toBe("tenant\0search");
    // A key naming a tenant the routing state does not hold: alone, not in a name's scope.
    const stray: ApiKeyInfo = {
      ...tenantKey,
      tenant: { name: "search", weight: 1, ungranted: true },
    };
    expect(isolationScope("tenant", stray)).toBe("key\0k1");
  });

  it("applies the stricter of the router's mode and the tenant's own", () => {
    const asking = (cacheIsolation: "tenant" | "key"): ApiKeyInfo => ({
      ...tenantKey,
      tenant: { name: "search", weight: 1, cacheIsolation },
    });
    // A router that shares caches still keeps an asking tenant's apart.
    expect(isolationScope("none", asking("tenant"))).toBe("tenant\0search");
    expect(isolationScope("none", asking("key"))).toBe("key\0k1");
    // A stricter router stays stricter.
    expect(isolationScope("key", asking("tenant"))).toBe("key\0k1");
    expect(isolationScope("tenant", asking("key"))).toBe("key\0k1");
    expect(isolationScope("tenant", asking("tenant"))).toBe("tenant\0search");
    // Other tenants, and keys without one, as the router's mode says.
    expect(isolationScope("none", tenantKey)).toBeUndefined();
    expect(isolationScope("none", loneKey)).toBeUndefined();
    // A word it does not know (a later release's): the strictest it has.
    const later = {
      ...tenantKey,
      tenant: { name: "search", weight: 1, cacheIsolation: "enclave" },
    };
    expect(isolationScope("none", later as ApiKeyInfo)).toBe("key\0k1");
  });

  it("keeps a key whose tenant it does not hold alone, even on a router that shares", () => {
    // The tenant might be one that asks for isolation: its grant is what would say.
    const stray: ApiKeyInfo = {
      ...tenantKey,
      tenant: { name: "search", weight: 1, ungranted: true },
    };
    for (const mode of CACHE_ISOLATION_MODES) expect(isolationScope(mode, stray)).toBe("key\0k1");
  });

  it("keeps a tenant and a key of the same name apart", () => {
    const named: ApiKeyInfo = { id: "search", name: "s" };
    expect(isolationScope("tenant", tenantKey)).not.toBe(isolationScope("tenant", named));
  });
});

describe("isolatedSalt", () => {
  it("is a fixed-length hex hash behind the router's prefix", () => {
    for (const client of [undefined, "x", "y".repeat(1024)]) {
      const salt = isolatedSalt("tenant\0search", client);
      expect(salt).toMatch(new RegExp(`^${ISOLATED_SALT_PREFIX}[0-9a-f]{64}$`));
    }
  });

  it("gives the same salt for the same principal and client salt, and no other pair's", () => {
    fc.assert(
      fc.property(
        fc.tuple(
          fc.string({ minLength: 1 }),
          fc.option(fc.string({ minLength: 1 }), { nil: undefined }),
        ),
        fc.tuple(
          fc.string({ minLength: 1 }),
          fc.option(fc.string({ minLength: 1 }), { nil: undefined }),
        ),
        ([nameA, saltA], [nameB, saltB]) => {
          const a = isolatedSalt(`tenant\0${nameA.replaceAll("\0", "")}`, saltA);
          const b = isolatedSalt(`tenant\0${nameB.replaceAll("\0", "")}`, saltB);
          const same = nameA.replaceAll("\0", "") === nameB.replaceAll("\0", "") && saltA === saltB;
          expect(a === b).toBe(same);
        },
      ),
    );
  });

  it("never gives a client's salt back, nor one principal's to another's client", () => {
    const mine = isolatedSalt("tenant\0a", undefined);
    // Tenant b's client sends tenant a's salt as its own: it is hashed again under b.
    expect(isolatedSalt("tenant\0b", mine)).not.toBe(mine);
    // The boundary between the scope and the client's salt cannot be moved.
    expect(isolatedSalt("tenant\0a", "\0b")).not.toBe(isolatedSalt("tenant\0a\0", "b"));
  });
});

describe("isolationMembers", () => {
  const salt = isolatedSalt("key\0k", undefined);
  it("salts for engines that honour it, turns reuse off for llama.cpp, both when unknown", () => {
    expect(JSON.parse(`{${isolationMembers(salt, "salt")}}`)).toEqual({ cache_salt: salt });
    expect(JSON.parse(`{${isolationMembers(salt, "no-reuse")}}`)).toEqual({
      cache_prompt: false,
    });
    expect(JSON.parse(`{${isolationMembers(salt, undefined)}}`)).toEqual({
      cache_salt: salt,
      cache_prompt: false,
    });
  });
});

describe("body analysis under an isolation scope", () => {
  const content = "shared system prompt ".repeat(200);
  const body = (extra: Record<string, unknown> = {}) =>
    new TextEncoder().encode(
      JSON.stringify({ model: "m", messages: [{ role: "user", content }], ...extra }),
    );
  const chainOf = (a: ReturnType<typeof analyzeRequestBody>) => {
    if (!a.ok) throw new Error(a.message);
    return a;
  };

  it("keys the prompt under the router's salt, in both readers", () => {
    const scope = "tenant\0search";
    for (const read of [analyzeByParsing, analyzeByScanning]) {
      const a = chainOf(read(body(), {}, scope));
      const salt = isolatedSalt(scope, undefined);
      expect(a.isolatedSalt).toBe(salt);
      expect(a.salt).toBe(salt);
      // The prompt's pieces (`features.ts`: role, newline, content, newline) under the salt.
      const expected = promptKeys(["user", "\n", content, "\n"], {}, salt);
      expect(a.chain).toEqual(expected.chain);
      expect(a.quarters).toEqual(expected.quarters);
      const other = chainOf(read(body(), {}, "tenant\0other"));
      expect(other.chain[0]).not.toBe(a.chain[0]);
      // and never the unsalted prompt's keys
      const plain = chainOf(read(body()));
      expect(plain.isolatedSalt).toBeUndefined();
      const plainKeys = new Set(plain.chain);
      expect([...a.chain].filter((k) => plainKeys.has(k))).toEqual([]);
    }
  });

  it("folds the client's own salt into the router's", () => {
    const scope = "key\0k1";
    const a = chainOf(analyzeRequestBody(body({ cache_salt: "mine" }), {}, scope));
    expect(a.isolatedSalt).toBe(isolatedSalt(scope, "mine"));
    expect(a.isolatedSalt).not.toBe(isolatedSalt(scope, undefined));
  });

  it("leaves an analysis without a scope as it was", () => {
    const a = chainOf(analyzeRequestBody(body({ cache_salt: "mine" })));
    expect(a.isolatedSalt).toBeUndefined();
    expect(a.salt).toBe("mine");
    const scoped = chainOf(analyzeRequestBody(body({ cache_salt: "mine" }), {}, "key\0k1"));
    expect(scoped.chain).not.toEqual(a.chain);
  });
});

describe("a client's cache_salt of the router's own form", () => {
  it.each([
    ["as written", '"llmgw-0123"'],
    ["escaped", '"\\u006clmgw-0123"'],
  ])("is refused %s, in both readers, small and large, whatever the mode", (_name, salt) => {
    for (const padding of [0, SCAN_THRESHOLD_BYTES]) {
      const body = new TextEncoder().encode(
        `{"model":"m","cache_salt":${salt},"prompt":"${"p".repeat(padding)}"}`,
      );
      for (const read of [analyzeByParsing, analyzeByScanning]) {
        for (const scope of [undefined, "tenant\0t"]) {
          expect(read(body, {}, scope)).toEqual({
            ok: false,
            reason: "invalid_field",
            message:
              "`cache_salt` must not start with `llmgw-`: routers that keep tenants' caches apart set salts of that form",
            param: "cache_salt",
          });
        }
      }
    }
  });

  it("leaves other salts alone", () => {
    const body = new TextEncoder().encode('{"model":"m","cache_salt":"LLMGW-x","prompt":"p"}');
    expect(analyzeRequestBody(body)).toMatchObject({ ok: true, salt: "LLMGW-x" });
  });
});
