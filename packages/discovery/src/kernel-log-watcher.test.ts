import { spawnSync } from "node:child_process";
import {
  accessSync,
  appendFileSync,
  closeSync,
  constants,
  mkdtempSync,
  openSync,
  readFileSync,
  renameSync,
  rmSync,
  statSync,
  truncateSync,
  writeFileSync,
  writeSync,
} from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { type KernelFaultEvent, RESTORED_NOTE } from "./kernel-log.js";
import {
  createKmsgSequence,
  type KernelLogWatcher,
  type KernelLogWatcherOptions,
  MAX_STATE_FILE_BYTES,
  readBootId,
  readBootTimeMs,
  readKernelLogFaults,
  watchKernelLog,
} from "./kernel-log-watcher.js";
import { ProblemCodes } from "./problem-codes.js";

// Lines verbatim from shared/reference/health-formats.md §1.1 and §1.3 (sources cited there).
const NOISE = [
  "[ 1843.439662] NVRM: The NVIDIA probe routine failed for 1 device(s).",
  "Feb 14 05:03:41 000-000-00000-1-gpu-1 kernel: mlx5_core 0000:ab:00.0 mlx5_5: Port: 1 Link INIT",
  "[Sun Feb 23 16:24:18 2025] NVRM: GPU Board Serial Number: 1650124014249",
];
const XID_13 =
  "[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter";
const XID_48 =
  "Dec  2 11:38:47 worker4 kernel: [  219.470994] NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at physAddr 0x7fffa8860 partition 7, subpartition 1.";
const XID_79 = "NVRM: Xid (PCI:0000:06:00): 79, GPU has fallen off the bus.";
const XID_31 =
  "[  365.969681] NVRM: Xid (PCI:0000:01:00): 31, pid=13705, name=UnrealEditor, channel 0x0000000c, intr 00000000. MMU Fault: ENGINE GRAPHICS GPC2 GPCCLIENT_PROP_0 faulted @ 0x0_00000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ";
const XID_120 =
  "[605633.376794] NVRM: Xid (PCI:0000:06:00): 120, GSP task exception: store access page fault (cause:0xf) @ pc:0x13ebd80, partition:2#0, task:3";
const R570 = [
  "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0",
  "               NVRM: (PCI ID: 10de:26b5) installed in this system has",
  "               NVRM: fallen off the bus and is not responding to commands.",
];

const dirs: string[] = [];
const watchers: KernelLogWatcher[] = [];
afterEach(async () => {
  for (const w of watchers.splice(0)) await w.close();
  for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
});

function tempDir(): string {
  const dir = mkdtempSync(path.join(tmpdir(), "llmgw-kernel-log-"));
  dirs.push(dir);
  return dir;
}

function watch(options: KernelLogWatcherOptions): {
  watcher: KernelLogWatcher;
  events: KernelFaultEvent[];
} {
  const events: KernelFaultEvent[] = [];
  const watcher = watchKernelLog({
    pollMs: 10,
    retryMs: 20,
    clock: () => 1_000,
    // Booted long enough before the clock for every captured stamp to be this boot's.
    bootTimeMs: 1_000 - 30 * 86_400_000,
    ...options,
    onChange: (e) => events.push(e),
  });
  watchers.push(watcher);
  return { watcher, events };
}

const codes = (w: KernelLogWatcher) => w.faults().map((f) => f.code);

