// Pure parsers and state for NVIDIA Xid / SXid records in the kernel log. No I/O here: the
// watcher that reads /dev/kmsg (or a `--kernel-log` file) feeds lines in and acts on the faults.
// Formats: shared/reference/health-formats.md §1 (kmsg transport, Xid grammar, SXid, catalog).
import { normalizePciBusId } from "./nvidia-smi-parse.js";
import type { FaultAction } from "./types.js";

/** One kernel log record, from `/dev/kmsg` or from a `dmesg`-style text line. */
export interface KernelLogRecord {
  /** kmsg sequence number; gaps mean the ring buffer overwrote records. Absent for text lines. */
  seq?: number;
  /** Monotonic µs since boot (kmsg `TS_US`, or dmesg's `[ 1843.308145]`). Absent for wall-clock prefixes. */
  tsUsec?: number;
  /** Syslog facility (0 = kernel). User space can write to /dev/kmsg with facility 1: callers should only trust 0. */
  facility?: number;
  /** Syslog level (3 err, 4 warning, 6 info). */
  level?: number;
  /**
   * True for a text line that only continues the previous one (dmesg indents the rest of a
   * multi-line record); kmsg delivers such a record once, with `\x0a` inside, unescaped here.
   */
  continuation?: boolean;
  /** The record's text with any transport prefix removed. Never empty. */
  message: string;
}

// PRIO,SEQ,TS_US,FLAGS[,future fields…];TEXT — unknown fields before ';' are ignored (KDOC).
const KMSG_HEADER = /^(\d{1,20}),(\d{1,20}),(\d{1,20}),[^,;]*(?:,[^;]*)?;/;
const MONOTONIC_PREFIX = /^\[\s*(\d{1,12})\.(\d{1,9})\]\s?/;
// `dmesg -T`: `[Sun Feb 23 16:24:18 2025] `.
const WALL_CLOCK_PREFIX = /^\[[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4}\]\s?/;
// `dmesg --decode --time-format=iso`: `kern  :warn  : 2025-01-21T04:41:44,283302+00:00 `.
const DECODE_PREFIX =
  /^([a-z]+)\s*:([a-z]+)\s*:\s(?:\d{4}-\d\d-\d\dT[\d:,.]+(?:[+-]\d\d:?\d\d|Z)?\s)?/;
