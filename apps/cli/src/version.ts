import { LLMGW_VERSION } from "@llmgw/wire";

export { LLMGW_VERSION };

declare const __LLMGW_COMMIT__: string | undefined;

/**
 * The commit this bundle was built from (`-dirty` when the tree had uncommitted changes), set by
 * tsup at build time; undefined when running from source.
 */
export const LLMGW_COMMIT: string | undefined =
  typeof __LLMGW_COMMIT__ === "string" && __LLMGW_COMMIT__ !== "" ? __LLMGW_COMMIT__ : undefined;
