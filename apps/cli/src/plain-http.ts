/**
 * Whether `hostname` (as `URL.hostname` spells it) is this machine's loopback: `localhost`,
 * 127.0.0.0/8 or `[::1]`. Only there does plain HTTP keep a secret off the network.
 */
function isLoopbackHost(hostname: string): boolean {
  return (
    hostname === "localhost" ||
    hostname.endsWith(".localhost") ||
    hostname === "[::1]" ||
    /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(hostname)
  );
}

/**
 * The URLs of `urls` that are plain HTTP to another host: a bearer token sent there crosses
 * the network unencrypted. Callers warn rather than refuse: a TLS-terminating proxy or tunnel
 * on the path may make it safe, which the CLI cannot see. URLs that do not parse are left to
 * the caller's own check.
 */
export function plainHttpToOtherHosts(urls: readonly string[]): string[] {
  return urls.filter((url) => {
    if (!URL.canParse(url)) return false;
    const parsed = new URL(url);
    return parsed.protocol === "http:" && !isLoopbackHost(parsed.hostname);
  });
}