describe("watchKernelLog on a regular file", () => {
  it("reads the backlog (not live), then follows appends (live)", async () => {
    const file = path.join(tempDir(), "kern.log");
    writeFileSync(file, `${[...NOISE, XID_13, XID_13].join("\n")}\n`);
    const { watcher, events } = watch({ path: file });
    await watcher.caughtUp;
    expect(watcher.faults()).toMatchObject([{ code: 13, count: 2, action: "restart-engine" }]);
    expect(watcher.problems()).toEqual([]);
    expect(watcher.stats()).toMatchObject({ source: "file", records: 5, faultRecords: 2 });
    expect(events.map((e) => [e.kind, e.fault.code, e.live])).toEqual([["opened", 13, false]]);
    // No boot id for a file: it may come from another boot.
    expect(watcher.faults()[0]!.bootId).toBeUndefined();

    // A record past the backlog's stamps ([ 1843.439662]) is live.
    appendFileSync(file, `${NOISE[0]}\n${XID_120}\n`);
    await expect.poll(() => codes(watcher)).toEqual([13, 120]);
    expect(events.at(-1)).toMatchObject({ kind: "opened", live: true, fault: { code: 120 } });
  });

  it("`dmesg -w >> file` restarted prints the ring again: old records neither re-open nor count", async () => {
    const file = path.join(tempDir(), "kern.log");
    writeFileSync(file, `${XID_31}\n${NOISE[0]}\n`);
    let now = 1_000_000;
    const { watcher, events } = watch({ path: file, clock: () => now });
    await watcher.caughtUp;
    const before = watcher.faults();
    now += 10 * 60_000;
    appendFileSync(file, `${XID_31}\n${NOISE[0]}\n${XID_120}\n`);
    await expect.poll(() => codes(watcher)).toEqual([31, 120]);
    expect(watcher.faults()[0]).toEqual(before[0]);
    expect(events.map((e) => [e.kind, e.fault.code, e.live])).toEqual([
      ["opened", 31, false],
      ["opened", 120, true],
    ]);
    expect(watcher.stats()).toMatchObject({ records: 5, faultRecords: 2, replayed: 2 });
  });

  it("a rotated file that holds the old records again: only the new one is live", async () => {
    const dir = tempDir();
    const file = path.join(dir, "kern.log");
    writeFileSync(file, `${XID_31}\n`);
    const { watcher, events } = watch({ path: file });
    await watcher.caughtUp;
    renameSync(file, path.join(dir, "kern.log.1"));
    writeFileSync(file, `${XID_31}\n${XID_120}\n`);
    await expect.poll(() => codes(watcher)).toEqual([31, 120]);
    expect(watcher.stats().restarts).toBe(1);
    expect(watcher.faults()[0]!.count).toBe(1);
    expect(events.map((e) => [e.kind, e.fault.code, e.live])).toEqual([
      ["opened", 31, false],
      ["opened", 120, true],
    ]);
  });

  it("sees a new boot appended to the file it read at start: the earlier boot's Xid moves before this boot, this boot's acts", async () => {
    // A plain `dmesg` capture of the earlier boot (§1.1 kmsg records as dmesg prints them, §1.3
    // lines verbatim), read at agent start; then this boot's `dmesg` is appended to it.
    const file = path.join(tempDir(), "dmesg.log");
    const earlierBoot = [
      "[    0.424069] pci_root PNP0A03:00: host bridge window [io  0x0000-0x0cf7] (ignored)",
      "[    5.140900] NET: Registered protocol family 10",
      XID_31,
      NOISE[0],
      XID_120,
    ];
    writeFileSync(file, `${earlierBoot.join("\n")}\n`);
    const boot = 1_000 - 30 * 86_400_000;
    const { watcher, events } = watch({ path: file, bootTimeMs: boot });
    await watcher.caughtUp;
    expect(watcher.faults().map((f) => [f.code, f.firstSeenUnixMs])).toEqual([
      [31, boot + 365_970],
      [120, boot + 605_633_377],
    ]);
    appendFileSync(file, `${earlierBoot.slice(0, 2).join("\n")}\n${R570.join("\n")}\n`);
    await expect.poll(() => watcher.faults().length).toBe(3);
    expect(events.map((e) => [e.fault.kind, e.fault.code, e.live])).toEqual([
      ["xid", 31, false],
      ["xid", 120, false],
      ["fallen-off-bus", 79, true],
    ]);
    expect(watcher.faults().map((f) => [f.code, f.firstSeenUnixMs, f.lastSeenUnixMs])).toEqual([
      [31, boot, boot],
      [120, boot, boot],
      [79, boot + 1_843_308, boot + 1_843_308],
    ]);
    expect(watcher.stats()).toMatchObject({ bootBoundaries: 1, replayed: 0 });
  });

  it("waits for the end of a line, and joins the continuation lines of a record", async () => {
    const file = path.join(tempDir(), "kern.log");
    writeFileSync(file, "");
    const { watcher } = watch({ path: file });
    await watcher.caughtUp;
    appendFileSync(file, `${R570[0]}\n${R570[1]}\n`);
    appendFileSync(file, R570[2]!.slice(0, 30));
    await expect.poll(() => watcher.stats().records).toBe(2);
    expect(watcher.faults()).toEqual([]);
    appendFileSync(file, `${R570[2]!.slice(30)}\n`);
    await expect.poll(() => watcher.faults().map((f) => f.kind)).toEqual(["fallen-off-bus"]);
    expect(watcher.faults()[0]).toMatchObject({
      pciBusId: "00000000:B3:00.0",
      action: "reboot",
      evidence: R570.map((l) => l.trim().replace(/^\[ 1843\.308145\] /, "")).join("\n"),
    });
  });

  it("starts over after a truncation and after a rotation to a new file", async () => {
    const dir = tempDir();
    const file = path.join(dir, "kern.log");
    writeFileSync(file, `${XID_13}\n${NOISE[1]}\n`);
    const { watcher } = watch({ path: file });
    await watcher.caughtUp;
    truncateSync(file, 0);
    appendFileSync(file, `${XID_48}\n`);
    await expect.poll(() => codes(watcher)).toEqual([13, 48]);
    expect(watcher.stats().restarts).toBe(1);

    renameSync(file, path.join(dir, "kern.log.1"));
    writeFileSync(file, `${XID_79}\n`);
    await expect.poll(() => codes(watcher)).toEqual([13, 48, 79]);
    expect(watcher.stats().restarts).toBe(2);
  });

  it("cuts an over-long line and counts it", async () => {
    const file = path.join(tempDir(), "kern.log");
    writeFileSync(file, `${XID_13}${" x".repeat(200)}\n${XID_48}\n`);
    const { watcher } = watch({ path: file, maxRecordChars: 300 });
    await watcher.caughtUp;
    // The cut Xid 13 still parses (its code precedes the cut); the next line is intact.
    expect(codes(watcher)).toEqual([13, 48]);
    expect(watcher.stats().truncated).toBe(1);
    expect(watcher.faults()[0]!.evidence.length).toBeLessThanOrEqual(300);
  });

  it("keeps going when a listener throws", async () => {
    const file = path.join(tempDir(), "kern.log");
    writeFileSync(file, `${XID_13}\n${XID_48}\n`);
    const watcher = watchKernelLog({
      path: file,
      onChange: () => {
        throw new Error("listener bug");
      },
    });
    watchers.push(watcher);
    await watcher.caughtUp;
    expect(codes(watcher)).toEqual([13, 48]);
  });
});

