/**
 * Tenants and what they used: each tenant's limits, budgets and class (create one, change
 * one, delete one without keys), and the usage of a period by tenant and model (the same rows
 * as `llmgw usage`). Budgets of one model stay with the CLI (`llmgw tenants update --budget`).
 */
import { type Tenant, UsageDimension } from "@llmgw/proto";
import { useEffect, useRef, useState } from "preact/hooks";
import { cluster, describeError } from "../api.js";
import { limit } from "../format.js";
import { usePoll } from "../live.js";
import {
  buildTenantUpdate,
  CACHE_ISOLATION_CHOICES,
  EMPTY_TENANT_FORM,
  isolationText,
  newTenant,
  PRIORITY_CLASSES,
  parseTenantForm,
  type TenantFormValues,
  tenantFormValues,
  tenantNow,
} from "../tenant-form.js";
import { ColumnHeads, ConfirmedAction, ErrorLine, Loading } from "../ui.js";
import {
  budgetText,
  cachedText,
  gpuTime,
  periodStartMs,
  priorityText,
  thousands,
  USAGE_PERIODS,
  type UsagePeriodId,
  usageTotals,
} from "../usage-model.js";

/**
 * A tenant's class, weight, limits and budgets of every model together: the create form's
 * fields and the edit dialog's. `submit` gets what was typed and throws to refuse; its message
 * (or the control plane's) shows under the form, which keeps what was typed. Once it succeeds
 * the form is `initial` again and `saved` runs. Ids are `idPrefix-field`.
 */
function TenantForm(props: {
  idPrefix: string;
  initial: TenantFormValues;
  askName: boolean;
  action: string;
  submit: (values: TenantFormValues) => Promise<void>;
  saved: () => void;
  /** A Cancel button beside the form's own (a dialog's). */
  cancel?: () => void;
}) {
  const [form, setForm] = useState(props.initial);
  const [error, setError] = useState<string | undefined>(undefined);
  const [busy, setBusy] = useState(false);
  const set = (field: keyof TenantFormValues) => (e: Event) => {
    const value = (e.target as HTMLInputElement | HTMLSelectElement).value;
    setForm((f) => ({ ...f, [field]: value }));
  };
  const submit = async () => {
    setBusy(true);
    try {
      await props.submit(form);
      setError(undefined);
      setForm(props.initial);
      props.saved();
    } catch (e) {
      setError(describeError(e));
    } finally {
      setBusy(false);
    }
  };
  const id = (field: keyof TenantFormValues) => `${props.idPrefix}-${field}`;
  const field = (name: keyof TenantFormValues, label: string, hint = "") => (
    <div class="field">
      <label for={id(name)}>{label}</label>
      <input id={id(name)} value={form[name]} placeholder={hint} onInput={set(name)} />
    </div>
  );
  const save = (
    <button type="submit" class="primary" disabled={busy}>
      {props.action}
    </button>
  );
  return (
    <>
      <form
        class="grid-form"
        onSubmit={(e) => {
          e.preventDefault();
          void submit();
        }}
      >
        {props.askName ? field("name", "Name", "search-team") : null}
        <div class="field">
          <label for={id("priority")}>Class</label>
          <select id={id("priority")} value={form.priority} onChange={set("priority")}>
            {PRIORITY_CLASSES.map(([n]) => (
              <option key={n} value={n}>
                {n}
              </option>
            ))}
          </select>
        </div>
        {field("weight", "Weight (1–1000)", "1")}
        <div class="field">
          <label for={id("isolation")}>Prefix cache</label>
          <select id={id("isolation")} value={form.isolation} onChange={set("isolation")}>
            {CACHE_ISOLATION_CHOICES.map(([word, label]) => (
              <option key={word} value={word}>
                {label}
              </option>
            ))}
          </select>
        </div>
        {field("rpm", "Requests per minute", "no limit")}
        {field("tpm", "Tokens per minute", "no limit")}
        {field("concurrency", "Concurrent requests", "no limit")}
        {field("day", "Tokens per day", "no budget")}
        {field("month", "Tokens per month", "no budget")}
        {props.cancel === undefined ? (
          <div class="field">{save}</div>
        ) : (
          <div class="buttons">
            <button type="button" onClick={props.cancel}>
              Cancel
            </button>
            {save}
          </div>
        )}
      </form>
      <ErrorLine error={error} />
    </>
  );
}

