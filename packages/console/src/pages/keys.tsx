/**
 * API keys: create (the secret is shown once, in a dialog, and then forgotten by the page),
 * list, revoke after a confirmation.
 */
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { ApiKey, CreateApiKeyRequestSchema } from "@llmgw/proto";
import { useEffect, useRef, useState } from "preact/hooks";
import { cluster, describeError } from "../api.js";
import { clock, limit } from "../format.js";
import { usePoll } from "../live.js";
import { optionalLimit } from "../optional-limit.js";
import { Badge, ColumnHeads, ConfirmedAction, ErrorLine, Loading } from "../ui.js";

function SecretOnce({ secret, name, close }: { secret: string; name: string; close: () => void }) {
  const ref = useRef<HTMLDialogElement>(null);
  useEffect(() => {
    ref.current?.showModal();
  }, []);
  return (
    <dialog ref={ref} aria-labelledby="secret-title" onClose={close} onCancel={close}>
      <h2 id="secret-title">Key {name} created</h2>
      <p>Copy it now: it is shown this once, and llmgw keeps only its hash.</p>
      <p>
        <code class="secret" data-secret>
          {secret}
        </code>
      </p>
      <div class="buttons">
        <button type="button" class="primary" onClick={close}>
          I have copied it
        </button>
      </div>
    </dialog>
  );
}

function CreateKey({ created }: { created: () => void }) {
  const tenants = usePoll(
    async (signal) => (await cluster.listTenants({}, { signal })).tenants.map((t) => t.name),
    30_000,
  );
  const [tenant, setTenant] = useState("");
  const [name, setName] = useState("");
  const [models, setModels] = useState("");
  const [rpm, setRpm] = useState("");
  const [tpm, setTpm] = useState("");
  const [concurrency, setConcurrency] = useState("");
  const [error, setError] = useState<string | undefined>(undefined);
  const [secret, setSecret] = useState<{ name: string; secret: string } | undefined>(undefined);
  const submit = async () => {
    let request: MessageInitShape<typeof CreateApiKeyRequestSchema> & { name: string };
    try {
      if (name.trim() === "") throw new Error("name: required");
      const requestsPerMinute = optionalLimit(rpm, "requests per minute");
      const tokensPerMinute = optionalLimit(tpm, "tokens per minute");
      const maxConcurrency = optionalLimit(concurrency, "concurrency");
      request = {
        name: name.trim(),
        tenant,
        models: models
          .split(",")
          .map((m) => m.trim())
          .filter((m) => m !== ""),
        ...(requestsPerMinute === undefined ? {} : { requestsPerMinute }),
        ...(tokensPerMinute === undefined ? {} : { tokensPerMinute }),
        ...(maxConcurrency === undefined ? {} : { maxConcurrency }),
      };
    } catch (e) {
      setError((e as Error).message);
      return;
    }
    try {
      const res = await cluster.createApiKey(request);
      setError(undefined);
      setSecret({ name: res.key?.name ?? request.name ?? "", secret: res.secret });
      setName("");
      setTenant("");
      setModels("");
      setRpm("");
      setTpm("");
      setConcurrency("");
      created();
    } catch (e) {
      setError(describeError(e));
    }
  };
  const field = (id: string, label: string, value: string, set: (v: string) => void, hint = "") => (
    <div class="field">
      <label for={id}>{label}</label>
      <input
        id={id}
        value={value}
        placeholder={hint}
        onInput={(e) => set((e.target as HTMLInputElement).value)}
      />
    </div>
  );
  return (
    <section aria-labelledby="create-key">
      <h2 id="create-key">Create a key</h2>
      <form
        class="grid-form"
        onSubmit={(e) => {
          e.preventDefault();
          void submit();
        }}
      >
        {field("key-name", "Name", name, setName, "team-a")}
        <div class="field">
          <label for="key-tenant">Tenant</label>
          <select
            id="key-tenant"
            value={tenant}
            onChange={(e) => setTenant((e.target as HTMLSelectElement).value)}
          >
            <option value="">none</option>
            {(tenants.data ?? []).map((t) => (
              <option key={t} value={t}>
                {t}
              </option>
            ))}
          </select>
        </div>
        {field("key-models", "Models (comma-separated; empty: all)", models, setModels)}
        {field("key-rpm", "Requests per minute", rpm, setRpm, "no limit")}
        {field("key-tpm", "Tokens per minute", tpm, setTpm, "no limit")}
        {field("key-concurrency", "Concurrent requests", concurrency, setConcurrency, "no limit")}
        <div class="field">
          <button type="submit" class="primary">
            Create key
          </button>
        </div>
      </form>
      <ErrorLine error={error} />
      {secret === undefined ? null : (
        <SecretOnce secret={secret.secret} name={secret.name} close={() => setSecret(undefined)} />
      )}
    </section>
  );
}

function KeyRow({ k, revoked }: { k: ApiKey; revoked: () => void }) {
  return (
    <tr data-key={k.name}>
      <td>{k.name}</td>
      <td>{k.tenant === "" ? <span class="quiet">none</span> : k.tenant}</td>
      <td>
        <code>{k.prefix}…</code>
      </td>
      <td>{k.models.length === 0 ? "all" : k.models.join(", ")}</td>
      <td>{limit(k.requestsPerMinute)}</td>
      <td>{limit(k.tokensPerMinute)}</td>
      <td>{limit(k.maxConcurrency)}</td>
      <td>{clock(k.createdAtUnixMs)}</td>
      <td>
        {k.revokedAtUnixMs === undefined ? (
          <ConfirmedAction
            label="Revoke"
            title={`Revoke ${k.name}`}
            run={() => cluster.revokeApiKey({ key: k.id })}
            done={revoked}
          >
            <p>Requests with {k.name} are refused from now on. This cannot be undone.</p>
          </ConfirmedAction>
        ) : (
          <Badge state="quiet" label={`revoked ${clock(k.revokedAtUnixMs)}`} />
        )}
      </td>
    </tr>
  );
}

export function KeysPage() {
  const [includeRevoked, setIncludeRevoked] = useState(false);
  const polled = usePoll(
    async (signal) => (await cluster.listApiKeys({ includeRevoked }, { signal })).keys,
    10_000,
    [includeRevoked],
  );
  return (
    <>
      <h1>API keys</h1>
      <CreateKey created={polled.refresh} />
      <section aria-labelledby="keys">
        <h2 id="keys">Keys</h2>
        <label>
          <input
            type="checkbox"
            checked={includeRevoked}
            onChange={(e) => setIncludeRevoked((e.target as HTMLInputElement).checked)}
          />{" "}
          show revoked keys
        </label>
        <ErrorLine error={polled.error} />
        {polled.data === undefined ? <Loading what="keys" /> : null}
        {polled.data?.length === 0 ? <p class="quiet">No keys.</p> : null}
        {polled.data?.length ? (
          <table>
            <ColumnHeads
              names={[
                "Name",
                "Tenant",
                "Prefix",
                "Models",
                "Requests/min",
                "Tokens/min",
                "Concurrency",
                "Created",
                "Status",
              ]}
            />
            <tbody>
              {polled.data.map((k) => (
                <KeyRow key={k.id} k={k} revoked={polled.refresh} />
              ))}
            </tbody>
          </table>
        ) : null}
      </section>
    </>
  );
}
