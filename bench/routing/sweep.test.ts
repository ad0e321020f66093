import { describe, expect, it } from "vitest";
import {
  defaultRates,
  goodput,
  goodputIsCensored,
  judgeRung,
  keepClimbing,
  parseRates,
  type Rung,
  type RungVerdict,
} from "./sweep.js";

const criteria = { sloTtftP90Ms: 250 };
const rung = (rate: number, ttftP90Ms: number, over: Partial<Rung> = {}): Rung => ({
  rate,
  requests: 100,
  ok: 100,
  ttftP90Ms,
  offeredShare: 1,
  ...over,
});

describe("judgeRung", () => {
  it.each<[string, Rung, RungVerdict]>([
    ["within the SLO", rung(8, 120), "pass"],
    ["exactly at the SLO", rung(8, 250), "pass"],
    ["p90 over the SLO", rung(8, 251), "slo"],
    ["no answers (p90 NaN)", rung(8, Number.NaN, { ok: 0 }), "failed-requests"],
    ["one request failed", rung(8, 100, { ok: 99 }), "failed-requests"],
    ["the client held the load back", rung(8, 100, { offeredShare: 0.8 }), "held-back"],
    ["90% of the rate offered is enough", rung(8, 100, { offeredShare: 0.9 }), "pass"],
  ])("%s", (_, r, verdict) => {
    expect(judgeRung(r, criteria)).toBe(verdict);
  });
});

describe("keepClimbing and goodput", () => {
  it.each<[string, Rung[], boolean, number]>([
    ["no rung yet", [], true, 0],
    ["all passing", [rung(4, 50), rung(8, 90)], true, 8],
    ["one failure keeps climbing", [rung(4, 50), rung(8, 300)], true, 4],
    ["two failures stop", [rung(4, 50), rung(8, 300), rung(16, 400)], false, 4],
    ["a pass above a failure counts", [rung(4, 50), rung(8, 300), rung(16, 240)], true, 16],
    ["nothing passes", [rung(4, 300), rung(8, 400)], false, 0],
  ])("%s", (_, rungs, climb, rate) => {
    expect(keepClimbing(rungs, criteria)).toBe(climb);
    expect(goodput(rungs, criteria)).toBe(rate);
  });
});

describe("goodputIsCensored", () => {
  it.each<[string, Rung[], boolean]>([
    ["the top rung passed: only a lower bound", [rung(4, 50), rung(8, 90)], true],
    ["the top rung failed", [rung(4, 50), rung(8, 300)], false],
    ["stopped below the top", [rung(4, 300), rung(8, 300)], false],
  ])("%s", (_, rungs, censored) => {
    expect(goodputIsCensored(rungs, [4, 8], criteria)).toBe(censored);
  });
});

describe("parseRates", () => {
  it.each([
    ["4,8,16,24,32", [4, 8, 16, 24, 32]],
    ["32, 8,8, 4", [4, 8, 32]],
    ["2.5", [2.5]],
  ])("%s", (text, rates) => {
    expect(parseRates(text)).toEqual(rates);
  });

  it.each(["", "4,x", "0,4", "-1"])("refuses %j", (text) => {
    expect(() => parseRates(text)).toThrow(
      `--sweep-rates ${JSON.stringify(text)}: expected positive numbers, e.g. 4,8,16`,
    );
  });

  it("scales the default ladder with the fleet", () => {
    expect(defaultRates(4)).toEqual([12, 24, 48, 72, 96, 128, 160]);
    expect(defaultRates(16)).toEqual([48, 96, 192, 288, 384, 512, 640]);
  });
});
