import { describe, expect, it } from "vitest";
import { firstInOrder, HintHomes, type HomeCandidate } from "./hint-homes.js";
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

  it("homes a new hint by step timing below the fair share, and a holder still first", () => {
    // Replica i's current step ends in (i + 0.1) sixteenths of a step; r05's is unknown (read
    // as half a step: between r07's and r08's).
    const wait = (c: HomeCandidate) =>
      c.id === "r05" ? undefined : (ids.indexOf(c.id) + 0.1) / 16;
    const homes = new HintHomes();
    const placed = tenants
      .slice(0, 32)
      .map((t) => homes.homeOf("d", hintAnchor(t), candidatesFor(t), all, 0, { wait }));
    // Each hint takes the soonest step among the replicas below ceil((hints + 1) ÷ 16): r00
    // first, then r01 once r00 holds its share, and so on, two rounds of all 16, r05 with
    // the unknown step after r07 in each round.
    const round = ["r00", "r01", "r02", "r03", "r04", "r06", "r07", "r05", "r08"];
    expect(placed.slice(0, 9)).toEqual(round);
    expect(ids.map((id) => homes.count("d", id))).toEqual(ids.map(() => 2));
    // Without `wait` the rendezvous order decides, bounded at 1.25× the share: uneven.
    const hashed = new HintHomes();
    for (const t of tenants.slice(0, 32)) homeOf(hashed, t);
    expect(ids.map((id) => hashed.count("d", id))).not.toEqual(ids.map(() => 2));
    // A replica holding the prompt wins over the soonest step; among equals, timing decides
    // only where nothing is held, and `placeable` still filters.
    const fresh = new HintHomes();
    expect(
      fresh.homeOf("d", hintAnchor("x"), candidatesFor("x"), all, 0, {
        wait,
        held: (c) => (c.id === "r09" ? 8 : 0),
        blocks: 10,
      }),
    ).toBe("r09");
    expect(
      fresh.homeOf("d", hintAnchor("y"), candidatesFor("y"), all, 0, {
        wait,
        placeable: (c) => c.id !== "r00" && c.id !== "r01",
      }),
    ).toBe("r02");
    // A router among peers takes the soonest of the replicas it owns, before a sooner one it
    // does not own; one it does not own only when it owns none free.
    const odd = (c: HomeCandidate) => ids.indexOf(c.id) % 2 === 1;
    expect(
      fresh.homeOf("d", hintAnchor("z"), candidatesFor("z"), all, 0, { wait, owned: odd }),
    ).toBe("r01");
    expect(
      fresh.homeOf("d", hintAnchor("w"), candidatesFor("w"), all, 0, {
        wait,
        owned: odd,
        placeable: (c) => !odd(c),
      }),
    ).toBe("r00");
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

  it("adopts a peer router's home for a hint, and settles two homes on the first in its order", () => {
    const homes = new HintHomes();
    const key = hintAnchor("t");
    const order = [...candidatesFor("t")]
      .sort((x, y) => (y.rendezvous ?? 0) - (x.rendezvous ?? 0))
      .map((c) => c.id);
    const [early, middle, late] = [order[2], order[8], order[14]] as [string, string, string];
    // Never seen here: it takes the peer's home, counted like its own.
    expect(homes.adopt("d", key, middle, 0)).toBe(true);
    expect(homeOf(homes, "t")).toBe(middle);
    expect(homes.count("d", middle)).toBe(1);
    // Homed here on `middle`: a peer's home later in the hint's rendezvous order does not move
    // it, an earlier one does (each router moves to the earlier, so two routers that placed
    // it apart agree after one message).
    expect(homes.adopt("d", key, late, 0)).toBe(false);
    expect(homeOf(homes, "t")).toBe(middle);
    expect(homes.adopt("d", key, early, 0)).toBe(true);
    expect(homeOf(homes, "t")).toBe(early);
    expect([homes.count("d", middle), homes.count("d", early), homes.size("d")]).toEqual([0, 1, 1]);
  });

  it("settles contested hints on every replica alike, not on the ids that sort first", () => {
    const wins = new Map<string, number>();
    for (const t of tenants) {
      const key = hintAnchor(t);
      for (let i = 0; i < ids.length; i += 2) {
        const [a, b] = [ids[i] as string, ids[i + 1] as string];
        const first = firstInOrder(key, a, b);
        expect(firstInOrder(key, b, a)).toBe(first);
        wins.set(first, (wins.get(first) ?? 0) + 1);
      }
    }
    // 64 contests per pair: each side wins some; by id order r00, r02, … would win all 64.
    for (let i = 0; i < ids.length; i += 2) expect(wins.get(ids[i] as string)).toBeLessThan(48);
    expect([...wins.values()].reduce((x, y) => x + y, 0)).toBe(64 * 8);
  });
});
