import { describe, expect, it } from "vitest";
import type { OutcomeClass } from "./classify.js";
import {
  type FaultRecord,
  type FaultSummary,
  isTruncatedStream,
  lifecycleGoals,
  type PlannedRecord,
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

describe("isTruncatedStream", () => {
  it.each([
    ["a stream cut before [DONE]", { stream: true, status: 200, class: "malformed" }, true],
    ["a stream reset mid-body", { stream: true, status: 200, class: "reset" }, true],
    ["a stream ended by an error event", { stream: true, status: 200, class: "error" }, true],
    ["a complete stream", { stream: true, status: 200, class: "ok" }, false],
    ["a stream refused with a 503", { stream: true, status: 503, class: "error" }, false],
    ["a stream reset before any status", { stream: true, class: "reset" }, false],
    ["a JSON answer cut mid-body", { stream: false, status: 200, class: "reset" }, false],
  ] as const)("%s: %s", (_what, fields, expected) => {
    expect(isTruncatedStream({ ...req(0, 10, "ok"), ...fields })).toBe(expected);
  });
});

describe("planned changes", () => {
  const planned = (
    kind: FaultRecord["kind"],
    atMs: number,
    p: Partial<PlannedRecord> = {},
    readyAtMs?: number,
  ): FaultRecord => ({
    ...fault(kind, atMs, readyAtMs),
    planned: { commandAtMs: atMs, doneAtMs: undefined, minCapacity: undefined, left: [], ...p },
  });
  const served = (startMs: number, endMs: number, replica: string, cls: OutcomeClass = "ok") => ({
    ...req(startMs, endMs, cls, true),
    replica,
    status: 200,
  });

  it("times each change from its command to done and counts what the leaving replicas served", () => {
    const [down, leave] = summarizeFaults(
      [
        served(900, 1_100, "chat-2"), // in flight on the leaving replica at the command: its window
        served(1_200, 1_400, "chat-0"),
        served(1_300, 1_500, "chat-2"),
        served(2_100, 2_400, "chat-2"), // a new replica under the reused id, after the old one left
        served(5_100, 5_300, "chat-1"),
        served(5_200, 5_400, "chat-0", "malformed"),
      ],
      [
        planned("scale-down", 1_000, {
          doneAtMs: 2_300,
          minCapacity: 2,
          left: [{ replicaId: "chat-2", lastSeenMs: 2_000 }],
        }),
        // agent-leave: the window starts at the agent's restart, the clock at its SIGTERM
        planned(
          "agent-leave",
          5_000,
          {
            commandAtMs: 6_000,
            doneAtMs: 9_500,
            minCapacity: 3,
            left: [{ replicaId: "chat-0", lastSeenMs: 8_000 }],
          },
          11_000,
        ),
      ],
      20_000,
    );
    expect(down?.planned).toEqual({
      tookS: 1.3,
      minCapacity: 2,
      left: ["chat-2"],
      servedByLeaving: 2,
    });
    expect([leave?.planned?.tookS, leave?.readyAfterS, leave?.planned?.servedByLeaving]).toEqual([
      3.5, 6, 1,
    ]);
    expect([leave?.notOk, leave?.truncatedStreams]).toEqual([1, 1]);
  });

  it("a change never done has no time; a fault has no planned figures", () => {
    const [never, kill] = summarizeFaults(
      [],
      [planned("node-drain", 0), fault("router-kill", 1_000, 2_000)],
      3_000,
    );
    expect(never?.planned?.tookS).toBeUndefined();
    expect(kill?.planned).toBeUndefined();
  });

  const summary = (
    kind: FaultSummary["kind"],
    p: { tookS?: number; minCapacity?: number; capacityFloor?: number },
    records: RequestRecord[] = [served(10, 20, "chat-0")],
  ): FaultSummary => {
    const [f] = summarizeFaults(
      records,
      [
        planned("scale-down", 0, {
          doneAtMs: p.tookS === undefined ? undefined : p.tookS * 1000,
          minCapacity: p.minCapacity,
          ...(p.capacityFloor === undefined ? {} : { capacityFloor: p.capacityFloor }),
        }),
      ],
      1_000,
    );
    if (!f) throw new Error("no summary");
    return { ...f, kind };
  };
  const totalsOf = (records: RequestRecord[], sent = records.length) =>
    summarizeTotals(records, sent);

  it.each([
    ["clean and quick", summary("scale-down", { tookS: 2 }), true],
    ["done just at the bound", summary("undeploy", { tookS: 60 }), true],
    ["over the bound", summary("node-drain", { tookS: 60.1 }), false],
    ["never done", summary("node-drain", {}), false],
    [
      "one truncated stream",
      summary("agent-leave", { tookS: 3 }, [served(10, 20, "chat-0", "malformed")]),
      false,
    ],
    [
      "one 503",
      summary("scale-up", { tookS: 3 }, [{ ...req(10, 20, "error"), status: 503 }]),
      false,
    ],
  ])("event goal: %s → met %s", (_what, f, met) => {
    const [goal] = lifecycleGoals([f], totalsOf([]), 60);
    expect(goal?.goal).toBe(
      `${f.kind}: 0 client-visible errors, 0 truncated streams, done within 60 s`,
    );
    expect(goal?.met).toBe(met);
  });

  it.each([
    [3, 3, true],
    [2, 3, false],
    [undefined, 3, false],
    [3, undefined, false],
  ])("rolling update with min capacity %s against floor %s → met %s", (min, floor, met) => {
    const goals = lifecycleGoals(
      [
        summary("rolling-update", {
          tookS: 8,
          ...(min === undefined ? {} : { minCapacity: min }),
          ...(floor === undefined ? {} : { capacityFloor: floor }),
        }),
      ],
      totalsOf([]),
      60,
    );
    const capacity = goals.find((g) => g.goal.startsWith("rolling-update: capacity"));
    expect(capacity?.met).toBe(met);
    expect(capacity?.value).toBe(
      `at least ${min ?? "unmeasured"} ready replicas taking new requests (GetDeployment every 100 ms)`,
    );
  });

  it.each([
    ["all ok", [req(0, 1, "ok")], 1, true, "0 not ok of 1"],
    ["one error", [req(0, 1, "ok"), req(0, 1, "error")], 2, false, "1 not ok of 2: error 1"],
    ["one lost", [req(0, 1, "ok")], 2, false, "1 not ok of 2, lost 1"],
  ])("the whole phase: %s", (_what, records, sent, met, value) => {
    const goals = lifecycleGoals([], totalsOf(records, sent), 60);
    expect(goals).toEqual([{ goal: "every request of the phase answered ok", value, met }]);
  });
});
