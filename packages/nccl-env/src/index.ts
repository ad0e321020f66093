export {
  type BuildNcclEnvOptions,
  buildNcclEnv,
  NCCL_ENV_KEYS,
  type NcclEnvReport,
  type NcclFabric,
  type NcclGpuNic,
  type NcclPort,
} from "./build-nccl-env.js";
export { isNcclEnvError, NcclEnvError, type NcclEnvErrorCode } from "./errors.js";