function CreateTenant({ created }: { created: () => void }) {
  return (
    <section aria-labelledby="create-tenant">
      <h2 id="create-tenant">Create a tenant</h2>
      <TenantForm
        idPrefix="tenant"
        initial={EMPTY_TENANT_FORM}
        askName
        action="Create tenant"
        submit={async (v) => {
          if (v.name.trim() === "") throw new Error("name: required");
          await cluster.createTenant({ tenant: newTenant(v.name.trim(), parseTenantForm(v)) });
        }}
        saved={created}
      />
      <p class="quiet">
        Budgets per model: <code>llmgw tenants create|update --budget</code>. Keys join a tenant
        when created: <code>llmgw keys create --tenant NAME</code>.
      </p>
    </section>
  );
}

/**
 * The dialog that changes `shown` (the tenant as its row showed it when Edit was pressed):
 * `UpdateTenant` with only the fields changed from it, refused when the tenant was deleted
 * (and maybe created again) since.
 */
function EditTenant(props: { shown: Tenant; close: () => void; saved: () => void }) {
  const { shown } = props;
  const ref = useRef<HTMLDialogElement>(null);
  useEffect(() => {
    ref.current?.showModal();
  }, []);
  const perModel = shown.budgets.filter((b) => b.model !== "");
  return (
    <dialog
      ref={ref}
      aria-labelledby="edit-tenant-title"
      onClose={props.close}
      onCancel={props.close}
    >
      <h2 id="edit-tenant-title">Edit tenant {shown.name}</h2>
      <TenantForm
        idPrefix="edit-tenant"
        initial={tenantFormValues(shown)}
        askName={false}
        action="Save changes"
        cancel={props.close}
        submit={async (v) => {
          const next = parseTenantForm(v);
          if (buildTenantUpdate(shown, next).fields.length === 0)
            throw new Error("nothing changed: change a field first");
          // Re-read just before sending, whatever changed: the edit must not land on a tenant
          // deleted and created again under this name, and budgets are one list, merged into
          // the budgets as they are now so that one set since the dialog opened stays. The
          // update applies only to the tenant as re-read (nobody changed it in between).
          const { tenants } = await cluster.listTenants({});
          const now = tenantNow(shown, tenants);
          await cluster.updateTenant({
            ...buildTenantUpdate(shown, next, now.budgets),
            ifUpdatedAtUnixMs: now.updatedAtUnixMs,
          });
        }}
        saved={() => {
          props.close();
          props.saved();
        }}
      />
      <p class="quiet">
        Empty a limit or a budget to remove it; an empty weight is 1.{" "}
        {perModel.length === 0
          ? "Budgets of one model: "
          : `Budgets of one model stay as they are (${perModel.map(budgetText).join("; ")}); change them with `}
        <code>llmgw tenants update --budget</code>.
      </p>
    </dialog>
  );
}

function TenantRow({ t, changed }: { t: Tenant; changed: () => void }) {
  const [editing, setEditing] = useState<Tenant | undefined>(undefined);
  return (
    <tr data-tenant={t.name}>
      <td>{t.name}</td>
      <td>{priorityText(t.priority)}</td>
      <td>{t.weight || 1}</td>
      <td>{isolationText(t.cacheIsolation)}</td>
      <td>{limit(t.requestsPerMinute)}</td>
      <td>{limit(t.tokensPerMinute)}</td>
      <td>{limit(t.maxConcurrency)}</td>
      <td>{t.budgets.length === 0 ? "none" : t.budgets.map(budgetText).join("; ")}</td>
      <td>{t.activeKeys}</td>
      <td>
        <button type="button" onClick={() => setEditing(t)}>
          Edit
        </button>
        {editing === undefined ? null : (
          <EditTenant shown={editing} close={() => setEditing(undefined)} saved={changed} />
        )}{" "}
        <ConfirmedAction
          label="Delete"
          title={`Delete ${t.name}`}
          run={() => cluster.deleteTenant({ name: t.name })}
          done={changed}
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
                "Prefix cache",
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
                <TenantRow key={t.name} t={t} changed={polled.refresh} />
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
        only where the engine reported them (engines as llmgw launches them do; an answer cut short
        does not): "—" where none did. GPU time is each request's share of its replica's GPUs while
        it ran. Estimated: requests cut short or answered without usage; refused: answers whose
        usage was refused (both charged an estimate). Routers report every few seconds.
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
                <td data-cached>{cachedText(u)}</td>
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
