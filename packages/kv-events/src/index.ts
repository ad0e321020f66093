export {
  type BlockSetChange,
  createReplicaBlockSet,
  type ReplicaBlockSet,
  type ReplicaBlockSetOptions,
  type ReplicaBlockSetStats,
} from "./block-set.js";
export {
  type DecodedKvEventBatch,
  decodeKvEventBatch,
  type KvEventDecodeLimits,
  MAX_PAYLOAD_CONTAINERS,
  normaliseBlockHash,
  type RejectedKvEvent,
  type ResolvedKvEventDecodeLimits,
  resolveKvEventDecodeLimits,
} from "./decode.js";
export {
  encodeKvEventBatch,
  type KvEventEncodeOptions,
  type KvEventEncoding,
} from "./encode.js";
export { isKvEventsError, KvEventsError, type KvEventsErrorCode } from "./errors.js";
export {
  createKvBlockFeed,
  type KvBlockFeed,
  type KvBlockFeedOptions,
  type KvFeedUpdate,
} from "./feed.js";
export type {
  AllBlocksClearedEvent,
  BlockRemovedEvent,
  BlockStoredEvent,
  KvEvent,
  KvEventBatch,
} from "./kv-event.js";
export {
  createKvEventPublisher,
  END_SEQ,
  type KvEventPublisher,
  type KvEventPublisherOptions,
  seqFrame,
} from "./publisher.js";
export {
  type KvCacheServer,
  type KvCacheServerOptions,
  MAX_WATCH_REQUEST_BYTES,
  startKvCacheServer,
} from "./server.js";
export {
  createKvCacheService,
  KV_KEEPALIVE_MS,
  type KvFeedRegistry,
  MAX_PENDING_KEYS,
  MAX_PENDING_UPDATES,
} from "./service.js";
export {
  createKvEventSubscriber,
  type KvEventSubscriber,
  type KvEventSubscriberOptions,
  type KvEventSubscriberStats,
  type KvEventsLogger,
  type KvEventsResetReason,
} from "./subscriber.js";
export { chainKey, MAX_SALT_LENGTH, saltKey, tokenBlockKeys } from "./token-blocks.js";
