/**
 * The one change the router makes to a request body: members appended to its top-level
 * object, e.g. `"stream_options":{"include_usage":true}` so a stream reports its exact usage,
 * or `"priority":1` for an engine that schedules by it. Everything the client wrote stays
 * byte for byte; the added members go last, and the JSON parsers of vLLM and SGLang (Python's
 * `json`) and of llama.cpp (nlohmann::json) keep the last of a repeated key, so an added
 * member wins over one of the same name the client sent.
 */

const CLOSE_OBJECT = 0x7d;

function isJsonSpace(c: number | undefined): boolean {
  return c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09;
}

/**
 * `body` with `members` (comma-separated JSON members, no braces) added at the end of its
 * top-level object; `undefined` when `body` does not end in `}` (never for a body the router's
 * analysis accepted as an object). An empty object (`{}`) takes them without a comma.
 */
export function appendMembers(body: Uint8Array, members: string): Buffer | undefined {
  let end = body.length - 1;
  while (end >= 0 && isJsonSpace(body[end])) end--;
  if (end < 1 || body[end] !== CLOSE_OBJECT) return undefined;
  let before = end - 1;
  while (before >= 0 && isJsonSpace(body[before])) before--;
  const empty = body[before] === 0x7b;
  const tail = `${empty ? "" : ","}${members}}`;
  const out = Buffer.allocUnsafe(end + Buffer.byteLength(tail));
  out.set(body.subarray(0, end), 0);
  out.write(tail, end, "utf8");
  return out;
}
