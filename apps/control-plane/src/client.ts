/*
 * What clients of the control plane (the CLI, tools) need without loading the server: the
 * deployment converter and state names. Nothing here imports SQLite, HTTP servers or metrics.
 */
export {
  deploymentInputFromProto,
  deploymentSpecFromProto,
  deploymentSpecToProto,
} from "./convert/deployment.js";
export { escapeOutsideText } from "./domain/outside-text.js";
export { aggregateReplicaState, joinHostPort, replicaStateName } from "./domain/replica-state.js";
export { readToken, type TokenKind } from "./domain/tokens.js";
export { ControlPlaneError, type ControlPlaneErrorCode, isControlPlaneError } from "./errors.js";
export { ERROR_CODE_HEADER } from "./rpc/errors.js";
