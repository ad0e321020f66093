/** Default bound on a label value's length, in UTF-16 code units. */
export const DEFAULT_LABEL_VALUE_MAX_LENGTH = 128;

const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/g;

/**
 * Makes any value safe as a Prometheus label value: stringified, cut to `maxLength` code units
 * (without splitting a surrogate pair) and with lone surrogates replaced, so the exposition is
 * always valid UTF-8 and a hostile 10 MB string costs at most `maxLength` bytes per series.
 */
export function boundLabelValue(value: unknown, maxLength: number): string {
  let s = typeof value === "string" ? value : String(value);
  if (s.length > maxLength) {
    s = s.slice(0, maxLength);
    const last = s.charCodeAt(s.length - 1);
    if (last >= 0xd800 && last <= 0xdbff) s = s.slice(0, -1);
  }
  LONE_SURROGATE.lastIndex = 0;
  return LONE_SURROGATE.test(s) ? s.replace(LONE_SURROGATE, "\uFFFD") : s;
}

/**
 * Bounds the `model` label: names the router knows (deployed models) pass through, anything
 * a client typed is folded into `"other"` so arbitrary request bodies cannot create series.
 */
export function boundModelLabel(model: string, isKnown: (model: string) => boolean): string {
  return isKnown(model) ? model : "other";
}
