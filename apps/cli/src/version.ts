/** The version every llmgw component reports (agent version, control plane, CLI). */
export const LLMGW_VERSION = "0.1.0";
