/** What the `#/page` hash names: the console's only navigation state (nothing secret in it). */

/** The route of a location hash: "#/events" → "events"; no hash → "fleet". */
export function routeOf(hash: string): string {
  return hash.replace(/^#\/?/, "") || "fleet";
}

/**
 * The replica id of a `replica/<id>` route (as the deployments page links it), or undefined
 * for another page. The hash comes from whatever link was followed: a broken %-escape throws
 * this specific error, for the page to show, rather than `decodeURIComponent`'s URIError in
 * the middle of a render, which took the whole console down.
 */
export function replicaIdOf(route: string): string | undefined {
  if (!route.startsWith("replica/")) return undefined;
  const encoded = route.slice("replica/".length);
  try {
    return decodeURIComponent(encoded);
  } catch {
    throw new Error("not a replica link: its id has a broken %-escape");
  }
}
