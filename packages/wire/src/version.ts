/**
 * The one version of the whole system: every workspace package, the `llmgw` CLI, what agents,
 * routers and control planes report, and the release in CHANGELOG.md. A test holds every
 * package.json to it; bump it with a CHANGELOG entry.
 */
export const LLMGW_VERSION = "0.2.0";

/**
 * The protobuf package every RPC and message lives in. `buf breaking` keeps it wire-compatible
 * release to release; an incompatible contract would be a new package, never a change to this one.
 */
export const PROTO_PACKAGE = "llmgw.v1";