describe("watchKernelLog on a FIFO", () => {
  it("reads what a writer sends, live after catching up", async () => {
    const fifo = path.join(tempDir(), "kmsg.fifo");
    const made = spawnSync("mkfifo", [fifo]);
    expect(made.status).toBe(0);
    const { watcher, events } = watch({ path: fifo });
    await watcher.caughtUp; // no writer yet: nothing to read
    expect(watcher.stats().source).toBe("fifo");
    const fd = openSync(fifo, constants.O_WRONLY | constants.O_NONBLOCK);
    try {
      writeSync(fd, `${NOISE[2]}\n${XID_79}\n`);
      await expect.poll(() => codes(watcher)).toEqual([79]);
      expect(events).toMatchObject([{ kind: "opened", live: true }]);
    } finally {
      closeSync(fd);
    }
  });
});

describe("watchKernelLog when the log cannot be read", () => {
  it("reports a problem naming the path and errno (faults unknown), then recovers when it appears", async () => {
    const file = path.join(tempDir(), "missing.log");
    const { watcher, events } = watch({ path: file });
    await watcher.caughtUp;
    expect(watcher.faults()).toEqual([]);
    expect(watcher.problems()).toEqual([
      {
        code: ProblemCodes.kernelLogUnreadable,
        source: "kernel-log",
        message: `cannot open the kernel log ${file} (ENOENT): GPU faults it would report (Xid, SXid, fallen off the bus) are unknown, not absent; retrying every 0.02 s`,
      },
    ]);
    writeFileSync(file, `${XID_48}\n`);
    await expect.poll(() => codes(watcher)).toEqual([48]);
    expect(watcher.problems()).toEqual([]);
    // Read as the backlog of a new opening: old records never count as live.
    expect(events).toMatchObject([{ live: false }]);
  });

  it("refuses a directory with a problem, not a throw", async () => {
    const dir = tempDir();
    const report = await readKernelLogFaults(dir);
    expect(report.faults).toEqual([]);
    expect(report.problems.map((p) => p.code)).toEqual([ProblemCodes.kernelLogUnreadable]);
    expect(report.problems[0]!.message).toContain(`${dir} (EINVAL)`);
    expect(report.problems[0]!.message).not.toContain("retrying");
  });

  it.skipIf(process.getuid?.() === 0)(
    "names EACCES with what it takes to read the log (skipped as root, who can read a mode-000 file)",
    async () => {
      const file = path.join(tempDir(), "secret.log");
      writeFileSync(file, `${XID_48}\n`, { mode: 0o000 });
      const report = await readKernelLogFaults(file);
      expect(report.problems[0]!.message).toContain("(EACCES)");
      expect(report.problems[0]!.message).toContain("CAP_SYSLOG");
    },
  );

  it("rejects bad options with the option's name", () => {
    expect(() => watchKernelLog({ path: "" })).toThrow(/kernel log path/);
    expect(() => watchKernelLog({ path: "/x", pollMs: 0 })).toThrow(
      "kernel log option pollMs must be a positive integer, got 0",
    );
  });
});

