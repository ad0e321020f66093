/**
 * The first string `code` on `error` or its `cause` chain (four levels at most): undici and
 * Node put the syscall's `ECONNREFUSED` there, sometimes one wrapper down.
 */
export function errorCode(error: unknown): string | undefined {
  let e: unknown = error;
  for (let depth = 0; depth < 4 && typeof e === "object" && e !== null; depth++) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === "string") return code;
    e = (e as { cause?: unknown }).cause;
  }
  return undefined;
}
