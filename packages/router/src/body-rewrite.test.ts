import { describe, expect, it } from "vitest";
import { appendMembers } from "./body-rewrite.js";

const enc = (s: string) => new TextEncoder().encode(s);

describe("appendMembers", () => {
  it("adds members last and keeps every byte the client wrote", () => {
    const body = '{"model":"m", "stream":true ,"x":[1,{"y":"}"}]}';
    const out = appendMembers(enc(body), '"stream_options":{"include_usage":true}');
    expect(out?.toString()).toBe(`${body.slice(0, -1)},"stream_options":{"include_usage":true}}`);
    expect(JSON.parse(out?.toString() ?? "")).toMatchObject({
      model: "m",
      stream_options: { include_usage: true },
    });
  });

  it("wins over a member of the same name, as the engines' parsers keep the last", () => {
    const out = appendMembers(enc('{"model":"m","priority":-100}\n  '), '"priority":1');
    expect(JSON.parse(out?.toString() ?? "").priority).toBe(1);
  });

  it("takes an empty object without a comma, and refuses what is no object", () => {
    expect(appendMembers(enc("{ }"), '"a":1')?.toString()).toBe('{ "a":1}');
    expect(appendMembers(enc("[1]"), '"a":1')).toBeUndefined();
    expect(appendMembers(enc(""), '"a":1')).toBeUndefined();
    expect(appendMembers(enc("}"), '"a":1')).toBeUndefined();
  });
});