describe("readKernelLogFaults", () => {
  it("reads to the end once, including a last line without a newline", async () => {
    const file = path.join(tempDir(), "kern.log");
    writeFileSync(file, `${XID_13}\n${XID_79}`);
    const report = await readKernelLogFaults(file, { clock: () => 7 });
    // `dmesg -T` stamps its local time; a line without a stamp is timed when read.
    expect(report.faults.map((f) => [f.code, f.firstSeenUnixMs])).toEqual([
      [13, new Date(2024, 7, 30, 11, 43, 9).getTime()],
      [79, 7],
    ]);
    expect(report.stats.source).toBe("file");
  });

  it.each([
    ["syslog (kern.log)", XID_48, new Date(2022, 11, 2, 11, 38, 47).getTime()],
    ["dmesg", XID_31, 1_600_000_000_000 + 365_970],
  ])(
    "times a %s record from its own stamps: read again after an agent restart, its first/last seen do not move (an operator's clear holds)",
    async (_, line, seenAt) => {
      const file = path.join(tempDir(), "kern.log");
      writeFileSync(file, `${line}\n`);
      const read = async (clockMs: number) =>
        (await readKernelLogFaults(file, { clock: () => clockMs, bootTimeMs: 1_600_000_000_000 }))
          .faults;
      const first = await read(1_700_000_000_000);
      const second = await read(1_700_003_600_000);
      expect(first).toMatchObject([{ count: 1, firstSeenUnixMs: seenAt, lastSeenUnixMs: seenAt }]);
      expect(second).toEqual(first);
    },
  );

  it("dates only the last boot of a file of several plain `dmesg` boots from this boot's start", async () => {
    // Two boots appended to one file (§1.3 lines verbatim): the earlier one's Xid 31 at a small
    // stamp, then this boot's fallen-off-bus record, whose stamp is below the earlier boot's last.
    const file = path.join(tempDir(), "dmesg.log");
    writeFileSync(file, `${[XID_31, NOISE[0], XID_120, ...R570].join("\n")}\n`);
    const boot = 1_600_000_000_000;
    const report = await readKernelLogFaults(file, {
      clock: () => boot + 30 * 86_400_000,
      bootTimeMs: boot,
    });
    expect(report.faults.map((f) => [f.kind, f.code, f.firstSeenUnixMs])).toEqual([
      ["xid", 31, boot],
      ["xid", 120, boot],
      ["fallen-off-bus", 79, boot + 1_843_308],
    ]);
    expect(report.stats.bootBoundaries).toBe(1);
  });

  it("leaves a single-boot plain `dmesg` file as it was", async () => {
    const file = path.join(tempDir(), "dmesg.log");
    writeFileSync(file, `${[XID_31, ...R570, NOISE[0], XID_120].join("\n")}\n`);
    const boot = 1_600_000_000_000;
    const report = await readKernelLogFaults(file, {
      clock: () => boot + 30 * 86_400_000,
      bootTimeMs: boot,
    });
    expect(report.faults.map((f) => [f.kind, f.code, f.firstSeenUnixMs])).toEqual([
      ["xid", 31, boot + 365_970],
      ["fallen-off-bus", 79, boot + 1_843_308],
      ["xid", 120, boot + 605_633_377],
    ]);
    expect(report.stats).toMatchObject({ bootBoundaries: 0, replayed: 0 });
  });

  it("times kmsg-format records from the boot time and keeps their seq", async () => {
    const file = path.join(tempDir(), "kmsg.txt");
    // KDOC header grammar (§1.1) around a verbatim §1.3 message; `4,` = kernel warning.
    writeFileSync(file, `4,77,2000000,-;${XID_79}\n12,78,2000001,-;${XID_48}\n`);
    const report = await readKernelLogFaults(file, { bootTimeMs: 10_000, bootId: "b-1-2-3" });
    // The second record has facility 1 (user space wrote it): ignored.
    expect(report.faults).toMatchObject([
      { code: 79, seq: 77, firstSeenUnixMs: 12_000, bootId: "b-1-2-3" },
    ]);
    expect(report.stats.ignoredFacility).toBe(1);
  });

  it("splits a file of kmsg records from several boots where seq and TS_US restart", async () => {
    // kmsg records appended to one file at each boot: §1.1's verbatim records (GPUD kmsg.1.log)
    // and the KDOC header grammar around verbatim §1.3 messages. The earlier boot's Xid 79 takes
    // nothing out on this boot; this boot's Xid 31, at a seq the earlier boot had read already,
    // is dated from its stamp and acts.
    const file = path.join(tempDir(), "kmsg.txt");
    const earlierBoot = [
      "6,339,5140900,-;NET: Registered protocol family 10",
      "6,3964,206764307,-;nvidia-nvswitch2: open (major=510)",
      `4,3970,219470994,-;${XID_79}`,
      "6,3973,227986636,-;IPv6: ADDRCONF(NETDEV_CHANGE): eth0: link becomes ready",
    ];
    const thisBoot = [
      "6,339,5140900,-;NET: Registered protocol family 10",
      `4,3800,365969681,-;${XID_31.slice("[  365.969681] ".length)}`,
    ];
    writeFileSync(file, `${[...earlierBoot, ...thisBoot].join("\n")}\n`);
    const boot = 1_600_000_000_000;
    const report = await readKernelLogFaults(file, {
      clock: () => boot + 30 * 86_400_000,
      bootTimeMs: boot,
      bootId: "b-1-2-3",
    });
    expect(
      report.faults.map((f) => [f.code, f.action, f.seq, f.firstSeenUnixMs, f.bootId]),
    ).toEqual([
      [79, "ignore", 3970, boot, undefined],
      [31, "restart-engine", 3800, boot + 365_970, "b-1-2-3"],
    ]);
    expect(report.stats).toMatchObject({ bootBoundaries: 1, earlierBootFaults: 1, replayed: 0 });
  });
});

