/**
 * Tenants and what they used: each tenant's limits, budgets and class (create one, delete one
 * without keys), and the usage of a period by tenant and model (the same rows as `llmgw
 * usage`). Changing a tenant's limits stays with the CLI (`llmgw tenants update`).
 */
import type { MessageInitShape } from "@bufbuild/protobuf";
import {
  BudgetPeriod,
  type CreateTenantRequestSchema,
  PriorityClass,
  type Tenant,
  UsageDimension,
} from "@llmgw/proto";
import { useState } from "preact/hooks";
import { cluster, describeError } from "../api.js";
import { limit } from "../format.js";
import { usePoll } from "../live.js";
import { ColumnHeads, ConfirmedAction, ErrorLine, Loading } from "../ui.js";
import {
  budgetText,
  gpuTime,
  optionalTokens,
  periodStartMs,
  priorityText,
  thousands,
  USAGE_PERIODS,
  type UsagePeriodId,
  usageTotals,
  weightOf,
} from "../usage-model.js";
import { optionalLimit } from "./keys.js";

type TenantInit = NonNullable<MessageInitShape<typeof CreateTenantRequestSchema>["tenant"]>;

const CLASSES = [
  ["standard", PriorityClass.STANDARD],
  ["critical", PriorityClass.CRITICAL],
  ["batch", PriorityClass.BATCH],
] as const;

function CreateTenant({ created }: { created: () => void }) {
  const empty = {
    name: "",
    priority: "standard",
    weight: "",
    rpm: "",
    tpm: "",
    concurrency: "",
    day: "",
    month: "",
  };
  const [form, setForm] = useState(empty);
  const [error, setError] = useState<string | undefined>(undefined);
  const set = (field: keyof typeof empty) => (e: Event) =>
    setForm({ ...form, [field]: (e.target as HTMLInputElement | HTMLSelectElement).value });
  const submit = async () => {
    let tenant: TenantInit;
    try {
      if (form.name.trim() === "") throw new Error("name: required");
      const requestsPerMinute = optionalLimit(form.rpm, "requests per minute");
      const tokensPerMinute = optionalLimit(form.tpm, "tokens per minute");
      const maxConcurrency = optionalLimit(form.concurrency, "concurrency");
      const day = optionalTokens(form.day, "daily tokens");
      const month = optionalTokens(form.month, "monthly tokens");
      tenant = {
        name: form.name.trim(),
        priority: CLASSES.find(([n]) => n === form.priority)?.[1] ?? PriorityClass.STANDARD,
        weight: weightOf(form.weight),
        ...(requestsPerMinute === undefined ? {} : { requestsPerMinute }),
        ...(tokensPerMinute === undefined ? {} : { tokensPerMinute }),
        ...(maxConcurrency === undefined ? {} : { maxConcurrency }),
        budgets: [
          ...(day === undefined ? [] : [{ period: BudgetPeriod.DAY, tokens: day }]),
          ...(month === undefined ? [] : [{ period: BudgetPeriod.MONTH, tokens: month }]),
        ],
      };
    } catch (e) {
      setError((e as Error).message);
      return;
    }
    try {
      await cluster.createTenant({ tenant });
      setError(undefined);
      setForm(empty);
      created();
    } catch (e) {
      setError(describeError(e));
    }
  };
  const field = (id: keyof typeof empty, label: string, hint = "") => (
    <div class="field">
      <label for={`tenant-${id}`}>{label}</label>
      <input id={`tenant-${id}`} value={form[id]} placeholder={hint} onInput={set(id)} />
    </div>
  );
  return (
    <section aria-labelledby="create-tenant">
      <h2 id="create-tenant">Create a tenant</h2>
      <form
        class="grid-form"
        onSubmit={(e) => {
          e.preventDefault();
          void submit();
        }}
      >
        {field("name", "Name", "search-team")}
        <div class="field">
          <label for="tenant-priority">Class</label>
          <select id="tenant-priority" value={form.priority} onChange={set("priority")}>
            {CLASSES.map(([n]) => (
              <option key={n} value={n}>
                {n}
              </option>
            ))}
          </select>
        </div>
        {field("weight", "Weight (1–1000)", "1")}
        {field("rpm", "Requests per minute", "no limit")}
        {field("tpm", "Tokens per minute", "no limit")}
        {field("concurrency", "Concurrent requests", "no limit")}
        {field("day", "Tokens per day", "no budget")}
        {field("month", "Tokens per month", "no budget")}
        <div class="field">
          <button type="submit" class="primary">
            Create tenant
          </button>
        </div>
      </form>
      <ErrorLine error={error} />
      <p class="quiet">
        Budgets per model, and changes to a tenant: <code>llmgw tenants create|update</code>. Keys
        join a tenant when created: <code>llmgw keys create --tenant NAME</code>.
      </p>
    </section>
  );
}

