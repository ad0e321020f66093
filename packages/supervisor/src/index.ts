export {
  type Clock,
  type SupervisorLogger,
  silentLogger,
  sleep,
  systemClock,
  type TimerHandle,
} from "./clock.js";
export { isSupervisorError, SupervisorError, type SupervisorErrorCode } from "./errors.js";
export { CappedLogFile, type LogFileLimits, openLogFile } from "./log-file.js";
export { LogTail } from "./log-tail.js";
export {
  type PidFileRead,
  type PidRecord,
  pidFilePath,
  readPidFile,
  removePidFile,
  validateReplicaId,
  writePidFile,
} from "./pid-file.js";
export { ENGINE_PORT_RANGE, ephemeralRange, type FreePortOptions, freePort } from "./ports.js";
export {
  checkProcessIdentity,
  type GroupMember,
  type IdentityCheck,
  listGroupMembers,
  type ProcessIdentity,
  type ProcStat,
  parseProcStat,
  readCmdlineFingerprint,
  readGroupMembers,
  readProcessIdentity,
  readProcStat,
} from "./proc.js";
export { hashProcessSpec, type ProcessSpec, validateProcessSpec } from "./process-spec.js";
export { resolveExecutable } from "./resolve-executable.js";
export {
  nextRestartDecision,
  type ResolvedRestartPolicy,
  type RestartDecision,
  type RestartPolicyOptions,
  type RunRecord,
  resolveRestartPolicy,
} from "./restart-policy.js";
export {
  createSupervisedReplica,
  type ProbeOutcome,
  REPLICA_TRANSITIONS,
  type ReplicaFailure,
  type ReplicaProbe,
  type ReplicaState,
  type ReplicaTransition,
  type ResolvedSupervisedReplicaOptions,
  resolveSupervisedReplicaOptions,
  SupervisedReplica,
  type SupervisedReplicaOptions,
} from "./supervised-replica.js";
export {
  type AdoptionReport,
  createSupervisor,
  type ExitReport,
  type ProcessExit,
  type ProcessHandle,
  type ResolvedSupervisorOptions,
  resolveSupervisorOptions,
  type StopOptions,
  Supervisor,
  type SupervisorOptions,
} from "./supervisor.js";