describe("createKmsgSequence", () => {
  it("skips records read again after a reopen", () => {
    const seq = createKmsgSequence("/dev/kmsg");
    expect([0, 1, 2, 0, 1, 3].map((n) => seq.accept(n))).toEqual([
      true,
      true,
      true,
      false,
      false,
      true,
    ]);
    expect(seq.problem()).toBeUndefined();
  });

  it("reports records overwritten before the first read once, when the first seq is past 0", () => {
    const seq = createKmsgSequence("/dev/kmsg");
    expect([5, 6, 7].map((n) => seq.accept(n))).toEqual([true, true, true]);
    expect([seq.overruns(), seq.lostRecords()]).toEqual([1, 5]);
    expect(seq.problem()).toEqual({
      code: ProblemCodes.kernelLogOverrun,
      source: "kernel-log",
      message:
        "records 0..4 were overwritten before llmgw read them; faults in them are unknown (/dev/kmsg: the kernel's ring buffer wrapped before the watcher started)",
    });
    // An EPIPE before the first record is the same loss, counted once.
    const epipeFirst = createKmsgSequence("/dev/kmsg");
    epipeFirst.epipe();
    epipeFirst.accept(3);
    expect([epipeFirst.overruns(), epipeFirst.lostRecords()]).toEqual([1, 3]);
  });

  it("counts one overrun per EPIPE burst and the records lost from the seq gap", () => {
    const seq = createKmsgSequence("/dev/kmsg");
    seq.accept(0);
    seq.accept(10);
    seq.epipe();
    seq.epipe();
    seq.accept(25);
    expect(seq.overruns()).toBe(1);
    expect(seq.lostRecords()).toBe(14);
    expect(seq.problem()).toEqual({
      code: ProblemCodes.kernelLogOverrun,
      source: "kernel-log",
      message:
        "the kernel's ring buffer overwrote 14 record(s) (seq 11–24) before /dev/kmsg was read; faults among them are unknown (1 overrun(s), 14 record(s) lost since the watcher started)",
    });
    seq.epipe();
    seq.accept(30);
    expect([seq.overruns(), seq.lostRecords()]).toEqual([2, 18]);
  });
});