function TenantRow({ t, deleted }: { t: Tenant; deleted: () => void }) {
  return (
    <tr data-tenant={t.name}>
      <td>{t.name}</td>
      <td>{priorityText(t.priority)}</td>
      <td>{t.weight || 1}</td>
      <td>{limit(t.requestsPerMinute)}</td>
      <td>{limit(t.tokensPerMinute)}</td>
      <td>{limit(t.maxConcurrency)}</td>
      <td>{t.budgets.length === 0 ? "none" : t.budgets.map(budgetText).join("; ")}</td>
      <td>{t.activeKeys}</td>
      <td>
        <ConfirmedAction
          label="Delete"
          title={`Delete ${t.name}`}
          run={() => cluster.deleteTenant({ name: t.name })}
          done={deleted}
        >
          <p>
            Its limits and budgets go. A tenant that still has keys is not deleted: revoke them
            first. Its usage stays.
          </p>
        </ConfirmedAction>
      </td>
    </tr>
  );
}

function Tenants() {
  const polled = usePoll(
    async (signal) => (await cluster.listTenants({}, { signal })).tenants,
    10_000,
  );
  return (
    <>
      <CreateTenant created={polled.refresh} />
      <section aria-labelledby="tenants">
        <h2 id="tenants">Tenants</h2>
        <ErrorLine error={polled.error} />
        {polled.data === undefined ? <Loading what="tenants" /> : null}
        {polled.data?.length === 0 ? (
          <p class="quiet">
            No tenants. Create one with <code>llmgw tenants create NAME</code>, and give it keys
            with <code>llmgw keys create --tenant NAME</code>.
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
                "Actions",
              ]}
            />
            <tbody>
              {polled.data.map((t) => (
                <TenantRow key={t.name} t={t} deleted={polled.refresh} />
              ))}
            </tbody>
          </table>
        ) : null}
      </section>
    </>
  );
}

function Usage() {
  const [periodId, setPeriodId] = useState<UsagePeriodId>("24h");
  const period = USAGE_PERIODS.find((p) => p.id === periodId) ?? USAGE_PERIODS[0];
  const polled = usePoll(
    async (signal) => {
      const sinceMs = periodStartMs(period, Date.now());
      const res = await cluster.getUsage(
        {
          sinceUnixMs: BigInt(sinceMs),
          granularity: period.granularity,
          groupBy: [UsageDimension.TENANT, UsageDimension.MODEL],
        },
        { signal },
      );
      return { periodId, sinceMs, totals: usageTotals(res.rows) };
    },
    15_000,
    [periodId],
  );
  // Until the chosen period's answer comes, the last one's totals are not shown under it.
  const data = polled.data?.periodId === periodId ? polled.data : undefined;
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
      {data === undefined ? null : (
        <span class="quiet"> counted from {utcMinute(data.sinceMs)} UTC (whole buckets)</span>
      )}
      <p class="quiet">
        Tokens as the engines reported them. Cached tokens are part of the prompt tokens and count
        only where the engine reports them (vLLM with
        <code>--enable-prompt-tokens-details</code>, SGLang with <code>--enable-cache-report</code>,
        llama.cpp): elsewhere they read 0 here, not "unknown", as in <code>llmgw usage</code>. GPU
        time is each request's share of its replica's GPUs while it ran. Estimated: requests cut
        short or answered without usage; refused: answers whose usage was refused (both charged an
        estimate). Routers report every few seconds.
      </p>
      <ErrorLine error={polled.error} />
      {data === undefined ? <Loading what="usage" /> : null}
      {data?.totals.length === 0 ? <p class="quiet">Nothing used in this period.</p> : null}
      {data?.totals.length ? (
        <table class="usage">
          <ColumnHeads
            names={[
              "Tenant",
              "Model",
              "Requests",
              "Prompt tokens",
              "Cached (where reported)",
              "Completion tokens",
              "GPU time",
              "Estimated",
              "Refused",
            ]}
          />
          <tbody>
            {data.totals.map((u) => (
              <tr key={`${u.tenant}/${u.model}`} data-usage={`${u.tenant}/${u.model}`}>
                <td>{u.tenant === "" ? <span class="quiet">no tenant</span> : u.tenant}</td>
                <td>{u.model}</td>
                <td data-requests>{thousands(u.requests)}</td>
                <td>{thousands(u.promptTokens)}</td>
                <td>{thousands(u.cachedTokens)}</td>
                <td data-completion>{thousands(u.completionTokens)}</td>
                <td>{gpuTime(u.gpuSeconds)}</td>
                <td>{thousands(u.estimatedRequests)}</td>
                <td>{thousands(u.refusedUsage)}</td>
              </tr>
            ))}
          </tbody>
        </table>
      ) : null}
    </section>
  );
}

/** "2026-12-05 17:00": a period's start, in UTC as the buckets are. */
function utcMinute(ms: number): string {
  return new Date(ms).toISOString().slice(0, 16).replace("T", " ");
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
