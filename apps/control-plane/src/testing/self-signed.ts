import { execFileSync } from "node:child_process";
import { join } from "node:path";

/** True when an `openssl` binary runs here (TLS tests skip, saying so, without it). */
export function hasOpenssl(): boolean {
  try {
    execFileSync("openssl", ["version"], { stdio: "ignore" });
    return true;
  } catch {
    return false;
  }
}

/**
 * Writes a one-day self-signed certificate for 127.0.0.1 (`cert.pem`, `key.pem`) into `dir`
 * with the real `openssl`, and returns their paths.
 */
export function selfSignedCert(dir: string): { cert: string; key: string } {
  const cert = join(dir, "cert.pem");
  const key = join(dir, "key.pem");
  execFileSync(
    "openssl",
    [
      "req",
      "-x509",
      "-newkey",
      "rsa:2048",
      "-nodes",
      "-keyout",
      key,
      "-out",
      cert,
      "-days",
      "1",
      "-subj",
      "/CN=127.0.0.1",
      "-addext",
      "subjectAltName=IP:127.0.0.1",
    ],
    { stdio: "ignore" },
  );
  return { cert, key };
}
