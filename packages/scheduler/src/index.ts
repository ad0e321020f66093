export { applyPlan } from "./apply-plan.js";
export { isSchedulerError, SchedulerError, type SchedulerErrorCode } from "./errors.js";
export { buildNvlinkMatrix, type NvlinkMatrix, selectGpus } from "./gpu-selection.js";
export type { ReasonCode, RemovalReasonCode, UnschedulableReasonCode } from "./reasons.js";
export { schedule } from "./schedule.js";
export type {
  Placement,
  PlacementRank,
  PlacementRemoval,
  Reason,
  ScheduleInput,
  ScheduleResult,
  SchedulerDeployment,
  SchedulerGpu,
  SchedulerNode,
  UnschedulableDeployment,
} from "./types.js";