const kmsgReadable = (() => {
  try {
    accessSync("/dev/kmsg", constants.R_OK);
    closeSync(openSync("/dev/kmsg", constants.O_RDONLY | constants.O_NONBLOCK));
    return true;
  } catch {
    return false;
  }
})();

describe("watchKernelLog on this machine's /dev/kmsg", () => {
  it.skipIf(!kmsgReadable)(
    "reads the kernel's buffer from the start, one record per read, with the boot id",
    async () => {
      const stateFile = path.join(tempDir(), "kernel-faults.json");
      const { watcher } = watch({ path: "/dev/kmsg", stateFile });
      await watcher.caughtUp;
      const stats = watcher.stats();
      expect(stats.source).toBe("kmsg");
      expect(stats.records).toBeGreaterThan(0);
      // A long-running machine's ring buffer may have wrapped already (first seq > 0).
      expect(watcher.problems().filter((p) => p.code !== ProblemCodes.kernelLogOverrun)).toEqual(
        [],
      );
      const bootId = readFileSync("/proc/sys/kernel/random/boot_id", "utf8").trim();
      for (const fault of watcher.faults()) expect(fault.bootId).toBe(bootId);
      expect(JSON.parse(readFileSync(stateFile, "utf8"))).toMatchObject({ version: 1, bootId });
      expect(statSync(stateFile).mode & 0o777).toBe(0o600);
    },
  );
});

