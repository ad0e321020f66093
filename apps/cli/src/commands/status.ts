import { toJson } from "@bufbuild/protobuf";
import { escapeOutsideText } from "@llmgw/control-plane/client";
import { GetClusterStatusResponseSchema, type RouterInfo, type Tenant } from "@llmgw/proto";
import { cacheIsolationStrictness } from "@llmgw/router";
import { COPY_AGE_HEADER, SERVED_BY_HEADER } from "@llmgw/wire";
import { ADMIN_FLAGS, ADMIN_FLAGS_USAGE, adminContext, runAdmin } from "../admin-client.js";
import { deploymentRow, fleetVersions } from "../cluster-format.js";
import { type Command, parseCommandArgs } from "../command.js";
import { renderTable } from "../table.js";

export const command: Command = {
  name: "status",
  summary: "one-screen summary of the cluster",
  usage: `Usage: llmgw status [options]\n\nNodes, GPUs by class and fabric, deployments and replicas at a glance, and the versions\nrunning ("mixed: ..." during an upgrade, naming which control planes, agents and routers run which).\n\nOptions:\n${ADMIN_FLAGS_USAGE}`,
  async run(argv, io) {
    const { values } = parseCommandArgs(argv, ADMIN_FLAGS);
    const ctx = adminContext(values, io);
    return runAdmin(io, ctx, async () => {
      // Set when no leader answered and a follower did, from its copy of the state.
      let copyAgeMs: string | undefined;
      const [s, d, nodes, routers, tenants] = await Promise.all([
        ctx.client.getClusterStatus(
          {},
          {
            onHeader: (h) => {
              if (h.get(SERVED_BY_HEADER) === "follower") copyAgeMs = h.get(COPY_AGE_HEADER) ?? "?";
            },
          },
        ),
        ctx.client.listDeployments({}),
        ctx.client.listNodes({}),
        // A control plane older than routers apart from it has no list of them.
        ctx.client.listRouters({}).catch(() => ({ routers: [] })),
        ctx.client.listTenants({}).catch(() => ({ tenants: [] })),
      ]);
      if (ctx.json) {
        io.stdout.write(`${JSON.stringify(toJson(GetClusterStatusResponseSchema, s), null, 2)}\n`);
        return 0;
      }
      // Versions, names and headers come from the cluster (an agent reports its own version):
      // each summary line is one line, whatever control characters they hold.
      const summary = [
        `control plane ${ctx.url} (llmgw ${s.version}, ${s.store || "sqlite"} store${s.controlPlanes.length > 0 ? `, ${s.controlPlanes.length} instance${s.controlPlanes.length === 1 ? "" : "s"}` : ""})`,
        ...(copyAgeMs === undefined
          ? []
          : [
              `answered by a follower from its copy of the state (${copyAgeMs} ms old): no leader answered; live readings are not in it`,
            ]),
        `nodes        ${s.nodesReady}/${s.nodesTotal} ready`,
        `gpus         ${s.gpusAllocated}/${s.gpusTotal} allocated, ${s.gpusUnhealthy} unhealthy`,
        `deployments  ${s.deploymentsReady}/${s.deploymentsTotal} fully ready`,
        `replicas     ${s.replicasReady}/${s.replicasTotal} ready`,
        ...isolationWarning(routers.routers, tenants.tenants),
        `versions     ${fleetVersions([
          ...(s.controlPlanes.length > 0
            ? s.controlPlanes.map((c) => ({
                kind: "control plane" as const,
                name: c.id,
                version: c.version,
              }))
            : [{ kind: "control plane" as const, name: ctx.url, version: s.version }]),
          ...nodes.nodes.map((n) => ({
            kind: "agent" as const,
            name: n.nodeId,
            version: n.inventory?.agentVersion ?? "",
          })),
          ...routers.routers
            .filter((r) => r.connected && !r.inProcess)
            .map((r) => ({ kind: "router" as const, name: r.id, version: r.version })),
        ])}`,
      ];
      io.stdout.write(`${summary.map(escapeOutsideText).join("\n")}\n`);
      if (s.controlPlanes.length > 0) {
        io.stdout.write(
          `\n${renderTable(
            ["CONTROL PLANE", "URL", "ROLE", "VERSION", "SEEN"],
            s.controlPlanes.map((c) => [
              c.id,
              c.url,
              c.leader ? "leader" : "follower",
              c.version,
              `${(Number(c.seenAgoMs) / 1000).toFixed(1)}s ago`,
            ]),
          )}`,
        );
      }
      if (s.classes.length > 0) {
        io.stdout.write(
          `\n${renderTable(
            ["CLASS", "FABRIC", "TOTAL", "ALLOCATED", "FREE", "UNHEALTHY"],
            s.classes.map((c) => [
              c.gpuClass || "unknown",
              c.fabricId || "-",
              `${c.total}`,
              `${c.allocated}`,
              `${c.free}`,
              `${c.unhealthy}`,
            ]),
          )}`,
        );
      }
      if (d.deployments.length > 0) {
        io.stdout.write(
          `\n${renderTable(["NAME", "MODEL", "ENGINE", "CLASS", "READY", "REV", "STATUS"], d.deployments.map(deploymentRow))}`,
        );
      }
      return 0;
    });
  },
};

/**
 * A line when the connected routers keep tenants' prefix caches apart differently
 * (`--cache-isolation`): requests through a router with less isolation share cache the others
 * keep apart. Nothing when they agree, or when none said. Another when tenants ask every router
 * to keep their caches apart (`tenants create --cache-isolation`) and a connected router does
 * not apply it (`--no-auth`, or an older release) while its own flag isolates less than one of
 * them asks.
 */
export function isolationWarning(
  routers: readonly RouterInfo[],
  tenants: readonly Pick<Tenant, "name" | "cacheIsolation">[] = [],
): string[] {
  const lines: string[] = [];
  const asking = tenants.filter((t) => t.cacheIsolation !== "");
  // Such a router still keeps tenants as far apart as its own flag does.
  const short = (r: RouterInfo) =>
    asking.filter(
      (t) =>
        cacheIsolationStrictness(t.cacheIsolation) > cacheIsolationStrictness(r.cacheIsolation),
    );
  const deaf = routers.filter(
    (r) => r.connected && !r.appliesTenantCacheIsolation && short(r).length > 0,
  );
  if (deaf.length > 0) {
    const names = asking.filter((t) => deaf.some((r) => short(r).includes(t))).map((t) => t.name);
    lines.push(
      `isolation    ${listed(names, "tenant")} ask${names.length === 1 ? "s" : ""} for cache isolation; ${listed(
        deaf.map((r) => r.id),
        "router",
      )} ${deaf.length === 1 ? "does" : "do"} not apply it (--no-auth, or a release before it)`,
    );
  }
  const modes = new Map<string, string[]>();
  for (const r of routers) {
    if (!r.connected || r.cacheIsolation === "") continue;
    modes.set(r.cacheIsolation, [...(modes.get(r.cacheIsolation) ?? []), r.id]);
  }
  if (modes.size >= 2) {
    const parts = [...modes].map(([mode, ids]) => `${mode}: ${ids.join(", ")}`);
    lines.push(`isolation    routers differ in --cache-isolation (${parts.join("; ")})`);
  }
  return lines;
}

/** "tenant a", "tenants a, b", … "tenants a, b, c and 4 more". */
function listed(names: readonly string[], noun: string): string {
  const shown = names.slice(0, 5).join(", ");
  const more = names.length > 5 ? ` and ${names.length - 5} more` : "";
  return `${noun}${names.length === 1 ? "" : "s"} ${shown}${more}`;
}
