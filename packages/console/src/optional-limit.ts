/**
 * A rate or concurrency limit as an operator types it into a form. Pure, so it is tested
 * without a browser.
 */

/** "" → undefined; anything but a whole number ≥ 1 is an error naming the field. */
export function optionalLimit(value: string, field: string): number | undefined {
  const v = value.trim();
  if (v === "") return undefined;
  const n = Number(v);
  if (!Number.isInteger(n) || n < 1 || n > 4_294_967_295)
    throw new Error(`${field}: a whole number of at least 1, or empty for no limit`);
  return n;
}