describe("readBootTimeMs", () => {
  it("reads btime from a /proc/stat-shaped file, and is undefined when it is missing", () => {
    const dir = mkdtempSync(path.join(tmpdir(), "llmgw-btime-"));
    const stat = path.join(dir, "stat");
    // The shape of /proc/stat (proc(5)): one `btime <seconds>` line among the counters.
    writeFileSync(
      stat,
      "cpu  2255 34 2290 22625563 6290 127 456\nbtime 1796120893\nprocesses 4242\n",
    );
    expect(readBootTimeMs(stat)).toBe(1_796_120_893_000);
    writeFileSync(stat, "cpu  2255 34 2290 22625563 6290 127 456\n");
    expect(readBootTimeMs(stat)).toBeUndefined();
    expect(readBootTimeMs(path.join(dir, "absent"))).toBeUndefined();
    rmSync(dir, { recursive: true, force: true });
  });
});

describe("watchKernelLog forgets faults past maxFaults", () => {
  it("spares the fault that takes a GPU out and reports every eviction", async () => {
    const file = path.join(tempDir(), "kern.log");
    writeFileSync(file, `${XID_48}\n${XID_13}\n${XID_79}\n`);
    const report = await readKernelLogFaults(file, { maxFaults: 1, clock: () => 7 });
    expect(report.faults.map((f) => f.code)).toEqual([79]);
    expect(report.stats).toMatchObject({ evicted: 2, evictedUnhealthy: 1 });
    expect(report.problems).toEqual([
      {
        code: ProblemCodes.kernelLogOverrun,
        source: "kernel-log",
        message:
          "the kernel log held more than the 1 faults llmgw keeps: 2 fault(s) were forgotten, 1 of them taking a GPU out (the last: Xid 48 on 00000000:07:00.0, action reset-gpu); faults past the cap are unknown",
      },
    ]);
  });
});