// syslog / journalctl: `Dec  2 11:38:47 worker4 kernel: `, or a bare `kernel: `.
const SYSLOG_PREFIX = /^(?:[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \S+ )?kernel: /;

const FACILITIES: Readonly<Record<string, number>> = { kern: 0, user: 1, daemon: 3, syslog: 5 };
const LEVELS: Readonly<Record<string, number>> = {
  emerg: 0,
  alert: 1,
  crit: 2,
  err: 3,
  warn: 4,
  notice: 5,
  info: 6,
  debug: 7,
};

/**
 * Parses one `/dev/kmsg` record (`PRIO,SEQ,TS_US,FLAGS;TEXT`, optionally followed by
 * ` KEY=value` continuation lines, which are ignored) or one `dmesg`-style text line (prefix
 * `[ 123.456] `, `[Sun Feb 23 16:24:18 2025] `, `kern  :warn  : <iso> `, syslog's
 * `<date> <host> kernel: `, or none). kmsg `\xNN` escapes are decoded, so a multi-line NVRM
 * message comes back as one message with `\n` inside.
 *
 * @returns undefined for a blank line, a kmsg header whose numbers do not fit a safe integer,
 *   or a record with no text. Never throws.
 */
export function parseKmsgRecord(line: string): KernelLogRecord | undefined {
  const first = line.split("\n", 1)[0]!.replace(/\r$/, "");
  const kmsg = KMSG_HEADER.exec(first);
  if (kmsg) {
    const prio = Number(kmsg[1]);
    const seq = Number(kmsg[2]);
    const tsUsec = Number(kmsg[3]);
    if (![prio, seq, tsUsec].every(Number.isSafeInteger)) return undefined;
    const message = unescapeKmsg(first.slice(kmsg[0].length)).trimEnd();
    if (message.trim() === "") return undefined;
    return { seq, tsUsec, facility: prio >> 3, level: prio & 7, message };
  }
  return parseTextLine(first);
}

function parseTextLine(line: string): KernelLogRecord | undefined {
  if (line.trim() === "") return undefined;
  const record: Omit<KernelLogRecord, "message"> = {};
  let rest = line;
  const decode = DECODE_PREFIX.exec(rest);
  if (decode && FACILITIES[decode[1]!] !== undefined && LEVELS[decode[2]!] !== undefined) {
    record.facility = FACILITIES[decode[1]!];
    record.level = LEVELS[decode[2]!];
    rest = rest.slice(decode[0].length);
  }
  const syslog = SYSLOG_PREFIX.exec(rest);
  if (syslog) rest = rest.slice(syslog[0].length);
  const monotonic = MONOTONIC_PREFIX.exec(rest);
  const wall = monotonic ? undefined : WALL_CLOCK_PREFIX.exec(rest);
  if (monotonic) {
    const [, seconds = "0", fraction = "0"] = monotonic;
    const tsUsec = Number(seconds) * 1e6 + Math.round(Number(`0.${fraction}`) * 1e6);
    if (Number.isSafeInteger(tsUsec)) record.tsUsec = tsUsec;
    rest = rest.slice(monotonic[0].length);
  } else if (wall) {
    rest = rest.slice(wall[0].length);
  } else if (!decode && !syslog && /^\s/.test(rest)) {
    record.continuation = true;
  }
  const message = rest.trim();
  if (message === "") return undefined;
  return { ...record, message };
}

function unescapeKmsg(text: string): string {
  return text.replace(/\\x([0-9a-fA-F]{2})/g, (_, hex: string) =>
    String.fromCharCode(Number.parseInt(hex, 16)),
  );
}

/**
 * The one PCI bus key for matching the kernel log against nvidia-smi: Xid's `PCI:0000:9b:00`
 * (lower case, no function digit), SXid's `0000:c3:00.0`, `NVRM: GPU 0000:06:00.0` and
 * nvidia-smi's `00000000:9B:00.0` all become nvidia-smi's form `00000000:9B:00.0`.
 *
 * @returns undefined when `id` is not a PCI bus id.
 */
export function pciBusKey(id: string): string | undefined {
  const match = /^(?:PCI:)?([0-9a-fA-F]{1,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(\.[0-7])?$/.exec(
    id.trim(),
  );
  if (!match) return undefined;
  // A GPU is always function 0; the kernel's Xid line omits it.
  return normalizePciBusId(`${match[1]}:${match[2]}:${match[3]}${match[4] ?? ".0"}`);
}

/** One NVRM Xid (GPU) or SXid (NVSwitch) record. */
export interface ParsedXid {
  kind: "xid" | "sxid";
  code: number;
  /** nvidia-smi's form, `00000000:9B:00.0` (see {@link pciBusKey}). */
  pciBusId: string;
  /** MIG GPU instance as printed (`GPU-I:05` → `"05"`). */
  gpuInstance?: string;
  pid?: number;
  processName?: string;
  /** Text after the code, `pid=` and `name=`. May contain newlines (kmsg `\x0a`). */
  detail: string;
  /** SXid `Fatal`/`Non-fatal`, NVLink5 `Fatal`/`Nonfatal` token; absent when the line has none. */
  fatal?: boolean;
  /** Xid 94/95: the driver's own `RST:` (GPU reset required) and `D-RST:` (drain and reset) verdicts. */
  resetRequired?: boolean;
  drainAndResetRequired?: boolean;
  /** Xid 45: `caused by previous Xid N`. */
  causedByXid?: number;
  /** Xid 154: the new recovery action value (`… to 0x4 (Drain and Reset)` → 4). */
  recoveryAction?: number;
  /** The message this was parsed from. */
  raw: string;
}

// Unanchored: any transport prefix may come before `NVRM:` (§1.6). The `s` flag lets the
// detail span a multi-line record.
const XID_LINE =
  /NVRM: Xid \((?:PCI:)?([0-9a-fA-F]{1,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)(?: GPU-I:([0-9a-fA-F]+))?\): (\d{1,6})(?:,\s*(.*))?$/s;
const SXID_LINE =
  /SXid \((?:PCI:)?([0-9a-fA-F]{1,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)\): (\d{1,6})(?:,\s*(.*))?$/s;
const PID_FIELD = /^pid=(\d{1,10}|'<unknown>'|<unknown>)(?:,\s*|$)/;
// comm may contain ':' and '[]' (`nvc:[driver]`), so only ", " ends it.
const NAME_FIELD = /^name=(.*?)(?:,\s+|$)/s;

/**
 * Parses an NVRM Xid (`NVRM: Xid (PCI:0000:9b:00): 119, pid=…, name=…, …`) or NVSwitch SXid
 * (`nvidia-nvswitch0: SXid (PCI:0000:06:00.0): 20009, Non-fatal, …`) message, with or without
 * a log prefix. Tolerates a missing `PCI:`, `GPU-I:nn`, any PCI domain, missing or
 * `'<unknown>'` pid and name, and multi-line details.
 *
 * @returns undefined for any other text. Never throws.
 */
export function parseXid(message: string): ParsedXid | undefined {
  const xid = XID_LINE.exec(message);
  if (xid) {
    const [, bdf = "", instance, code = "", rest = ""] = xid;
    const pciBusId = pciBusKey(bdf);
    if (pciBusId === undefined) return undefined;
    const parsed: ParsedXid = {
      kind: "xid",
      code: Number(code),
      pciBusId,
      detail: "",
      raw: message,
    };
    if (instance !== undefined) parsed.gpuInstance = instance;
    let detail = rest;
    const pid = PID_FIELD.exec(detail);
    if (pid) {
      if (/^\d+$/.test(pid[1]!)) parsed.pid = Number(pid[1]);
      detail = detail.slice(pid[0].length);
    }
    const name = NAME_FIELD.exec(detail);
    if (name) {
      if (name[1] !== "<unknown>" && name[1] !== "") parsed.processName = name[1];
      detail = detail.slice(name[0].length);
    }
    parsed.detail = detail.trimEnd();
    addXidFacts(parsed);
    return parsed;
  }
  const sxid = SXID_LINE.exec(message);
  if (sxid) {
    const [, bdf = "", code = "", rest = ""] = sxid;
    const pciBusId = pciBusKey(bdf);
    if (pciBusId === undefined) return undefined;
    const parsed: ParsedXid = {
      kind: "sxid",
      code: Number(code),
      pciBusId,
      detail: rest.trimEnd(),
      raw: message,
    };
    const severity = /^(Fatal|Non-fatal),/.exec(parsed.detail);
    if (severity) parsed.fatal = severity[1] === "Fatal";
    return parsed;
  }
  return undefined;
}

/** A GPU that fell off the bus, said without (or besides) an Xid 79. */
export interface FallenOffBus {
  /** nvidia-smi's form (see {@link pciBusKey}). */
  pciBusId: string;
  raw: string;
}

const FALLEN_OFF_LINES = [
  // `NVRM: GPU 0000:06:00.0: GPU has fallen off the bus.`
  /NVRM: GPU ([0-9a-fA-F]{1,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?): GPU has fallen off the bus/,
  // R570 open module, one record over three lines: `NVRM: The NVIDIA GPU 0000:b3:00.0` /
  // `NVRM: (PCI ID: 10de:26b5) installed in this system has` / `NVRM: fallen off the bus …`.
  /NVRM: The NVIDIA GPU ([0-9a-fA-F]{1,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)\s+NVRM: \(PCI ID: [0-9a-fA-F:]{1,16}\) installed in this system has\s+NVRM: fallen off the bus/,
];

/**
 * Parses the NVRM messages that report a GPU fallen off the bus without an Xid (the R570 open
 * module logs only these). The multi-line form must arrive as one message: kmsg delivers it as
 * one record (`\x0a` decoded by {@link parseKmsgRecord}); for text logs join the
 * `continuation` lines with `\n`. The watcher dedupes this against an Xid 79 for the same GPU.
 *
 * @returns undefined for any other text. Never throws.
 */
export function parseFallenOffBus(message: string): FallenOffBus | undefined {
  for (const pattern of FALLEN_OFF_LINES) {
    const match = pattern.exec(message);
    const pciBusId = match ? pciBusKey(match[1]!) : undefined;
    if (pciBusId !== undefined) return { pciBusId, raw: message };
  }
  return undefined;
}

function addXidFacts(xid: ParsedXid): void {
  const rst = /RST: (Yes|No), D-RST: (Yes|No)/.exec(xid.detail);
  if (rst) {
    xid.resetRequired = rst[1] === "Yes";
    xid.drainAndResetRequired = rst[2] === "Yes";
  }
  const cause = /caused by previous Xid (\d{1,6})/.exec(xid.detail);
  if (cause) xid.causedByXid = Number(cause[1]);
  const recovery =
    /recovery action changed from 0x[0-9a-fA-F]+ \([^)]*\) to 0x([0-9a-fA-F]{1,8})/.exec(
      xid.detail,
    );
  if (recovery) xid.recoveryAction = Number.parseInt(recovery[1]!, 16);
  // NVLink5 (144–150): `NETIR_LINK_EVT  Fatal   XC0 …`, `RLW_RXPIPE Nonfatal XC0 …`.
  const nvlink5 = /^\S+\s+(Fatal|Nonfatal)\s/.exec(xid.detail);
  if (nvlink5 && xid.code >= 144 && xid.code <= 150) xid.fatal = nvlink5[1] === "Fatal";
}

/**
 * What llmgw does about a fault, mildest first: `ignore` (informational), `restart-engine` (the
 * application on the GPU failed; the GPU is fine), `reset-gpu` (the GPU is unusable until a
 * reset is observed or an operator clears it), `drain-node` (needs a person; nothing on the
 * node is trusted), `reboot` (the node must be restarted).
 */
export type XidAction = FaultAction;

/** NVIDIA's "immediate action" names from the Xid catalog (reference §1.4). */
export type NvidiaXidAction =
  | "IGNORE"
  | "RESTART_APP"
  | "RESET_GPU"
  | "RESTART_BM"
  | "CONTACT_SUPPORT"
  | "WORKFLOW_XID_45"
  | "WORKFLOW_XID_48"
  | "WORKFLOW_NVLINK_ERR"
  | "WORKFLOW_NVLINK5_ERR"
  | "XID_154";

/**
 * NVIDIA's immediate action → llmgw's action. Only `XID_154` is not fixed: its action is the
 * recovery action carried in the line ({@link RECOVERY_ACTIONS}).
 */
export const NVIDIA_ACTION_TO_ACTION: Readonly<Record<NvidiaXidAction, XidAction>> = {
  IGNORE: "ignore",
  RESTART_APP: "restart-engine",
  RESET_GPU: "reset-gpu",
  // Restart bare metal.
  RESTART_BM: "reboot",
  CONTACT_SUPPORT: "drain-node",
  // The channel was torn down because of another Xid, which carries the GPU's verdict; the
  // engine that owned the channel is broken either way.
  WORKFLOW_XID_45: "restart-engine",
  // NVSentinel maps WORKFLOW_XID_48 to a component (GPU) reset.
  WORKFLOW_XID_48: "reset-gpu",
  // NVLink fatal errors hang collectives; NVLink5 errors are followed by an Xid 154 that refines this.
  WORKFLOW_NVLINK_ERR: "reset-gpu",
  WORKFLOW_NVLINK5_ERR: "reset-gpu",
  // Placeholder; the line's recovery action decides (unknown value: drain-node).
  XID_154: "drain-node",
};

/** One Xid catalog entry. */
export interface XidCatalogEntry {
  mnemonic?: string;
  description: string;
  nvidiaAction: NvidiaXidAction;
  action: XidAction;
}

const entry = (
  nvidiaAction: NvidiaXidAction,
  description: string,
  mnemonic?: string,
): XidCatalogEntry => ({
  nvidiaAction,
  action: NVIDIA_ACTION_TO_ACTION[nvidiaAction],
  description,
  ...(mnemonic === undefined ? {} : { mnemonic }),
});

/**
 * NVIDIA's Xid catalog (immediate actions as the official catalog lists them, via GPUD's
 * generated copy, 2025-10-29) for the codes llmgw has seen in real logs. Codes not listed get
 * {@link UNKNOWN_XID}.
 */
export const XID_CATALOG: ReadonlyMap<number, XidCatalogEntry> = new Map([
  [13, entry("RESTART_APP", "Graphics Engine Exception", "ROBUST_CHANNEL_GR_EXCEPTION")],
  [31, entry("RESTART_APP", "GPU memory page fault", "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT")],
  [43, entry("IGNORE", "GPU stopped processing", "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR")],
  [
    45,
    entry(
      "WORKFLOW_XID_45",
      "Preemptive cleanup, due to previous errors",
      "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL",
    ),
  ],
  [48, entry("WORKFLOW_XID_48", "Double Bit ECC Error", "ROBUST_CHANNEL_GPU_ECC_DBE")],
  [61, entry("CONTACT_SUPPORT", "Unused (on Ampere+)", "PMU_BREAKPOINT")],
  [62, entry("RESET_GPU", "Internal micro-controller halt", "PMU_HALT_ERROR")],
  [63, entry("IGNORE", "GPU memory remapping event", "INFOROM_DRAM_RETIREMENT_EVENT")],
  [64, entry("RESET_GPU", "GPU memory remapping failure", "INFOROM_DRAM_RETIREMENT_FAILURE")],
  [74, entry("WORKFLOW_NVLINK_ERR", "NVLINK Error", "NVLINK_ERROR")],
  [
    79,
    entry("RESTART_BM", "GPU has fallen off the bus", "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS"),
  ],
  [92, entry("IGNORE", "High single-bit ECC error rate", "EXCESSIVE_SBE_INTERRUPTS")],
  [94, entry("RESTART_APP", "Contained memory error", "ROBUST_CHANNEL_CONTAINED_ERROR")],
  [95, entry("RESET_GPU", "Uncontained memory error", "ROBUST_CHANNEL_UNCONTAINED_ERROR")],
  [109, entry("RESET_GPU", "CTXSW timeout")],
  [119, entry("RESET_GPU", "GSP RPC Timeout", "GSP_RPC_TIMEOUT")],
  [120, entry("RESET_GPU", "GSP Error", "GSP_ERROR")],
  [136, entry("RESET_GPU", "Link training failed")],
  [140, entry("RESET_GPU", "ECC Unrecovered Error", "UNRECOVERABLE_ECC_ERROR_ESCAPE")],
  [143, entry("RESET_GPU", "GPU init error")],
  [144, entry("WORKFLOW_NVLINK5_ERR", "NVLink5 error", "NVLINK_SAW_ERROR")],
  [145, entry("WORKFLOW_NVLINK5_ERR", "NVLink5 error", "NVLINK_RLW_ERROR")],
  [146, entry("WORKFLOW_NVLINK5_ERR", "NVLink5 error", "NVLINK_TLW_ERROR")],
  [147, entry("WORKFLOW_NVLINK5_ERR", "NVLink5 error", "NVLINK_TREX_ERROR")],
  [148, entry("WORKFLOW_NVLINK5_ERR", "NVLink5 error", "NVLINK_NVLPW_ERROR")],
  [149, entry("WORKFLOW_NVLINK5_ERR", "NVLink5 error", "NVLINK_NETIR_ERROR")],
  [150, entry("WORKFLOW_NVLINK5_ERR", "NVLink5 error", "NVLINK_MSE_ERROR")],
  [154, entry("XID_154", "GPU Recovery Action Changed", "GPU_RECOVERY_ACTION_CHANGED")],
]);

/**
 * Any Xid not in {@link XID_CATALOG} (more than 160 exist): fail closed on that GPU — it takes no
 * new work until a reset is observed or an operator clears it — rather than guess it is harmless
 * or take down the whole node for a code nobody has classified.
 */
export const UNKNOWN_XID: XidCatalogEntry = {
  nvidiaAction: "RESET_GPU",
  action: "reset-gpu",
  description: "Unknown Xid (not in llmgw's catalog)",
};

/**
 * NVML `nvmlDeviceGpuRecoveryAction_t` values as Xid 154 prints them, with llmgw's action.
 * Values 3 and 5 (drain P2P, recover IMEX domain) reach beyond one GPU, so the node drains.
 */
export const RECOVERY_ACTIONS: ReadonlyMap<number, { name: string; action: XidAction }> = new Map([
  [0, { name: "None", action: "ignore" }],
  [1, { name: "GPU reset", action: "reset-gpu" }],
  [2, { name: "Node reboot", action: "reboot" }],
  [3, { name: "Drain P2P", action: "drain-node" }],
  [4, { name: "Drain and reset", action: "reset-gpu" }],
  [5, { name: "Recover IMEX domain", action: "drain-node" }],
  [6, { name: "Bus reset", action: "reset-gpu" }],
  [7, { name: "System reboot", action: "reboot" }],
]);

/**
 * llmgw's action for one parsed record. Xid: the catalog (Xid 154: the new recovery action in
 * the line, unknown value → `drain-node`). SXid (NVSwitch; not in NVIDIA's Xid catalog):
 * `Non-fatal` → ignore, `Data {…}` (repeats the previous record) → ignore, anything else
 * (`Fatal`, or no severity like `SOE HALTED`) → `drain-node`, since a switch serves every GPU
 * on the node.
 */
export function classifyXid(xid: ParsedXid): XidAction {
  if (xid.kind === "sxid") {
    if (xid.fatal === false || xid.detail.startsWith("Data {")) return "ignore";
    return "drain-node";
  }
  const catalog = XID_CATALOG.get(xid.code) ?? UNKNOWN_XID;
  if (catalog.nvidiaAction === "XID_154") {
    const recovery =
      xid.recoveryAction === undefined ? undefined : RECOVERY_ACTIONS.get(xid.recoveryAction);
    return recovery?.action ?? catalog.action;
  }
  return catalog.action;
}

/** One fault: every record of one kind and code on one device, folded. */
export interface XidFault {
  /** `${kind}:${pciBusId}:${code}`. */
  key: string;
  kind: ParsedXid["kind"];
  code: number;
  pciBusId: string;
  /** {@link classifyXid} of the latest record (Xid 154 changes with each line). */
  action: XidAction;
  /** Records in the current burst. */
  count: number;
  /** Records since the fault was first seen. */
  total: number;
  /** Bursts: a record after a quiet gap of at least `windowMs` opens a new one. */
  bursts: number;
  firstSeenMs: number;
  burstStartMs: number;
  lastSeenMs: number;
  /** The record that opened the current burst, and the latest one (the evidence lines). */
  first: ParsedXid;
  last: ParsedXid;
}

/** Options for {@link createXidAggregator}. */
export interface XidAggregatorOptions {
  /** Records of one fault closer than this belong to one burst. Default 60 000. */
  windowMs?: number;
  /** Milliseconds; used when `add` gets no time. Default `Date.now`. */
  clock?: () => number;
  /** Faults kept; past it the least recently seen one is forgotten. Default 1024. */
  maxFaults?: number;
}

/** What {@link XidAggregator.add} did. */
export interface XidAddResult {
  fault: XidFault;
  /** True when this record opened a new burst (first record, or first after a quiet gap). */
  opened: boolean;
}

/** Pure fold of parsed records into faults per (kind, device, code). */
export interface XidAggregator {
  /** Folds one record in, at `atMs` (default the clock). */
  add(xid: ParsedXid, atMs?: number): XidAddResult;
  /** Current faults, in the order first seen. A fault stays until {@link XidAggregator.clear}: a recovery is an observed fact, not a timeout. */
  faults(): XidFault[];
  /** Forgets the faults of one device (nvidia-smi or kernel form), e.g. after its reset was observed; returns how many. */
  clear(pciBusId: string): number;
}

/**
 * Creates an {@link XidAggregator}: a burst of 100 Xid 13 lines on one GPU is one fault with
 * `count` 100, not 100 faults.
 */
export function createXidAggregator(options: XidAggregatorOptions = {}): XidAggregator {
  const windowMs = options.windowMs ?? 60_000;
  const clock = options.clock ?? Date.now;
  const maxFaults = options.maxFaults ?? 1024;
  // Map iteration order = insertion order = the order faults were first seen.
  const faults = new Map<string, XidFault>();
  return {
    add(xid, atMs = clock()) {
      const key = `${xid.kind}:${xid.pciBusId}:${xid.code}`;
      const action = classifyXid(xid);
      const existing = faults.get(key);
      let fault: XidFault;
      let opened: boolean;
      if (existing === undefined) {
        opened = true;
        fault = {
          key,
          kind: xid.kind,
          code: xid.code,
          pciBusId: xid.pciBusId,
          action,
          count: 1,
          total: 1,
          bursts: 1,
          firstSeenMs: atMs,
          burstStartMs: atMs,
          lastSeenMs: atMs,
          first: xid,
          last: xid,
        };
      } else {
        opened = atMs - existing.lastSeenMs >= windowMs;
        fault = {
          ...existing,
          action,
          count: opened ? 1 : existing.count + 1,
          total: existing.total + 1,
          bursts: existing.bursts + (opened ? 1 : 0),
          burstStartMs: opened ? atMs : existing.burstStartMs,
          lastSeenMs: Math.max(atMs, existing.lastSeenMs),
          first: opened ? xid : existing.first,
          last: xid,
        };
      }
      faults.set(key, fault);
      if (faults.size > maxFaults) {
        // Ties go to the fault first seen.
        let stalest: XidFault | undefined;
        for (const f of faults.values()) {
          if (stalest === undefined || f.lastSeenMs < stalest.lastSeenMs) stalest = f;
        }
        faults.delete(stalest!.key);
      }
      return { fault, opened };
    },
    faults() {
      return [...faults.values()];
    },
    clear(pciBusId) {
      const busKey = pciBusKey(pciBusId) ?? pciBusId;
      let removed = 0;
      for (const [key, fault] of faults) {
        if (fault.pciBusId === busKey) {
          faults.delete(key);
          removed++;
        }
      }
      return removed;
    },
  };
}
