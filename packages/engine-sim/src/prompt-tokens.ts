/**
 * `@llmgw/engine-sim/tokenizer`: the simulated model family's tokenizer and chat template, and
 * nothing else of the simulator (no server, no sockets), for a router that tokenizes requests
 * for a sim deployment the way the sim will (precise routing on its KV events).
 */
export { parseSimChatMessages, type SimChatMessage, simChatPrompt } from "./chat-prompt.js";
export { simTokenIds } from "./tokenizer.js";