describe("watchKernelLog with a stateFile", () => {
  // /dev/null is a character device, so the watcher reads it as kmsg: a log that no longer
  // holds any record. The saved fault's evidence is the verbatim Xid 48 line (§1.3).
  const BOOT = "0b6b7808-c002-f593-ac86-cd8e57757b94";
  const saved48 = {
    kind: "xid",
    code: 48,
    action: "reset-gpu",
    pciBusId: "00000000:07:00.0",
    count: 3,
    firstSeenUnixMs: 1_000,
    lastSeenUnixMs: 2_000,
    evidence: XID_48,
    description: "Double Bit ECC Error",
    bootId: BOOT,
    seq: 42,
  };
  const saved13 = { ...saved48, code: 13, action: "restart-engine", pciBusId: "00000000:CB:00.0" };
  const writeState = (file: string, body: unknown) =>
    writeFileSync(file, typeof body === "string" ? body : JSON.stringify(body));
  const readState = (file: string) => JSON.parse(readFileSync(file, "utf8"));

  it("restores this boot's faults the log no longer holds, never live, and saves them 0600", async () => {
    const stateFile = path.join(tempDir(), "kernel-faults.json");
    writeState(stateFile, { version: 1, bootId: BOOT, faults: [saved48, saved13] });
    const { watcher, events } = watch({ path: "/dev/null", bootId: BOOT, stateFile });
    await watcher.caughtUp;
    // Only faults that take a GPU out are saved and restored; restart-engine ones are not.
    expect(watcher.faults()).toEqual([
      { ...saved48, description: `Double Bit ECC Error ${RESTORED_NOTE}` },
    ]);
    expect(events.map((e) => [e.kind, e.live, e.restored, e.fault.code])).toEqual([
      ["opened", false, true, 48],
    ]);
    expect(watcher.problems()).toEqual([]);
    expect(readState(stateFile)).toMatchObject({
      version: 1,
      bootId: BOOT,
      faults: [{ code: 48, lastSeenUnixMs: 2_000 }],
    });
    expect(statSync(stateFile).mode & 0o777).toBe(0o600);
    expect(watcher.stats()).toMatchObject({ source: "kmsg", restored: 1, stateWrites: 1 });
  });

  it("discards a file from another boot (or without one) and overwrites it", async () => {
    for (const bootId of ["another-boot-0001", undefined]) {
      const stateFile = path.join(tempDir(), "kernel-faults.json");
      writeState(stateFile, { version: 1, bootId, faults: [saved48] });
      const { watcher } = watch({ path: "/dev/null", bootId: BOOT, stateFile });
      await watcher.caughtUp;
      expect(watcher.faults()).toEqual([]);
      expect(watcher.problems()).toEqual([]);
      expect(readState(stateFile)).toEqual({ version: 1, bootId: BOOT, faults: [] });
    }
  });

  it.each([
    ["not JSON", '{"version": 1, "faults": [', "not JSON"],
    ["another shape", { version: 2, bootId: BOOT, faults: [] }, "not a version 1 file"],
    [
      "a malformed fault",
      { version: 1, bootId: BOOT, faults: [saved48, { ...saved48, code: 64, pciBusId: "nope" }] },
      "1 of 2 saved faults are malformed and were skipped",
    ],
    ["too big", " ".repeat(MAX_STATE_FILE_BYTES + 1), `more than ${MAX_STATE_FILE_BYTES}`],
  ])("reports %s as a problem and starts afresh, never throwing", async (_, body, detail) => {
    const stateFile = path.join(tempDir(), "kernel-faults.json");
    writeState(stateFile, body);
    const { watcher } = watch({ path: "/dev/null", bootId: BOOT, stateFile });
    await watcher.caughtUp;
    const problems = watcher.problems();
    expect(problems).toHaveLength(1);
    expect(problems[0]).toMatchObject({ code: ProblemCodes.kernelLogStateFailed });
    expect(problems[0]!.message).toContain(
      `cannot read the saved kernel-log faults ${stateFile} (`,
    );
    expect(problems[0]!.message).toContain(detail);
    // The well-formed fault of a partly malformed file still comes back.
    expect(watcher.faults().map((f) => f.code)).toEqual(detail.startsWith("1 of 2") ? [48] : []);
    expect(readState(stateFile)).toMatchObject({ version: 1, bootId: BOOT });
  });

  it("reports a state file it cannot write, and keeps watching", async () => {
    const stateFile = path.join(tempDir(), "no-such-dir", "kernel-faults.json");
    const { watcher } = watch({ path: "/dev/null", bootId: BOOT, stateFile });
    await watcher.caughtUp;
    expect(watcher.problems()).toMatchObject([
      {
        code: ProblemCodes.kernelLogStateFailed,
        message: expect.stringContaining("cannot write the saved kernel-log faults"),
      },
    ]);
    expect(watcher.stats().source).toBe("kmsg");
  });

  it("does nothing for a regular file, which has no boot id", async () => {
    const dir = tempDir();
    const file = path.join(dir, "kern.log");
    const stateFile = path.join(dir, "kernel-faults.json");
    writeFileSync(file, `${XID_48}\n`);
    writeState(stateFile, { version: 1, bootId: BOOT, faults: [{ ...saved48, code: 64 }] });
    const { watcher } = watch({ path: file, bootId: BOOT, stateFile });
    await watcher.caughtUp;
    expect(codes(watcher)).toEqual([48]);
    expect(readState(stateFile).faults[0].code).toBe(64); // untouched
  });
});

describe("readBootId", () => {
  it("reads a boot id (lower-cased), and is undefined for junk or a missing file", () => {
    const dir = mkdtempSync(path.join(tmpdir(), "llmgw-bootid-"));
    const file = path.join(dir, "boot_id");
    try {
      writeFileSync(file, "6CF3B8A0-3D0C-4F1E-9A57-0D6A2F1C2B11\n");
      expect(readBootId(file)).toBe("6cf3b8a0-3d0c-4f1e-9a57-0d6a2f1c2b11");
      writeFileSync(file, "not a boot id\n");
      expect(readBootId(file)).toBeUndefined();
      expect(readBootId(path.join(dir, "absent"))).toBeUndefined();
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
