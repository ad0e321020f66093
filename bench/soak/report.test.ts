import { describe, expect, it } from "vitest";
import type { OutcomeClass } from "./classify.js";
import {
  type FaultRecord,
  type RequestRecord,
  summarizeFaults,
  summarizeTotals,
} from "./report.js";

let nextId = 0;
const req = (startMs: number, endMs: number, cls: OutcomeClass, stream = false): RequestRecord => ({
  id: ++nextId,
  stream,
  startMs,
  endMs,
  class: cls,
  detail: cls === "ok" ? "200" : `${cls} detail`,
});
const fault = (kind: FaultRecord["kind"], atMs: number, readyAtMs?: number): FaultRecord => ({
  kind,
  atMs,
  readyAtMs,
  adopted: kind === "agent-restart" ? true : null,
  notes: [],
});

describe("summarizeFaults", () => {
  const records = [
    req(0, 100, "ok"),
    // engine kill at 1 000: a stream in flight on the killed engine ends with an error event,
    // then one more error, then steady success
    req(900, 1_020, "error", true),
    req(1_000, 1_050, "error"),
    req(1_010, 1_400, "ok"),
    req(1_500, 1_700, "ok"),
    // control-plane restart at 2 000: refused, then 503 until 3 200
    req(2_000, 2_001, "cp-down"),
    req(2_500, 2_501, "cp-down"),
    req(3_000, 3_200, "error"),
    req(3_300, 3_500, "ok"),
    req(3_600, 3_900, "ok", true),
  ];
  const summary = summarizeFaults(
    records,
    [fault("control-plane-restart", 2_000, 3_400), fault("engine-kill", 1_000, 2_500)],
    4_000,
  );

  it("orders faults by start and windows each until the next one, by end time", () => {
    expect(summary.map((f) => [f.kind, f.atS, f.requests])).toEqual([
      ["engine-kill", 1, 4],
      ["control-plane-restart", 2, 5],
    ]);
  });

  it.each([
    ["engine-kill", { notOk: 2, firstOkAfterS: 0.4, steadyAfterS: 0.1, readyAfterS: 1.5 }],
    [
      "control-plane-restart",
      { notOk: 3, firstOkAfterS: 1.5, steadyAfterS: 1.2, readyAfterS: 1.4 },
    ],
  ])("%s: error budget and recovery", (kind, expected) => {
    const f = summary.find((s) => s.kind === kind);
    expect({
      notOk: f?.notOk,
      firstOkAfterS: f?.firstOkAfterS,
      steadyAfterS: f?.steadyAfterS,
      readyAfterS: f?.readyAfterS,
    }).toEqual(expected);
  });

  it("counts classes per window and reports a fault that never healed", () => {
    const [only] = summarizeFaults([req(10, 20, "hang")], [fault("agent-restart", 0)], 100);
    expect(only?.byClass).toMatchObject({ ok: 0, hang: 1 });
    expect(only?.readyAfterS).toBeUndefined();
    expect(only?.firstOkAfterS).toBeUndefined();
    expect(only?.adopted).toBe(true);
  });

  it("splits a window's failures into in flight at the fault and started after it", () => {
    // router SIGKILL at 1 000: two requests in flight on it are cut, one started after fails
    const [kill] = summarizeFaults(
      [
        req(800, 1_001, "reset", true),
        req(990, 1_002, "malformed"),
        req(950, 1_200, "ok"),
        req(1_100, 1_300, "error"),
      ],
      [fault("router-kill", 1_000, 4_000)],
      5_000,
    );
    expect([kill?.notOk, kill?.notOkInFlight, kill?.notOkAfter]).toEqual([3, 2, 1]);
  });

  it.each([
    ["a 503", { status: 503, class: "error", detail: "503 model_loading" }, 1],
    ["a stream's error event", { status: 200, class: "error", detail: "sse 200 upstream" }, 1],
    ["a 429", { status: 429, class: "error", detail: "429 rate_limited" }, 0],
    ["a reset before any status", { class: "reset", detail: "ECONNRESET" }, 0],
    ["a 200 without [DONE]", { status: 200, class: "malformed", detail: "no [DONE]" }, 0],
  ] as const)("%s counts as a 5xx: %s", (_what, fields, expected) => {
    const [f] = summarizeFaults(
      [{ ...req(10, 20, "ok"), ...fields }],
      [fault("control-plane-kill", 0)],
      100,
    );
    expect(f?.serverErrors).toBe(expected);
  });
});

describe("summarizeTotals", () => {
  it.each([
    ["an immediate reset inside the outage is not unanswered", req(1_000, 1_010, "reset"), 0, 1],
    ["an immediate reset outside the outage is", req(5_000, 5_010, "reset"), 1, 0],
    ["a slow reset inside the outage is", req(1_000, 2_500, "reset"), 1, 0],
    ["a hang inside the outage is", req(1_000, 1_010, "hang"), 1, 0],
  ])("%s", (_what, record, unanswered, excused) => {
    const totals = summarizeTotals([record], 1, [{ fromMs: 900, toMs: 3_000 }]);
    expect([totals.unanswered, totals.immediateResetsInOutage]).toEqual([unanswered, excused]);
  });

  it("counts bad classes and lost requests as unanswered", () => {
    const totals = summarizeTotals(
      [req(0, 10, "ok"), req(0, 30, "ok", true), req(0, 5, "reset"), req(0, 1, "cp-down")],
      6,
    );
    expect(totals.byClass).toEqual({
      ok: 2,
      error: 0,
      "cp-down": 1,
      hang: 0,
      reset: 1,
      malformed: 0,
    });
    expect(totals.unanswered).toBe(1 + 2); // one reset, two sent but never classified
    expect([totals.streamOkP50Ms, totals.jsonOkP50Ms]).toEqual([30, 10]);
    expect(totals.details.map((d) => [d.class, d.count])).toEqual([
      ["reset", 1],
      ["cp-down", 1],
    ]);
  });
});
