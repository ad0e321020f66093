// The llmgw v1 wire contract, generated from proto/llmgw/v1 by `buf generate` (committed).
export * from "./gen/llmgw/v1/agent_pb.js";
export * from "./gen/llmgw/v1/cluster_pb.js";
export * from "./gen/llmgw/v1/deployment_pb.js";
export * from "./gen/llmgw/v1/inventory_pb.js";
export * from "./gen/llmgw/v1/kv_pb.js";
export * from "./gen/llmgw/v1/router_pb.js";
