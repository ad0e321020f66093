import { describe, expect, it } from "vitest";
import {
  REPLACED_SESSIONS_KEPT,
  type ReportOrder,
  ReportSessions,
  type ReportVerdict,
} from "./report-order.js";

const o = (sessionId: string, sequence: number): ReportOrder => ({
  sessionId,
  sequence: BigInt(sequence),
});

describe("ReportSessions", () => {
  it.each<[string, (ReportOrder | undefined)[], ReportVerdict[]]>([
    ["in order", [o("a", 1), o("a", 2), o("a", 5)], ["taken", "taken", "taken"]],
    ["an older one after a newer", [o("a", 2), o("a", 1)], ["taken", "older"]],
    ["the same one twice", [o("a", 3), o("a", 3)], ["taken", "older"]],
    ["a first heartbeat numbered above 1", [o("a", 40)], ["taken"]],
    ["a new session starting at 1", [o("a", 9), o("b", 1), o("b", 2)], ["taken", "taken", "taken"]],
    [
      "the replaced session, however high its number",
      [o("a", 9), o("b", 1), o("a", 10)],
      ["taken", "taken", "replaced"],
    ],
    [
      "unordered ones (older agents), wherever they come",
      [undefined, o("a", 2), undefined, o("a", 1), undefined],
      ["taken", "taken", "taken", "older", "taken"],
    ],
  ])("%s", (_name, orders, verdicts) => {
    const sessions = new ReportSessions();
    expect(orders.map((order) => sessions.admit(order))).toEqual(verdicts);
  });

  it("keeps what it took", () => {
    const sessions = new ReportSessions();
    expect(sessions.current).toBeUndefined();
    sessions.admit(o("a", 4));
    sessions.admit(o("a", 2));
    expect(sessions.current).toEqual(o("a", 4));
  });

  it(`remembers the ${REPLACED_SESSIONS_KEPT} sessions replaced last`, () => {
    const sessions = new ReportSessions();
    const ids = Array.from({ length: REPLACED_SESSIONS_KEPT + 2 }, (_, i) => `s${i}`);
    for (const id of ids) sessions.admit(o(id, 1));
    // s0 is forgotten; s1 … s8 are replaced; s9 is current.
    expect(ids.slice(1, -1).map((id) => sessions.admit(o(id, 2)))).toEqual(
      ids.slice(1, -1).map(() => "replaced"),
    );
    expect(sessions.admit(o("s0", 2))).toBe("taken");
  });
});
