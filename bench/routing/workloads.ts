/**
 * The routing-quality workloads, generated deterministically from a seed:
 * - `shared-prefix` (a): many tenants, each with a long system prompt shared by its
 *   multi-turn conversations (llm-d's "150 customers × long context", scaled down);
 * - `unique` (b): no shared prefixes at all (affinity cannot help; must not lose to least-loaded);
 * - `hot-prefix` (c): like (a), but one tenant owns half of all conversations (one hot prefix;
 *   affinity must not pile it onto one replica).
 * A conversation is a list of user turns; turn k is sent with the system prompt, the previous
 * turns and the engine's previous answers, so its prompt extends the previous one (a real
 * prefix, as a chat client sends it).
 */

import { createPrng } from "@llmgw/engine-sim";

/** Workload names as they appear in the table. */
export type WorkloadName = "shared-prefix" | "unique" | "hot-prefix";

/** One conversation: a session header value, a system prompt and the user turns. */
export interface Conversation {
  readonly session: string;
  readonly system: string;
  readonly turns: readonly string[];
}

/** Sizes of a workload (scaled by `--quick`). */
export interface WorkloadSize {
  readonly tenants: number;
  readonly conversationsPerTenant: number;
  readonly turns: number;
  readonly systemPromptChars: number;
  readonly userTurnChars: number;
}

const SYLLABLES = [
  "ka",
  "lo",
  "mi",
  "ne",
  "ru",
  "ta",
  "vo",
  "shi",
  "pe",
  "da",
  "gu",
  "zen",
  "fi",
  "ob",
  "ul",
];

/** `chars` characters of pseudo-words from `rand`. */
export function text(rand: () => number, chars: number): string {
  let out = "";
  while (out.length < chars) {
    const n = 1 + Math.floor(rand() * 3);
    for (let i = 0; i < n; i++) out += SYLLABLES[Math.floor(rand() * SYLLABLES.length)];
    out += " ";
  }
  return out.slice(0, chars);
}

/** The conversations of `name` at `size`, deterministic for a given seed. */
export function buildWorkload(name: WorkloadName, size: WorkloadSize, seed = 1): Conversation[] {
  const rand = createPrng(seed);
  const system = (tenant: number): string =>
    `You are the assistant of tenant ${tenant}. Follow its policy exactly.\n${text(createPrng(seed * 1000 + tenant), size.systemPromptChars)}`;
  const conversations: Conversation[] = [];
  const turns = (n: number): string[] =>
    Array.from({ length: n }, () => text(rand, size.userTurnChars));
  if (name === "unique") {
    const n = size.tenants * size.conversationsPerTenant * size.turns;
    for (let i = 0; i < n; i++) {
      // Unique from the first character: no block of one prompt is a prefix of another.
      conversations.push({
        session: `u${i}`,
        system: `${i} ${text(rand, size.systemPromptChars)}`,
        turns: turns(1),
      });
    }
    return conversations;
  }
  for (let t = 0; t < size.tenants; t++) {
    for (let c = 0; c < size.conversationsPerTenant; c++) {
      conversations.push({ session: `t${t}`, system: system(t), turns: turns(size.turns) });
    }
  }
  if (name === "hot-prefix") {
    // Tenant 0 gets as many conversations as all the others together: half the traffic.
    const others = conversations.length - size.conversationsPerTenant;
    for (let c = 0; c < others - size.conversationsPerTenant; c++) {
      conversations.push({ session: "t0", system: system(0), turns: turns(size.turns) });
    }
  }
  // Shuffle so tenants interleave in time (Fisher–Yates, seeded).
  for (let i = conversations.length - 1; i > 0; i--) {
    const j = Math.floor(rand() * (i + 1));
    [conversations[i], conversations[j]] = [
      conversations[j] as Conversation,
      conversations[i] as Conversation,
    ];
  }
  return conversations;
}

/** Total requests a workload sends. */
export function requestCount(conversations: readonly Conversation[]): number {
  return conversations.reduce((n, c) => n + c.turns.length, 0);
}
