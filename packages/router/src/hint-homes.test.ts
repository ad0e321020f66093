import { describe, expect, it } from "vitest";
import { HintHomes, type HomeCandidate } from "./hint-homes.js";
import { hintAnchor, rendezvousWeight, replicaSeed } from "./rendezvous.js";

const ids = Array.from({ length: 16 }, (_, i) => `r${String(i).padStart(2, "0")}`);
const all = (id: string): boolean => ids.includes(id);
/** The replicas as candidates for `hint`, weighted as the picker weighs them. */
const candidatesFor = (hint: string, replicas: readonly string[] = ids): HomeCandidate[] =>
  replicas.map((id) => ({ id, rendezvous: rendezvousWeight(hintAnchor(hint), replicaSeed(id)) }));
const homeOf = (homes: HintHomes, hint: string, nowMs = 0, replicas: readonly string[] = ids) =>
  homes.homeOf("d", hintAnchor(hint), candidatesFor(hint, replicas), all, nowMs);
const tenants = Array.from({ length: 64 }, (_, i) => `tenant-${i}`);

describe("HintHomes", () => {
  it("spreads hints by count, keeps each one where it was put, and agrees across routers", () => {
    const a = new HintHomes();
    const b = new HintHomes();
    const first = tenants.map((t) => homeOf(a, t));
    expect(tenants.map((t) => homeOf(b, t))).toEqual(first);
    // Asked again, in another order: the same homes.
    for (const t of [...tenants].reverse()) expect(homeOf(a, t)).toBe(first[tenants.indexOf(t)]);
    const counts = ids.map((id) => a.count("d", id));
    expect(counts.reduce((x, y) => x + y, 0)).toBe(64);
    expect(a.size("d")).toBe(64);
    // At most ceil(1.25 × 64 ÷ 16) = 5 hints a replica; a hash alone put 6 or more on one here.
    expect(Math.max(...counts)).toBeLessThanOrEqual(5);
    const byHash = new Map<string, number>();
    for (const t of tenants) {
      const top = candidatesFor(t).reduce((x, y) =>
        (y.rendezvous ?? 0) > (x.rendezvous ?? 0) ? y : x,
      );
      byHash.set(top.id, (byHash.get(top.id) ?? 0) + 1);
    }
    expect(Math.max(...byHash.values())).toBeGreaterThan(5);
  });

  it("puts a hint on its first rendezvous choice while that one has room", () => {
    const homes = new HintHomes();
    const top = candidatesFor("solo").reduce((x, y) =>
      (y.rendezvous ?? 0) > (x.rendezvous ?? 0) ? y : x,
    );
    expect(homeOf(homes, "solo")).toBe(top.id);
  });

  it("homes a new hint where its prompt is already, when a replica holds half of it or more", () => {
    const order = [...candidatesFor("late")].sort(
      (x, y) => (y.rendezvous ?? 0) - (x.rendezvous ?? 0),
    );
    const top = order[0]?.id as string;
    const holder = order[5]?.id as string;
    const place = (held: number, placeable?: (c: HomeCandidate) => boolean) =>
      new HintHomes().homeOf("d", hintAnchor("late"), candidatesFor("late"), all, 0, {
        held: (c) => (c.id === holder ? held : 0),
        blocks: 10,
        ...(placeable === undefined ? {} : { placeable }),
      });
    // Another router sent this tenant to `holder`, and its engine holds 6 of the prompt's 10
    // blocks: this router follows instead of taking the rendezvous order's first.
    expect(place(6)).toBe(holder);
    // Even with prefill queued there: what it holds saves more than the queue costs.
    expect(place(5, (c) => c.id !== holder)).toBe(holder);
    // Under half is a preamble many hints share: the rendezvous order decides.
    expect(place(4)).toBe(top);
    // A holder with its share of hints already gets no more.
    const homes = new HintHomes();
    for (const t of tenants.slice(0, 15)) {
      homes.homeOf("d", hintAnchor(t), candidatesFor(t), all, 0, {
        held: (c) => (c.id === holder ? 10 : 0),
        blocks: 10,
      });
    }
    expect(homes.count("d", holder)).toBe(Math.ceil((1.25 * 15) / 16));
  });

  it("keeps a home a retry excludes, and moves one whose replica cannot take requests", () => {
    const homes = new HintHomes();
    const home = homeOf(homes, "t") as string;
    const others = ids.filter((id) => id !== home);
    // A retry: the home is routable but not a candidate this time.
    expect(homeOf(homes, "t", 1, others)).toBeUndefined();
    expect(homeOf(homes, "t", 2)).toBe(home);
    // The home's circuit opened: the hint moves, and its count with it.
    const moved = homes.homeOf(
      "d",
      hintAnchor("t"),
      candidatesFor("t", others),
      (id) => id !== home,
      3,
    );
    expect(moved).not.toBe(home);
    expect([homes.count("d", home), homes.count("d", moved as string)]).toEqual([0, 1]);
  });

  it("releases a hint idle past idleMs, and drops the least recently used past maxHints", () => {
    const homes = new HintHomes({ idleMs: 1000, maxHints: 8 });
    for (const [i, t] of tenants.slice(0, 4).entries()) homeOf(homes, t, i * 400);
    // At 1 300 ms only tenant-0 (used at 0) has been idle 1 000 ms; tenant-1 (400) 900 ms.
    homeOf(homes, "tenant-3", 1300);
    expect(homes.size("d")).toBe(3);
    for (const t of tenants.slice(10, 20)) homeOf(homes, t, 1300);
    expect(homes.size("d")).toBe(8);
    const sum = ids.reduce((n, id) => n + homes.count("d", id), 0);
    expect(sum).toBe(8);
  });

  it("forgets every hint on a replica that left, and keeps deployments apart", () => {
    const homes = new HintHomes();
    for (const t of tenants) homeOf(homes, t);
    homes.homeOf("e", hintAnchor("x"), candidatesFor("x"), all, 0);
    const gone = ids[3] as string;
    const had = homes.count("d", gone);
    expect(had).toBeGreaterThan(0);
    homes.forget(gone);
    expect([homes.count("d", gone), homes.size("d"), homes.size("e")]).toEqual([0, 64 - had, 1]);
  });

  it("answers undefined with no candidates", () => {
    expect(new HintHomes().homeOf("d", 1, [], all, 0)).toBeUndefined();
  });

  it("adopts a peer router's home for a hint, and settles two homes on the one that sorts first", () => {
    const homes = new HintHomes();
    const key = hintAnchor("t");
    // Never seen here: it takes the peer's home, counted like its own.
    expect(homes.adopt("d", key, "r05", 0)).toBe(true);
    expect(homeOf(homes, "t")).toBe("r05");
    expect(homes.count("d", "r05")).toBe(1);
    // Homed here on r05: a peer's r09 does not move it, a peer's r02 does (each router moves
    // to the one that sorts first, so two routers that placed it apart agree after one message).
    expect(homes.adopt("d", key, "r09", 0)).toBe(false);
    expect(homeOf(homes, "t")).toBe("r05");
    expect(homes.adopt("d", key, "r02", 0)).toBe(true);
    expect(homeOf(homes, "t")).toBe("r02");
    expect([homes.count("d", "r05"), homes.count("d", "r02"), homes.size("d")]).toEqual([0, 1, 1]);
  });
});
