/**
 * Tenants and what they used: each tenant's limits, budgets and class, and the usage of a
 * period by tenant and model (the same rows as `llmgw usage`). Changing tenants stays with
 * the CLI (`llmgw tenants`).
 */
import { UsageDimension } from "@llmgw/proto";
import { useState } from "preact/hooks";
import { cluster } from "../api.js";
import { count } from "../format.js";
import { usePoll } from "../live.js";
import { ColumnHeads, ErrorLine, Loading } from "../ui.js";
import {
  budgetText,
  gpuTime,
  periodStartMs,
  priorityText,
  thousands,
  USAGE_PERIODS,
  type UsagePeriodId,
  usageTotals,
} from "../usage-model.js";

function Tenants() {
  const polled = usePoll(
    async (signal) => (await cluster.listTenants({}, { signal })).tenants,
    10_000,
  );
  return (
    <section aria-labelledby="tenants">
      <h2 id="tenants">Tenants</h2>
      <ErrorLine error={polled.error} />
      {polled.data === undefined ? <Loading what="tenants" /> : null}
      {polled.data?.length === 0 ? (
        <p class="quiet">
          No tenants. Create one with <code>llmgw tenants create NAME</code>, and give it keys with{" "}
          <code>llmgw keys create --tenant NAME</code>.
        </p>
      ) : null}
      {polled.data?.length ? (
        <table>
          <ColumnHeads
            names={[
              "Tenant",
              "Class",
              "Weight",
              "Requests/min",
              "Tokens/min",
              "Concurrency",
              "Token budgets",
              "Keys",
            ]}
          />
          <tbody>
            {polled.data.map((t) => (
              <tr key={t.name} data-tenant={t.name}>
                <td>{t.name}</td>
                <td>{priorityText(t.priority)}</td>
                <td>{t.weight || 1}</td>
                <td>{count(t.requestsPerMinute)}</td>
                <td>{count(t.tokensPerMinute)}</td>
                <td>{count(t.maxConcurrency)}</td>
                <td>{t.budgets.length === 0 ? "none" : t.budgets.map(budgetText).join("; ")}</td>
                <td>{t.activeKeys}</td>
              </tr>
            ))}
          </tbody>
        </table>
      ) : null}
    </section>
  );
}

function Usage() {
  const [periodId, setPeriodId] = useState<UsagePeriodId>("24h");
  const period = USAGE_PERIODS.find((p) => p.id === periodId) ?? USAGE_PERIODS[0];
  const polled = usePoll(
    async (signal) => {
      const res = await cluster.getUsage(
        {
          sinceUnixMs: BigInt(periodStartMs(period, Date.now())),
          granularity: period.granularity,
          groupBy: [UsageDimension.TENANT, UsageDimension.MODEL],
        },
        { signal },
      );
      return usageTotals(res.rows);
    },
    15_000,
    [periodId],
  );
  return (
    <section aria-labelledby="usage">
      <h2 id="usage">Usage</h2>
      <label for="usage-period">Period </label>
      <select
        id="usage-period"
        value={periodId}
        onChange={(e) => setPeriodId((e.target as HTMLSelectElement).value as UsagePeriodId)}
      >
        {USAGE_PERIODS.map((p) => (
          <option key={p.id} value={p.id}>
            {p.label}
          </option>
        ))}
      </select>
      <p class="quiet">
        Tokens as the engines reported them (cached tokens are part of the prompt tokens); GPU time
        is each request's share of its replica's GPUs while it ran. Routers report every few
        seconds.
      </p>
      <ErrorLine error={polled.error} />
      {polled.data === undefined ? <Loading what="usage" /> : null}
      {polled.data?.length === 0 ? <p class="quiet">Nothing used in this period.</p> : null}
      {polled.data?.length ? (
        <table class="usage">
          <ColumnHeads
            names={[
              "Tenant",
              "Model",
              "Requests",
              "Prompt tokens",
              "Cached",
              "Completion tokens",
              "GPU time",
              "Estimated",
            ]}
          />
          <tbody>
            {polled.data.map((u) => (
              <tr key={`${u.tenant}/${u.model}`} data-usage={`${u.tenant}/${u.model}`}>
                <td>{u.tenant === "" ? <span class="quiet">no tenant</span> : u.tenant}</td>
                <td>{u.model}</td>
                <td data-requests>{thousands(u.requests)}</td>
                <td>{thousands(u.promptTokens)}</td>
                <td>{thousands(u.cachedTokens)}</td>
                <td data-completion>{thousands(u.completionTokens)}</td>
                <td>{gpuTime(u.gpuSeconds)}</td>
                <td>{thousands(u.estimatedRequests)}</td>
              </tr>
            ))}
          </tbody>
        </table>
      ) : null}
    </section>
  );
}

export function TenantsPage() {
  return (
    <>
      <h1>Tenants and usage</h1>
      <Tenants />
      <Usage />
    </>
  );
}
