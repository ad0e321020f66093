// Pure parsers and state for NVIDIA Xid / SXid records in the kernel log. No I/O here: the
// watcher that reads /dev/kmsg (or a `--kernel-log` file) feeds lines in and acts on the faults.
// Formats: shared/reference/health-formats.md §1 (kmsg transport, Xid grammar, SXid, catalog).
import { normalizePciBusId } from "./nvidia-smi-parse.js";
import { ProblemCodes, problem } from "./problem-codes.js";
import type { FaultAction, Gpu, GpuFault, Problem } from "./types.js";

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

// Anchored at the start of the message (after the transport prefix): the driver prints
// `NVRM: Xid (` and `nvidia-nvswitch<N>: SXid (` first, so a record that merely contains the
// words — a user-space syslog line `… alice: NVRM: Xid …`, a USB product string — forges
// nothing. The `s` flag lets the detail span a multi-line record.
const XID_LINE =
  /^NVRM: Xid \((?:PCI:)?([0-9a-fA-F]{1,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)(?: GPU-I:([0-9a-fA-F]+))?\): (\d{1,6})(?:,\s*(.*))?$/s;
const SXID_LINE =
  /^nvidia-nvswitch\d{1,4}: SXid \((?:PCI:)?([0-9a-fA-F]{1,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)\): (\d{1,6})(?:,\s*(.*))?$/s;
const PID_FIELD = /^pid=(\d{1,10}|'<unknown>'|<unknown>)(?:,\s*|$)/;
// comm may contain ':' and '[]' (`nvc:[driver]`), so only ", " ends it.
const NAME_FIELD = /^name=(.*?)(?:,\s+|$)/s;

/**
 * Parses an NVRM Xid (`NVRM: Xid (PCI:0000:9b:00): 119, pid=…, name=…, …`) or NVSwitch SXid
 * (`nvidia-nvswitch0: SXid (PCI:0000:06:00.0): 20009, Non-fatal, …`) message, with or without
 * one transport prefix that {@link parseKmsgRecord} knows (kmsg header, `[ secs]`, `dmesg -T`,
 * `--decode`, syslog `… kernel: `). After that prefix the message must start with `NVRM: Xid (`
 * or `nvidia-nvswitch<N>: SXid (`: text that only contains them is not a fault. Tolerates a
 * missing `PCI:`, `GPU-I:nn`, any PCI domain, missing or `'<unknown>'` pid and name, and
 * multi-line details. `raw` is `message` as given.
 *
 * @returns undefined for any other text. Never throws.
 */
export function parseXid(message: string): ParsedXid | undefined {
  return matchXid(message, message) ?? matchXid(stripTransportPrefix(message), message);
}

/** The text after one transport prefix (kmsg header or a dmesg/syslog prefix); "" when none is left. */
function stripTransportPrefix(text: string): string {
  const kmsg = KMSG_HEADER.exec(text);
  if (kmsg) return unescapeKmsg(text.slice(kmsg[0].length)).trimEnd();
  return parseTextLine(text)?.message ?? "";
}

/** {@link parseXid} of a message whose transport prefix is already gone (anchored, no stripping). */
function matchXid(message: string, raw: string): ParsedXid | undefined {
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
      raw,
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
      raw,
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

// Anchored like XID_LINE: the message must start with the driver's words.
const FALLEN_OFF_LINES = [
  // `NVRM: GPU 0000:06:00.0: GPU has fallen off the bus.`
  /^NVRM: GPU ([0-9a-fA-F]{1,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?): GPU has fallen off the bus/,
  // R570 open module, one record over three lines: `NVRM: The NVIDIA GPU 0000:b3:00.0` /
  // `NVRM: (PCI ID: 10de:26b5) installed in this system has` / `NVRM: fallen off the bus …`.
  /^NVRM: The NVIDIA GPU ([0-9a-fA-F]{1,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)\s+NVRM: \(PCI ID: [0-9a-fA-F:]{1,16}\) installed in this system has\s+NVRM: fallen off the bus/,
];

/**
 * Parses the NVRM messages that report a GPU fallen off the bus without an Xid (the R570 open
 * module logs only these). The multi-line form must arrive as one message: kmsg delivers it as
 * one record (`\x0a` decoded by {@link parseKmsgRecord}); for text logs join the
 * `continuation` lines with `\n`. The watcher dedupes this against an Xid 79 for the same GPU.
 * As with {@link parseXid}, one transport prefix may come first and the message must then start
 * with `NVRM: GPU ` or `NVRM: The NVIDIA GPU`.
 *
 * @returns undefined for any other text. Never throws.
 */
export function parseFallenOffBus(message: string): FallenOffBus | undefined {
  return (
    matchFallenOffBus(message, message) ?? matchFallenOffBus(stripTransportPrefix(message), message)
  );
}

function matchFallenOffBus(message: string, raw: string): FallenOffBus | undefined {
  for (const pattern of FALLEN_OFF_LINES) {
    const match = pattern.exec(message);
    const pciBusId = match ? pciBusKey(match[1]!) : undefined;
    if (pciBusId !== undefined) return { pciBusId, raw };
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

const ACTION_SEVERITY: Readonly<Record<FaultAction, number>> = {
  ignore: 0,
  "restart-engine": 1,
  "reset-gpu": 2,
  "drain-node": 3,
  reboot: 4,
};

/** The more severe of two actions (`ignore` < `restart-engine` < `reset-gpu` < `drain-node` < `reboot`). */
export function moreSevereAction(a: FaultAction, b: FaultAction): FaultAction {
  return ACTION_SEVERITY[b] > ACTION_SEVERITY[a] ? b : a;
}

/**
 * llmgw's action for one parsed record. Xid: the catalog (Xid 154: the new recovery action in
 * the line, unknown value → `drain-node`), raised to at least `reset-gpu` when the line carries
 * the driver's own verdict `RST: Yes` (GPU reset required) or `D-RST: Yes` (drain and reset) —
 * Xid 94/95 print them (§1.3, DRV). SXid (NVSwitch; not in NVIDIA's Xid catalog): `Non-fatal`
 * → ignore, `Data {…}` (repeats the previous record) → ignore, anything else (`Fatal`, or no
 * severity like `SOE HALTED`) → `drain-node`, since a switch serves every GPU on the node.
 *
 * This is one record's verdict; a fault's action is the most severe of its records (see
 * {@link XidFault.action}), so a `Data {…}` line never lowers the fatal SXid before it.
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
  if (xid.resetRequired === true || xid.drainAndResetRequired === true) {
    return moreSevereAction(catalog.action, "reset-gpu");
  }
  return catalog.action;
}

/** True for the Xid whose latest record replaces its fault's action (see {@link XidFault.action}). */
function replacesAction(xid: ParsedXid): boolean {
  return xid.kind === "xid" && xid.code === 154;
}

/** One fault: every record of one kind and code on one device, folded. */
export interface XidFault {
  /** `${kind}:${pciBusId}:${code}`. */
  key: string;
  kind: ParsedXid["kind"];
  code: number;
  pciBusId: string;
  /**
   * The most severe {@link classifyXid} of the records since the fault was first seen: a later,
   * milder record (an SXid's `Data {…}` line, a `Non-fatal` repeat) never lowers it. Xid 154 is
   * the exception: each line carries the driver's current recovery action, which replaces the
   * one before — lower too (`… to 0x0 (None)`), since that fault says nothing but the recovery
   * action; the Xid that made the driver ask for recovery (e.g. 149) is a fault of its own and
   * keeps its action.
   */
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
  /** The record that opened the fault (its first burst). */
  origin: ParsedXid;
  /** kmsg sequence number of {@link origin}; absent when the caller gave none (text logs). */
  originSeq?: number;
}

/** Options for {@link createXidAggregator}. */
export interface XidAggregatorOptions {
  /** Records of one fault closer than this belong to one burst. Default 60 000. */
  windowMs?: number;
  /** Milliseconds; used when `add` gets no time. Default `Date.now`. */
  clock?: () => number;
  /**
   * Faults kept. Past it one is forgotten: an `ignore` fault first, then a `restart-engine`
   * one, the least recently seen of that kind; a fault that takes a GPU out only when every
   * fault does. Each eviction is counted ({@link XidAggregator.evictions}). Default 1024.
   */
  maxFaults?: number;
}

/** How many faults an {@link XidAggregator} forgot at `maxFaults`. */
export interface XidEvictions {
  /** Every fault forgotten. */
  total: number;
  /** Those whose action takes a GPU out (reset-gpu, drain-node, reboot). */
  unhealthy: number;
  /** The last unhealthy one forgotten, if any. */
  lastUnhealthy?: XidFault;
}

/** What {@link XidAggregator.add} did. */
export interface XidAddResult {
  fault: XidFault;
  /**
   * True when this record opened a new burst (first record, first after a quiet gap, or
   * `newBurst`).
   */
  opened: boolean;
  /** The fault's action before this record; undefined when the record opened the fault. */
  previousAction?: XidAction;
  /** The fault forgotten to stay within `maxFaults` (may be `fault` itself). */
  evicted?: XidFault;
}

/** Pure fold of parsed records into faults per (kind, device, code). */
export interface XidAggregator {
  /**
   * Folds one record in, at `atMs` (default the clock); `seq` is its kmsg sequence number,
   * kept when it opens the fault. `newBurst`: the record opens a new burst of a known fault
   * however close it is to the last one (the fault's earlier records came from an earlier boot).
   */
  add(xid: ParsedXid, atMs?: number, seq?: number, options?: { newBurst?: boolean }): XidAddResult;
  /** The fault of one kind, device (nvidia-smi form) and code, if any. */
  find(kind: ParsedXid["kind"], pciBusId: string, code: number): XidFault | undefined;
  /** Current faults, in the order first seen. A fault stays until {@link XidAggregator.clear}: a recovery is an observed fact, not a timeout. */
  faults(): XidFault[];
  /** Forgets the faults of one device (nvidia-smi or kernel form), e.g. after its reset was observed; returns how many. */
  clear(pciBusId: string): number;
  /**
   * Puts back a fault that was saved earlier (e.g. before an agent restart). When a fault with
   * its key exists, the two merge: the earlier first-seen time, the later last-seen time, the
   * larger count, the more severe action (for Xid 154 the one seen last). Counts toward
   * `maxFaults` like any other.
   * @returns the fault as now held.
   */
  restore(fault: XidFault): XidFault;
  /**
   * Moves the first-seen, burst-start and last-seen times of the fault with this `key` to at
   * most `notAfterMs`: its records turned out to be an earlier boot's, which happened before
   * this boot started. Count, action and evidence stay.
   * @returns the fault as now held; undefined when none has that key.
   */
  backdate(key: string, notAfterMs: number): XidFault | undefined;
  /** Faults forgotten at `maxFaults` so far. */
  evictions(): XidEvictions;
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
  const evictions: XidEvictions = { total: 0, unhealthy: 0 };
  // ignore → 0, restart-engine → 1, anything that takes a GPU out → 2: evicted in that order.
  const evictionTier = (f: XidFault) => Math.min(ACTION_SEVERITY[f.action], 2);
  const evictIfFull = (): XidFault | undefined => {
    if (faults.size <= maxFaults) return undefined;
    // The lowest tier, then the least recently seen; ties go to the fault first seen.
    let victim: XidFault | undefined;
    for (const f of faults.values()) {
      if (
        victim === undefined ||
        evictionTier(f) < evictionTier(victim) ||
        (evictionTier(f) === evictionTier(victim) && f.lastSeenMs < victim.lastSeenMs)
      ) {
        victim = f;
      }
    }
    faults.delete(victim!.key);
    evictions.total++;
    if (UNHEALTHY_ACTIONS.has(victim!.action)) {
      evictions.unhealthy++;
      evictions.lastUnhealthy = victim!;
    }
    return victim;
  };
  return {
    add(xid, atMs = clock(), seq, addOptions) {
      const key = `${xid.kind}:${xid.pciBusId}:${xid.code}`;
      const existing = faults.get(key);
      const recordAction = classifyXid(xid);
      const action =
        existing === undefined || replacesAction(xid)
          ? recordAction
          : moreSevereAction(existing.action, recordAction);
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
          origin: xid,
          ...(seq === undefined ? {} : { originSeq: seq }),
        };
      } else {
        opened = addOptions?.newBurst === true || atMs - existing.lastSeenMs >= windowMs;
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
      const evicted = evictIfFull();
      return {
        fault,
        opened,
        ...(existing === undefined ? {} : { previousAction: existing.action }),
        ...(evicted === undefined ? {} : { evicted }),
      };
    },
    restore(saved) {
      const existing = faults.get(saved.key);
      if (existing === undefined) {
        faults.set(saved.key, saved);
        evictIfFull();
        return saved;
      }
      const savedIsLater = saved.lastSeenMs > existing.lastSeenMs;
      const merged: XidFault = {
        ...existing,
        action:
          saved.kind === "xid" && saved.code === 154
            ? savedIsLater
              ? saved.action
              : existing.action
            : moreSevereAction(existing.action, saved.action),
        total: Math.max(existing.total, saved.total),
        firstSeenMs: Math.min(existing.firstSeenMs, saved.firstSeenMs),
        lastSeenMs: Math.max(existing.lastSeenMs, saved.lastSeenMs),
        // The evidence of a fault is the record that opened it: here the saved one, if older.
        ...(saved.firstSeenMs < existing.firstSeenMs
          ? { origin: saved.origin, originSeq: saved.originSeq }
          : {}),
      };
      faults.set(saved.key, merged);
      return merged;
    },
    backdate(key, notAfterMs) {
      const existing = faults.get(key);
      if (existing === undefined) return undefined;
      const moved: XidFault = {
        ...existing,
        firstSeenMs: Math.min(existing.firstSeenMs, notAfterMs),
        burstStartMs: Math.min(existing.burstStartMs, notAfterMs),
        lastSeenMs: Math.min(existing.lastSeenMs, notAfterMs),
      };
      faults.set(key, moved);
      return moved;
    },
    evictions() {
      return { ...evictions };
    },
    find(kind, pciBusId, code) {
      return faults.get(`${kind}:${pciBusId}:${code}`);
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

/** Longest {@link GpuFault.evidence} kept, in characters (the proto calls it bounded). */
export const MAX_FAULT_EVIDENCE_CHARS = 512;

/** Longest record the tracker parses, in characters; the rest is cut (and counted). */
export const DEFAULT_MAX_RECORD_CHARS = 16_384;

/** What changed when a record was folded in (see {@link KernelFaultTracker.add}). */
/**
 * Least time between two `seen-again` events of one fault: a burst of records is one report a
 * second, not one per line.
 */
export const SEEN_AGAIN_MIN_GAP_MS = 1_000;

export interface KernelFaultEvent {
  /**
   * `opened`: a new fault, or a new burst of one after a quiet window; `action-changed`: Xid
   * 154 and the like; `seen-again`: a live record of a fault that takes a GPU out folded into it
   * inside its burst window (at most one per fault per {@link SEEN_AGAIN_MIN_GAP_MS}) — its
   * `lastSeen` moved, which matters to a control plane that holds an operator's clear of it.
   */
  readonly kind: "opened" | "action-changed" | "seen-again";
  readonly fault: GpuFault;
  /** The action before this record (absent for a new fault). */
  readonly previousAction?: FaultAction;
  /**
   * True when the record was read live (after the initial catch-up), false for the boot-time
   * backlog: an agent restart must not act again on an old record (restart engines). A record
   * with a monotonic stamp at or below the highest one read of its boot is never live (a
   * replayed ring buffer); one read before with the same stamp and text produces no event at
   * all. An earlier boot's record is never live, nor is a record read after its stamps (kmsg:
   * its seq) stepped back until the records after it tell a new boot from the ring buffer
   * printed again (see {@link KernelFaultTracker}).
   */
  readonly live: boolean;
  /** The fault came back from saved state ({@link KernelFaultTracker.restore}), not from a record; `live` is false. */
  readonly restored?: boolean;
  /** `pid=` of the record behind this event, when it named one (the fault's own evidence is the record that opened it). */
  readonly pid?: number;
}

/** Options for {@link createKernelFaultTracker}. */
export interface KernelFaultTrackerOptions {
  /** Burst window of the aggregator (ms). Default 60 000. */
  readonly windowMs?: number;
  /** Faults kept (least recently seen forgotten first). Default 1024. */
  readonly maxFaults?: number;
  /** Unix ms; the time of records that carry no time of their own (see {@link recordTimeMs}). Default `Date.now`. */
  readonly clock?: () => number;
  /**
   * Unix ms of boot: a record's monotonic stamp (kmsg `TS_US`, dmesg's `[secs.usec]`, µs since
   * boot) becomes `bootTimeMs + stamp/1000`. Undefined: such records are timed by `clock`.
   */
  readonly bootTimeMs?: number;
  /** Boot id stamped on every fault (`/proc/sys/kernel/random/boot_id`); absent: unknown. */
  readonly bootId?: string;
  /** Default {@link DEFAULT_MAX_RECORD_CHARS}. */
  readonly maxRecordChars?: number;
}

/** Counters of a {@link KernelFaultTracker}: how much was read and why records did not count. */
export interface KernelFaultTrackerStats {
  /** Records and lines seen (continuations included). */
  records: number;
  /** Records cut at `maxRecordChars`. */
  truncated: number;
  /** NVRM/SXid records with a facility other than kernel (0): user space wrote them to /dev/kmsg. */
  ignoredFacility: number;
  /** Fallen-off-bus messages folded into an Xid 79 already seen for the same GPU. */
  deduped: number;
  /** Records that were an Xid, an SXid or a fallen-off-bus message. */
  faultRecords: number;
  /**
   * NVRM/SXid records skipped because one with the same monotonic stamp and text was read
   * before: a restarted `dmesg -w`, or a rotated file, printing the ring buffer again.
   */
  replayed: number;
  /** Faults forgotten at `maxFaults` (see {@link XidAggregatorOptions.maxFaults}). */
  evicted: number;
  /** Of those, faults that took a GPU out (reset-gpu, drain-node, reboot). */
  evictedUnhealthy: number;
  /** Faults put back from saved state that the log no longer held. */
  restored: number;
  /**
   * Boot boundaries found in a log that holds several boots (a text log's `[secs.usec]` stamps,
   * or a kmsg-format log's seq, restarting): faults read before the last one are an earlier
   * boot's.
   */
  bootBoundaries: number;
  /**
   * Faults held now whose last record is an earlier boot's: reported with action `ignore` (see
   * {@link KernelFaultTracker}). A gauge, not a counter.
   */
  earlierBootFaults: number;
}

/**
 * Pure core of the kernel-log watcher: kernel log text in, GPU faults out. Each call to
 * {@link add} takes one `/dev/kmsg` record or one text line (any prefix {@link parseKmsgRecord}
 * knows); text continuation lines are joined to the record before them so the multi-line
 * fallen-off-bus message parses. Only kernel-facility records count when the facility is known
 * (user space may write to /dev/kmsg, and must not forge a fault). A record with a monotonic
 * stamp (kmsg `TS_US`, dmesg `[secs.usec]`) whose stamp and text were read before is skipped
 * (counted as `replayed`): a text log has no kmsg sequence numbers, and `dmesg -w` restarted,
 * or a rotated file, prints the ring buffer again. Records are timed by
 * {@link recordTimeMs}.
 *
 * A text log may hold several boots (a file that `dmesg` output was appended to across
 * reboots): its `[secs.usec]` stamps restart near 0 at each. Every stamped text line, fault or
 * not, is watched for a step back of more than a second (smaller ones are printk storing records
 * a little out of time order). A step back is a new boot — or the same boot's ring buffer printed
 * again, which is not — once the lines after it tell: a stamp past the end of the run before it
 * that never printed that run's last line again, an NVRM/SXid record inside the stamps that run
 * covered that was not read before, or a run before it that holds a stamp past this boot's uptime
 * (then at once). Until they tell, records are not live. At a new boot, every fault read before
 * it is an earlier boot's: its times move to `bootTimeMs` at the latest (it happened before this
 * boot began), its records count no more toward this boot's highest stamp, and this boot's first
 * record of it opens a new burst (`opened`). A fault whose last record is an earlier boot's (a
 * text record past this boot's uptime, or any before a boundary) is reported with action
 * `ignore`, no boot id and its catalog action in the description ({@link earlierBootNote}): the
 * reboot reset the GPUs, so it takes no GPU out and drains no node on this boot (counted in
 * `earlierBootFaults`); this boot's next record of it acts again. Only the last boot in the log
 * is dated from `bootTimeMs` plus its stamps. A record read live before the boundary that shows
 * it to be an earlier boot's (appended to a FIFO, or a rotated file, in one go) was reported
 * live already: its event stands (an engine restarted over it stays restarted); from the
 * boundary on, its fault is dated and reported as above, though no event says so.
 *
 * A file of kmsg records (saved from /dev/kmsg across reboots) is split the same way by its seq,
 * which the kernel numbers from 0 at each boot and never repeats within one: any step back is a
 * new boot, or a reader that reopened /dev/kmsg printing the buffer again from its oldest record,
 * told apart as above (the run's last seq printed again with the same record, or an unread
 * NVRM/SXid record at a seq the run covered). A kmsg record is an earlier boot's only before such
 * a boundary, not for a stamp past the uptime (which a wall clock stepped back since the boot
 * time was read also gives): /dev/kmsg itself holds one boot and its watcher never hands a seq
 * over twice, so none of this touches it. Constant memory: the bounds and last line of two runs
 * per format, and fault keys bounded by `maxFaults`.
 */
export interface KernelFaultTracker {
  /** Folds one record in; returns the faults it opened or whose action it changed. Never throws. */
  add(text: string, live: boolean): KernelFaultEvent[];
  /** Current faults, in the order first seen. */
  faults(): GpuFault[];
  /**
   * Puts back faults saved earlier in this boot (the watcher's `stateFile`) after the log was
   * read: one the log no longer holds comes back as it was saved, its description marked
   * restored; one the log still holds merges with it ({@link XidAggregator.restore}). Events
   * are never live, so nothing restarts an engine over them. Faults that are not well formed
   * (bad PCI id, code, action or times) are skipped. Never throws.
   */
  restore(saved: readonly GpuFault[]): KernelFaultEvent[];
  /**
   * `LLMGW_DISCOVERY_KERNEL_LOG_OVERRUN` once faults were forgotten at `maxFaults`: the log
   * held more faults than llmgw reports. Empty otherwise.
   */
  problems(): Problem[];
  stats(): KernelFaultTrackerStats;
}

/** The record a continuation line may still extend (text logs only). */
interface PendingRecord {
  message: string;
  seq: number | undefined;
  atMs: number;
  /** Whether the record was live (see {@link KernelFaultEvent.live}). */
  live: boolean;
  /** A fallen-off-bus message was found in it already. */
  matched: boolean;
  /** The record is an earlier boot's (see {@link KernelFaultEvent.live}). */
  earlierBoot: boolean;
}

const MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
// The wall-clock stamps of the text front-ends (§1.1): syslog/journal `Dec  2 11:38:47 host kernel: `
// (local time, no year), `dmesg -T` `[Sun Feb 23 16:24:18 2025] ` (local time), and
// `dmesg --time-format=iso` `2025-01-21T04:41:44,283302+00:00`.
const SYSLOG_STAMP = /^([A-Z][a-z]{2}) ([ \d]\d) (\d\d):(\d\d):(\d\d) \S+ kernel: /;
const CTIME_STAMP = /^\[[A-Z][a-z]{2} ([A-Z][a-z]{2}) ([ \d]\d) (\d\d):(\d\d):(\d\d) (\d{4})\]/;
const ISO_STAMP =
  /^[a-z]+\s*:[a-z]+\s*:\s(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:[,.](\d{1,9}))?(?:([+-]\d\d):?(\d\d)|(Z))?\s/;
const DAY_MS = 86_400_000;
/** `/proc/stat`'s `btime` is whole seconds: a stamp this far past the uptime is still this boot's. */
const BOOT_TIME_SLACK_MS = 2_000;

/**
 * Unix ms of a text line's own wall-clock stamp; undefined when it has none or it is not a
 * date. Syslog prints no year: the stamp is taken in the latest year that does not put it more
 * than a day after `nowMs`.
 */
export function parseWallClockMs(line: string, nowMs: number): number | undefined {
  const local = (year: number, month: string, day: string, hms: string[]): number | undefined => {
    const m = MONTHS.indexOf(month);
    const [h, min, sec] = hms.map(Number) as [number, number, number];
    const d = Number(day);
    const date = new Date(year, m, d, h, min, sec);
    const sound = m >= 0 && h < 24 && min < 60 && sec < 61 && date.getDate() === d;
    return sound ? date.getTime() : undefined;
  };
  const syslog = SYSLOG_STAMP.exec(line);
  if (syslog) {
    const [, month = "", day = "", ...hms] = syslog;
    const year = new Date(nowMs).getFullYear();
    const at = local(year, month, day, hms);
    return at !== undefined && at > nowMs + DAY_MS ? local(year - 1, month, day, hms) : at;
  }
  const ctime = CTIME_STAMP.exec(line);
  if (ctime) {
    const [, month = "", day = "", h = "", min = "", sec = "", year = ""] = ctime;
    return local(Number(year), month, day, [h, min, sec]);
  }
  const iso = ISO_STAMP.exec(line);
  if (iso) {
    const [, stamp, fraction = "0", offsetHours, offsetMinutes, zulu] = iso;
    const ms = Number(`0.${fraction}`).toFixed(3).slice(1);
    const zone = zulu ?? (offsetHours === undefined ? "" : `${offsetHours}:${offsetMinutes}`);
    const at = Date.parse(`${stamp}${ms}${zone}`);
    return Number.isFinite(at) ? at : undefined;
  }
  return undefined;
}

/**
 * When a record happened, from the record itself wherever it says, so that reading it again
 * (a restarted `dmesg -w`, an agent restart over the same file) never moves a fault's
 * first/last seen — an operator's clear is compared against them. In order: a kmsg record's
 * `TS_US` from `bootTimeMs`; a text line's wall-clock stamp ({@link parseWallClockMs}); a
 * dmesg `[secs.usec]` stamp from `bootTimeMs` — one past this boot's uptime is an earlier
 * boot's and is timed at `bootTimeMs` (it happened before); else `nowMs`, the time it was read.
 * An earlier boot's record whose stamp is within this boot's uptime is told only by a boot
 * boundary after it: the {@link KernelFaultTracker} then moves its fault to `bootTimeMs`.
 */
export function recordTimeMs(
  record: KernelLogRecord,
  line: string,
  nowMs: number,
  bootTimeMs: number | undefined,
): number {
  const sinceBoot =
    record.tsUsec === undefined || bootTimeMs === undefined
      ? undefined
      : Math.round(bootTimeMs + record.tsUsec / 1000);
  if (record.seq !== undefined && sinceBoot !== undefined) return sinceBoot;
  const wall = parseWallClockMs(line, nowMs);
  if (wall !== undefined) return wall;
  if (sinceBoot !== undefined) return sinceBoot <= nowMs ? sinceBoot : bootTimeMs!;
  return nowMs;
}

/** FNV-1a, 32 bits: a short stand-in for a record's text. */
function hashText(text: string): number {
  let hash = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) {
    hash ^= text.charCodeAt(i);
    hash = Math.imul(hash, 0x01000193);
  }
  return hash >>> 0;
}

/**
 * How far a `[secs.usec]` stamp may step back and still be the same boot: printk takes a
 * record's time before storing it, so records of two CPUs (or an interrupt) may be stored a
 * little out of time order; a reboot steps back to near 0.
 */
const MONOTONIC_STEP_BACK_SLACK_USEC = 1_000_000;

/**
 * A run of records whose places in their boot never step back (one boot, or a replay of it): a
 * text line's place is its `[secs.usec]` stamp, a kmsg record's its seq.
 */
interface BootRun {
  /** The first place and the highest. */
  start: number;
  end: number;
  /** The highest stamp, µs since boot. */
  maxUsec: number;
  /** The last record at {@link end}: a replay of the ring buffer prints it again. */
  lastLine: string;
}

/** The run after a step back, not yet known to be a new boot. */
interface NextRun extends BootRun {
  /** It has shown to be the ring buffer printed again (same boot) until it passes the run. */
  replay: boolean;
}

/**
 * Finds the boot boundaries in a kernel log that holds several boots from where its records
 * stand in their boot, which restarts near 0 at each: a text log's `[secs.usec]` stamps
 * (dmesg's, or syslog's `kernel: [secs.usec]`), or the seq of a log of kmsg records (saved from
 * /dev/kmsg; the kernel numbers a boot's records from 0). A place stepping back means a new boot
 * — or the same boot's ring buffer printed again (a restarted `dmesg -w`, a reader that reopened
 * /dev/kmsg and starts at its oldest record, a tool appending `dmesg` once more), which is not a
 * boundary. The records after the step (the "next" run) tell which: a replay prints again, at
 * the same place, the record that ended the run before the step and every NVRM/SXid record in
 * between, so reaching past the run's end without its last record, or an unread fault record
 * inside the places the run covered, is a new boot. A run holding a stamp past this boot's
 * uptime is an earlier boot's, so a step back after it is a boundary at once. Constant memory:
 * two runs (their bounds and one line each).
 */
interface BootBoundaries {
  /**
   * One record at place `at`, stamped `usec`. `seen` (fault records only): its stamp and text
   * were read before (true), were not (false), or cannot be told (undefined: forgotten).
   * @returns true when the record is the first of a new boot (everything before it is an
   *   earlier boot's).
   */
  observe(at: number, usec: number, line: string, seen: boolean | undefined): boolean;
  /** A step back was seen and it is not yet known whether it started a new boot. */
  undecided(): boolean;
}

/**
 * `slack`: how far a place may step back within one boot — {@link MONOTONIC_STEP_BACK_SLACK_USEC}
 * for stamps, 0 for kmsg seqs, which the kernel hands out one per record, in order.
 */
function createBootBoundaries(slack: number, uptimeUsec: () => number | undefined): BootBoundaries {
  let run: BootRun | undefined;
  let next: NextRun | undefined;
  const fresh = (at: number, usec: number, line: string): BootRun => ({
    start: at,
    end: at,
    maxUsec: usec,
    lastLine: line,
  });
  const extend = (r: BootRun, at: number, usec: number, line: string) => {
    r.maxUsec = Math.max(r.maxUsec, usec);
    if (at >= r.end) {
      r.end = at;
      r.lastLine = line;
    }
  };
  const startBoot = (from: BootRun): true => {
    run = { start: from.start, end: from.end, maxUsec: from.maxUsec, lastLine: from.lastLine };
    next = undefined;
    return true;
  };
  return {
    observe(at, usec, line, seen) {
      if (run === undefined) {
        run = fresh(at, usec, line);
        return false;
      }
      if (next === undefined) {
        if (at >= run.end - slack) {
          extend(run, at, usec, line);
          return false;
        }
        const uptime = uptimeUsec();
        if (uptime !== undefined && run.maxUsec > uptime) return startBoot(fresh(at, usec, line));
        next = { ...fresh(at, usec, line), replay: false };
      } else if (at < next.end - slack) {
        // Stepped back again: the newest run is the one compared with the run before.
        next = { ...fresh(at, usec, line), replay: false };
      } else {
        extend(next, at, usec, line);
      }
      if (at > run.end) {
        // Past the end of the run before the step: a replay has caught up and goes on with it;
        // anything else never printed that run's last record again.
        if (!next.replay) return startBoot(next);
        extend(run, next.end, next.maxUsec, next.lastLine);
        next = undefined;
        return false;
      }
      if (next.replay) return false;
      if ((at === run.end && line === run.lastLine) || seen === true) {
        next.replay = true;
        return false;
      }
      // A fault record the run before would have printed, had this been a replay. (Below the
      // run's first place it may be older than what was read of that boot: undecided.)
      if (seen === false && at >= run.start) return startBoot(next);
      return false;
    },
    undecided: () => next !== undefined && !next.replay,
  };
}

/**
 * Where a line stands in its boot: the seq and `TS_US` of a kmsg record, or a text line's
 * `[secs.usec]` stamp in µs; undefined when it has neither.
 */
function linePlace(line: string): { seq?: number; usec: number } | undefined {
  const kmsg = KMSG_HEADER.exec(line);
  if (kmsg) {
    const seq = Number(kmsg[2]);
    const usec = Number(kmsg[3]);
    return Number.isSafeInteger(seq) && Number.isSafeInteger(usec) ? { seq, usec } : undefined;
  }
  const usec = line.includes("[") ? parseTextLine(line)?.tsUsec : undefined;
  return usec === undefined ? undefined : { usec };
}

/** Creates a {@link KernelFaultTracker}. */
export function createKernelFaultTracker(
  options: KernelFaultTrackerOptions = {},
): KernelFaultTracker {
  const clock = options.clock ?? Date.now;
  const maxRecordChars = options.maxRecordChars ?? DEFAULT_MAX_RECORD_CHARS;
  const maxFaults = options.maxFaults ?? 1024;
  const aggregator = createXidAggregator({
    clock,
    ...(options.windowMs === undefined ? {} : { windowMs: options.windowMs }),
    ...(options.maxFaults === undefined ? {} : { maxFaults: options.maxFaults }),
  });
  // Records that stand for a fallen-off-bus message (no Xid line): their faults say so.
  const fallenOff = new WeakSet<ParsedXid>();
  // Origins of faults restored from saved state that no record of the log backs.
  const restoredOrigins = new WeakSet<ParsedXid>();
  const stats: Omit<KernelFaultTrackerStats, "evicted" | "evictedUnhealthy" | "earlierBootFaults"> =
    {
      records: 0,
      truncated: 0,
      ignoredFacility: 0,
      deduped: 0,
      faultRecords: 0,
      replayed: 0,
      restored: 0,
      bootBoundaries: 0,
    };
  let pending: PendingRecord | undefined;
  // Stamp and text of the NVRM/SXid records read (newest kept), and the highest stamp read.
  const stamped = new Set<string>();
  const maxStamped = 16 * maxFaults;
  let highestUsec = -1;
  // The highest stamp forgotten from `stamped`: below it, "not read before" cannot be told.
  let forgottenUsec = -1;
  // Boot boundaries of a text log (its stamps) and of a log of kmsg records (their seqs; never
  // a step back from /dev/kmsg itself, whose watcher skips a seq read before). Faults folded
  // since the last boundary (`bootKeys`) become an earlier boot's at the next one; those folded
  // after a step back that may be a new boot or a replay wait in `undecidedKeys`, their records
  // not live, the highest of their stamps in `undecidedUsec`. `earlierBootKeys`: faults whose
  // last record is an earlier boot's, so that this boot's first record of one opens a new burst
  // (a reboot resets the GPUs).
  const uptimeUsec = () =>
    options.bootTimeMs === undefined
      ? undefined
      : (clock() - options.bootTimeMs + BOOT_TIME_SLACK_MS) * 1000;
  const textBoots = createBootBoundaries(MONOTONIC_STEP_BACK_SLACK_USEC, uptimeUsec);
  const kmsgBoots = createBootBoundaries(0, uptimeUsec);
  const undecided = () => textBoots.undecided() || kmsgBoots.undecided();
  let bootKeys = new Set<string>();
  let undecidedKeys = new Set<string>();
  let undecidedUsec = -1;
  let earlierBootKeys = new Set<string>();
  /** `keys` less the faults no longer held, once it is twice `maxFaults` (bounded memory). */
  const pruned = (keys: Set<string>): Set<string> => {
    if (keys.size <= 2 * maxFaults + 2) return keys;
    const held = new Set(aggregator.faults().map((f) => f.key));
    return new Set([...keys].filter((k) => held.has(k)));
  };
  /** Everything read before this record was an earlier boot's. */
  const startBoot = () => {
    stats.bootBoundaries++;
    for (const key of bootKeys) {
      // A fault with records on both sides of the step keeps its times (its last is this boot's).
      if (undecidedKeys.has(key)) continue;
      if (options.bootTimeMs !== undefined) aggregator.backdate(key, options.bootTimeMs);
      earlierBootKeys.add(key);
    }
    earlierBootKeys = pruned(earlierBootKeys);
    bootKeys = undecidedKeys;
    undecidedKeys = new Set();
    highestUsec = undecidedUsec;
    undecidedUsec = -1;
  };
  /**
   * Feeds a record stamped `usec` to the boot boundaries of its kind (kmsg when it has a `seq`)
   * and acts on what they tell.
   */
  const observePlace = (
    seq: number | undefined,
    usec: number,
    line: string,
    seen: boolean | undefined,
  ) => {
    const wasUndecided = undecided();
    const boots = seq === undefined ? textBoots : kmsgBoots;
    if (boots.observe(seq ?? usec, usec, line, seen)) {
      startBoot();
    } else if (wasUndecided && !undecided()) {
      // The step back was the same boot's ring buffer printed again.
      for (const key of undecidedKeys) bootKeys.add(key);
      undecidedKeys = new Set();
      highestUsec = Math.max(highestUsec, undecidedUsec);
      undecidedUsec = -1;
    }
  };

  /**
   * Whether the fault's last record is an earlier boot's: a text record past this boot's uptime,
   * or any record before a boot boundary. Never one read from /dev/kmsg (this boot only).
   */
  const isEarlierBoot = (fault: XidFault) => earlierBootKeys.has(fault.key);
  const convert = (fault: XidFault): GpuFault => {
    const earlier = isEarlierBoot(fault);
    const converted = xidFaultToGpuFault(fault, {
      fallenOffBus: fallenOff.has(fault.origin),
      // An earlier boot's fault is not this boot's: its boot id is unknown.
      ...(options.bootId === undefined || earlier ? {} : { bootId: options.bootId }),
    });
    if (earlier) {
      // The reboot reset the GPUs: reported for history, never taking a GPU out on this boot.
      return {
        ...converted,
        action: "ignore",
        description: `${converted.description} ${earlierBootNote(fault.action)}`,
      };
    }
    return restoredOrigins.has(fault.origin)
      ? { ...converted, description: `${converted.description} ${RESTORED_NOTE}` }
      : converted;
  };

  /** When each fault key last produced an event (throttles `seen-again`). */
  const lastEventMs = new Map<string, number>();
  const noteEvent = (key: string, atMs: number) => {
    // Bounded like the faults themselves: forgetting a time only allows one more event.
    if (lastEventMs.size >= 4 * maxFaults) lastEventMs.clear();
    lastEventMs.set(key, atMs);
  };
  const fold = (
    xid: ParsedXid,
    atMs: number,
    seq: number | undefined,
    live: boolean,
    earlierBoot: boolean,
    out: KernelFaultEvent[],
  ) => {
    stats.faultRecords++;
    const faultKey = `${xid.kind}:${xid.pciBusId}:${xid.code}`;
    const newBurst = !earlierBoot && earlierBootKeys.has(faultKey);
    const result = aggregator.add(xid, atMs, seq, { newBurst });
    if (earlierBoot) earlierBootKeys.add(faultKey);
    else earlierBootKeys.delete(faultKey);
    if (undecided()) undecidedKeys = pruned(undecidedKeys.add(faultKey));
    else bootKeys = pruned(bootKeys.add(faultKey));
    earlierBootKeys = pruned(earlierBootKeys);
    const previous = result.previousAction;
    const key = result.fault.key;
    const at = clock();
    if (result.opened || (previous !== undefined && previous !== result.fault.action)) {
      noteEvent(key, at);
    } else if (
      live &&
      UNHEALTHY_ACTIONS.has(result.fault.action) &&
      at - (lastEventMs.get(key) ?? Number.NEGATIVE_INFINITY) >= SEEN_AGAIN_MIN_GAP_MS
    ) {
      noteEvent(key, at);
      out.push({ kind: "seen-again", fault: convert(result.fault), live });
      return;
    }
    const pid = xid.pid === undefined ? {} : { pid: xid.pid };
    if (result.opened) {
      out.push({
        kind: "opened",
        fault: convert(result.fault),
        ...(previous === undefined ? {} : { previousAction: previous }),
        live,
        ...pid,
      });
    } else if (previous !== undefined && previous !== result.fault.action) {
      out.push({
        kind: "action-changed",
        fault: convert(result.fault),
        previousAction: previous,
        live,
        ...pid,
      });
    }
  };

  const foldFallenOff = (
    fallen: FallenOffBus,
    atMs: number,
    seq: number | undefined,
    live: boolean,
    earlierBoot: boolean,
    out: KernelFaultEvent[],
  ) => {
    // One fault per GPU: an Xid 79 already says this GPU fell off the bus.
    const xid79 = aggregator.find("xid", fallen.pciBusId, 79);
    if (xid79 !== undefined && !fallenOff.has(xid79.origin)) {
      stats.deduped++;
      return;
    }
    const record: ParsedXid = {
      kind: "xid",
      code: 79,
      pciBusId: fallen.pciBusId,
      detail: "",
      raw: fallen.raw,
    };
    fallenOff.add(record);
    fold(record, atMs, seq, live, earlierBoot, out);
  };

  return {
    add(text, live) {
      const out: KernelFaultEvent[] = [];
      stats.records++;
      let line = text;
      if (line.length > maxRecordChars) {
        line = line.slice(0, maxRecordChars);
        stats.truncated++;
      }
      // Cheap gate: only NVRM and NVSwitch records can be faults. Anything else ends a pending
      // record unless it is itself a continuation (indented) line.
      if (!line.includes("NVRM") && !line.includes("SXid")) {
        if (!/^[ \t]/.test(line)) {
          pending = undefined;
          // Every stamped line counts for boot boundaries: a new boot's first lines are not NVRM's.
          const place = linePlace(line);
          if (place !== undefined) observePlace(place.seq, place.usec, line, undefined);
        }
        return out;
      }
      const record = parseKmsgRecord(line);
      if (record === undefined) return out;
      if (record.continuation) {
        if (pending === undefined || pending.matched) return out;
        if (pending.message.length + record.message.length < maxRecordChars) {
          pending.message = `${pending.message}\n${record.message}`;
        }
        const fallen = matchFallenOffBus(pending.message, pending.message);
        if (fallen !== undefined) {
          pending.matched = true;
          foldFallenOff(fallen, pending.atMs, pending.seq, pending.live, pending.earlierBoot, out);
        }
        return out;
      }
      pending = undefined;
      if (record.facility !== undefined && record.facility !== 0) {
        stats.ignoredFacility++;
        if (record.tsUsec !== undefined) observePlace(record.seq, record.tsUsec, line, undefined);
        return out;
      }
      let recordLive = live;
      let earlierBoot = false;
      if (record.tsUsec !== undefined) {
        // µs since boot plus the text name one record: read again, it is the ring buffer
        // printed again (a restarted `dmesg -w`, a rotated file), already folded in. A record
        // at or below the highest stamp read is not live either: a backlog, or an earlier
        // boot's record (a new boot's stamps restart near 0, its text is new, so it counts).
        const key = `${record.tsUsec}:${record.message.length}:${hashText(record.message)}`;
        const seen = stamped.has(key) ? true : record.tsUsec <= forgottenUsec ? undefined : false;
        // A log may hold several boots: a stamp (kmsg: a seq) stepping back may start a new one,
        // and then everything read before it is an earlier boot's (see createBootBoundaries).
        observePlace(record.seq, record.tsUsec, line, seen);
        if (seen === true) {
          stats.replayed++;
          return out;
        }
        if (stamped.size >= maxStamped) {
          const forgotten = stamped.values().next().value!;
          stamped.delete(forgotten);
          const usec = Number(forgotten.slice(0, forgotten.indexOf(":")));
          forgottenUsec = Math.max(forgottenUsec, usec);
        }
        stamped.add(key);
        // A stamp past this boot's uptime is an earlier boot's record (a log file holding
        // several boots): never live, and no mark for this boot's records, which a file read
        // after a reboot holds below the earlier boot's highest stamps. A kmsg record past it is
        // not live either, but only a boundary makes it an earlier boot's: read from /dev/kmsg,
        // it is this boot's, past an uptime reckoned from a wall clock that stepped back since
        // the boot time was read. After a step back that may be a new boot, a record is not live
        // until the records after it tell (it may be the ring buffer printed again).
        const pastUptime = record.tsUsec > (uptimeUsec() ?? Number.POSITIVE_INFINITY);
        earlierBoot = pastUptime && record.seq === undefined;
        if (pastUptime) {
          recordLive = false;
        } else if (undecided()) {
          recordLive = false;
          undecidedUsec = Math.max(undecidedUsec, record.tsUsec);
        } else if (record.tsUsec <= highestUsec) {
          recordLive = false;
        } else {
          highestUsec = record.tsUsec;
        }
      }
      const atMs = recordTimeMs(record, line, clock(), options.bootTimeMs);
      const xid = matchXid(record.message, record.message);
      if (xid !== undefined) {
        fold(xid, atMs, record.seq, recordLive, earlierBoot, out);
      } else {
        const fallen = matchFallenOffBus(record.message, record.message);
        if (fallen !== undefined) {
          foldFallenOff(fallen, atMs, record.seq, recordLive, earlierBoot, out);
        }
        pending = {
          message: record.message,
          seq: record.seq,
          atMs,
          live: recordLive,
          matched: fallen !== undefined,
          earlierBoot,
        };
      }
      return out;
    },
    faults() {
      return aggregator.faults().map(convert);
    },
    restore(saved) {
      const out: KernelFaultEvent[] = [];
      for (const candidate of saved) {
        const fault = gpuFaultToXidFault(candidate);
        if (fault === undefined) continue;
        const existing = aggregator.find(fault.kind, fault.pciBusId, fault.code);
        if (candidate.kind === "fallen-off-bus") fallenOff.add(fault.origin);
        const held = aggregator.restore(fault);
        if (existing === undefined) {
          restoredOrigins.add(fault.origin);
          stats.restored++;
          out.push({ kind: "opened", fault: convert(held), live: false, restored: true });
        } else if (existing.action !== held.action) {
          out.push({
            kind: "action-changed",
            fault: convert(held),
            previousAction: existing.action,
            live: false,
            restored: true,
          });
        }
      }
      return out;
    },
    problems() {
      const ev = aggregator.evictions();
      if (ev.total === 0) return [];
      const last = ev.lastUnhealthy;
      const lastText =
        last === undefined
          ? ""
          : ` (the last: ${last.kind === "sxid" ? "SXid" : "Xid"} ${last.code} on ${last.pciBusId}, action ${last.action})`;
      return [
        problem(
          ProblemCodes.kernelLogOverrun,
          "kernel-log",
          `the kernel log held more than the ${maxFaults} faults llmgw keeps: ${ev.total} fault(s) were forgotten, ${ev.unhealthy} of them taking a GPU out${lastText}; faults past the cap are unknown`,
        ),
      ];
    },
    stats() {
      const ev = aggregator.evictions();
      const earlierBootFaults = aggregator.faults().filter(isEarlierBoot).length;
      return { ...stats, evicted: ev.total, evictedUnhealthy: ev.unhealthy, earlierBootFaults };
    },
  };
}

/**
 * Appended to the description of a fault whose records are all an earlier boot's (see
 * {@link KernelFaultTracker}), naming the catalog action it had: `(earlier boot: catalog
 * action reset-gpu, not taken on this boot; the reboot reset the GPU)`.
 */
export function earlierBootNote(catalogAction: FaultAction): string {
  return `(earlier boot: catalog action ${catalogAction}, not taken on this boot; the reboot reset the GPU)`;
}

/** Appended to the description of a fault that came back from saved state. */
export const RESTORED_NOTE =
  "(restored: saved by llmgw earlier in this boot; the kernel log no longer holds the record)";

const FAULT_KINDS: ReadonlySet<string> = new Set(["xid", "sxid", "fallen-off-bus"]);

/**
 * True when `value` (e.g. from a saved JSON file) is a {@link GpuFault} that
 * {@link KernelFaultTracker.restore} accepts: known kind and action, a PCI bus id, a code, a
 * count ≥ 1, finite times and string evidence. Never throws.
 */
export function isRestorableFault(value: unknown): value is GpuFault {
  return gpuFaultToXidFault(value as GpuFault) !== undefined;
}

/** A saved {@link GpuFault} back as an aggregator fault; undefined when it is not well formed. */
function gpuFaultToXidFault(f: GpuFault): XidFault | undefined {
  if (typeof f !== "object" || f === null) return undefined;
  if (typeof f.action !== "string" || !Object.hasOwn(ACTION_SEVERITY, f.action)) return undefined;
  if (!FAULT_KINDS.has(f.kind)) return undefined;
  if (!Number.isSafeInteger(f.code) || f.code < 0 || f.code > 999_999) return undefined;
  if (!Number.isSafeInteger(f.count) || f.count < 1) return undefined;
  if (!Number.isFinite(f.firstSeenUnixMs) || !Number.isFinite(f.lastSeenUnixMs)) return undefined;
  if (typeof f.evidence !== "string") return undefined;
  const pciBusId = typeof f.pciBusId === "string" ? pciBusKey(f.pciBusId) : undefined;
  if (pciBusId === undefined) return undefined;
  const kind: ParsedXid["kind"] = f.kind === "sxid" ? "sxid" : "xid";
  const origin: ParsedXid = {
    kind,
    code: f.code,
    pciBusId,
    detail: "",
    raw: boundEvidence(f.evidence),
  };
  return {
    key: `${kind}:${pciBusId}:${f.code}`,
    kind,
    code: f.code,
    pciBusId,
    action: f.action,
    count: f.count,
    total: f.count,
    bursts: 1,
    firstSeenMs: f.firstSeenUnixMs,
    burstStartMs: f.lastSeenUnixMs,
    lastSeenMs: f.lastSeenUnixMs,
    first: origin,
    last: origin,
    origin,
    ...(Number.isSafeInteger(f.seq) && f.seq! >= 0 ? { originSeq: f.seq } : {}),
  };
}

/** Options of {@link xidFaultToGpuFault}. */
export interface GpuFaultConversion {
  /** The fault stands for a fallen-off-bus message without an Xid. */
  readonly fallenOffBus?: boolean;
  readonly bootId?: string;
}

/** The catalog's description of a fault: Xid catalog, SXid, or fallen off the bus. */
export function describeFault(kind: GpuFault["kind"], code: number): string {
  if (kind === "sxid") return "NVSwitch error (SXid)";
  if (kind === "fallen-off-bus") return "GPU has fallen off the bus";
  return (XID_CATALOG.get(code) ?? UNKNOWN_XID).description;
}

/** Cuts `text` to at most {@link MAX_FAULT_EVIDENCE_CHARS} characters (ending in `…` when cut). */
export function boundEvidence(text: string): string {
  return text.length <= MAX_FAULT_EVIDENCE_CHARS
    ? text
    : `${text.slice(0, MAX_FAULT_EVIDENCE_CHARS - 1)}…`;
}

/**
 * An aggregator fault as the inventory carries it ({@link GpuFault}): `count` is every record
 * since the fault was first seen, `evidence` the (bounded) record that opened it.
 */
export function xidFaultToGpuFault(fault: XidFault, conversion: GpuFaultConversion = {}): GpuFault {
  const kind: GpuFault["kind"] = conversion.fallenOffBus === true ? "fallen-off-bus" : fault.kind;
  return {
    kind,
    code: fault.code,
    action: fault.action,
    pciBusId: fault.pciBusId,
    count: fault.total,
    firstSeenUnixMs: fault.firstSeenMs,
    lastSeenUnixMs: fault.lastSeenMs,
    evidence: boundEvidence(fault.origin.raw),
    description: describeFault(kind, fault.code),
    ...(conversion.bootId === undefined ? {} : { bootId: conversion.bootId }),
    ...(fault.originSeq === undefined ? {} : { seq: fault.originSeq }),
  };
}

/** Actions that take a GPU out of service until a reset is observed or an operator clears it. */
const UNHEALTHY_ACTIONS: ReadonlySet<FaultAction> = new Set(["reset-gpu", "drain-node", "reboot"]);

/**
 * True for a fault that concerns every GPU of the node: a non-ignored NVSwitch SXid (the switch
 * serves them all) and any fault whose action is to drain or reboot the node.
 */
export function isNodeWideFault(fault: GpuFault): boolean {
  if (fault.kind === "sxid") return fault.action !== "ignore";
  return fault.action === "drain-node" || fault.action === "reboot";
}

/** True when the fault makes a GPU unhealthy (reset-gpu, drain-node, reboot). */
export function isUnhealthyFault(fault: GpuFault): boolean {
  return UNHEALTHY_ACTIONS.has(fault.action);
}

/** Short name of a fault for tables and logs: `xid-79`, `sxid-24007`, `fallen-off-bus`. */
export function faultWord(fault: Pick<GpuFault, "kind" | "code">): string {
  return fault.kind === "fallen-off-bus" ? "fallen-off-bus" : `${fault.kind}-${fault.code}`;
}

/**
 * One-line account of a fault for a {@link Problem}: code, catalog description, action, device,
 * count, first-seen time and the evidence line.
 */
export function describeFaultProblem(fault: GpuFault): string {
  const name =
    fault.kind === "fallen-off-bus"
      ? "GPU fallen off the bus (no Xid)"
      : `${fault.kind === "sxid" ? "SXid" : "Xid"} ${fault.code}`;
  const since = Number.isFinite(fault.firstSeenUnixMs)
    ? new Date(fault.firstSeenUnixMs).toISOString()
    : String(fault.firstSeenUnixMs);
  const records = fault.count === 1 ? "1 record" : `${fault.count} records`;
  return `${name} (${fault.description}) on ${fault.pciBusId}: action ${fault.action}; ${records} since ${since}; evidence: ${fault.evidence}`;
}

/** Most kernel-log faults {@link applyKernelFaults} attaches to one GPU (the control plane takes 64). */
export const MAX_KERNEL_FAULTS_PER_GPU = 32;
/** Most `LLMGW_DISCOVERY_GPU_FAULT` health problems per GPU (the control plane takes 16 problems in all). */
export const MAX_FAULT_HEALTH_PROBLEMS_PER_GPU = 4;
/** Most node problems from faults that reach no GPU (the control plane takes 64 node problems in all). */
export const MAX_FAULT_NODE_PROBLEMS = 16;

/** Sort order of faults: the most severe action first, then the most recently seen. */
export function compareFaultUrgency(a: GpuFault, b: GpuFault): number {
  return (
    ACTION_SEVERITY[b.action] - ACTION_SEVERITY[a.action] || b.lastSeenUnixMs - a.lastSeenUnixMs
  );
}

/** The `max` most urgent of `list`, kept in `list`'s order (first seen). */
function mostUrgent<T extends { fault: GpuFault }>(list: readonly T[], max: number): T[] {
  if (list.length <= max) return [...list];
  const kept = new Set(
    [...list].sort((a, b) => compareFaultUrgency(a.fault, b.fault)).slice(0, max),
  );
  return list.filter((item) => kept.has(item));
}

/**
 * `max` problems at most for `items`: all when they fit; else the `max − 1` most urgent (in
 * first-seen order) and one that says how many more there are and names a few.
 */
function boundedFaultProblems<T extends { fault: GpuFault }>(
  items: readonly T[],
  max: number,
  describe: (item: T) => string,
  more: string,
): Problem[] {
  const shown = items.length <= max ? [...items] : mostUrgent(items, max - 1);
  const out = shown.map((item) => problem(ProblemCodes.gpuFault, "kernel-log", describe(item)));
  if (items.length > shown.length) {
    const rest = items
      .filter((item) => !shown.includes(item))
      .sort((a, b) => compareFaultUrgency(a.fault, b.fault));
    const named = rest
      .slice(0, 8)
      .map(({ fault }) => `${faultWord(fault)} ${fault.pciBusId} ${fault.action}`);
    out.push(
      problem(
        ProblemCodes.gpuFault,
        "kernel-log",
        `… and ${rest.length} more kernel-log faults ${more}: ${named.join(", ")}${rest.length > named.length ? ", …" : ""}`,
      ),
    );
  }
  return out;
}

/**
 * Attaches kernel-log faults to the GPUs they concern (pure). A fault matches a GPU by PCI bus
 * id ({@link pciBusKey} on both sides); node-wide faults ({@link isNodeWideFault}) go to every
 * GPU. Each GPU gets its faults in `faults`; those with action `reset-gpu`, `drain-node` or
 * `reboot` also make it unhealthy with a `LLMGW_DISCOVERY_GPU_FAULT` health problem (source
 * `kernel-log`), while `ignore` and `restart-engine` leave health alone. A fault that reaches no
 * GPU (unknown device, or a node without GPUs) becomes a node problem with the same code:
 * never dropped.
 *
 * Bounded to what the control plane accepts (it refuses a whole heartbeat past its limits, and
 * the node goes lost): at most {@link MAX_KERNEL_FAULTS_PER_GPU} faults per GPU (with any it
 * had), {@link MAX_FAULT_HEALTH_PROBLEMS_PER_GPU} fault health problems per GPU and
 * {@link MAX_FAULT_NODE_PROBLEMS} node problems. The most severe, then most recently seen,
 * are kept, in first-seen order; past the problem caps the last problem says
 * `… and N more kernel-log faults` and names some. A GPU is unhealthy whenever any of its
 * faults takes it out, shown or not.
 *
 * @returns new GPU objects (those without faults are returned as they were) and node problems.
 */
export function applyKernelFaults(
  gpus: readonly Gpu[],
  faults: readonly GpuFault[],
): { gpus: Gpu[]; problems: Problem[] } {
  const unattached: { fault: GpuFault; nodeWide: boolean }[] = [];
  const byGpu = new Map<number, { fault: GpuFault }[]>();
  const keys = gpus.map((g) => pciBusKey(g.pciBusId) ?? g.pciBusId);
  for (const fault of faults) {
    const key = pciBusKey(fault.pciBusId) ?? fault.pciBusId;
    const nodeWide = isNodeWideFault(fault);
    let attached = 0;
    gpus.forEach((_, i) => {
      if (!nodeWide && keys[i] !== key) return;
      const list = byGpu.get(i) ?? [];
      list.push({ fault });
      byGpu.set(i, list);
      attached++;
    });
    if (attached === 0) unattached.push({ fault, nodeWide });
  }
  const problems = boundedFaultProblems(
    unattached,
    MAX_FAULT_NODE_PROBLEMS,
    ({ fault, nodeWide }) =>
      `${describeFaultProblem(fault)} (${nodeWide ? "this node reports no GPU to attach it to" : "no GPU of this node has that PCI address"})`,
    "that reach no GPU of this node",
  );
  const out = gpus.map((gpu, i) => {
    const own = byGpu.get(i);
    if (own === undefined) return gpu;
    const had = gpu.faults ?? [];
    const attached = mostUrgent(own, Math.max(0, MAX_KERNEL_FAULTS_PER_GPU - had.length));
    const unhealthy = own.filter(({ fault }) => isUnhealthyFault(fault));
    const health = boundedFaultProblems(
      unhealthy,
      MAX_FAULT_HEALTH_PROBLEMS_PER_GPU,
      ({ fault }) => describeFaultProblem(fault),
      "take this GPU out",
    );
    return {
      ...gpu,
      faults: [...had, ...attached.map(({ fault }) => fault)],
      healthy: gpu.healthy && health.length === 0,
      healthProblems: [...gpu.healthProblems, ...health],
    };
  });
  return { gpus: out, problems };
}
