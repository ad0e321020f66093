/**
 * Deployments: desired and ready replicas, where each replica runs, why some could not be
 * placed (in words), rollout progress; scale and undeploy, each after a confirmation.
 */
import type { DeploymentStatus, Replica } from "@llmgw/proto";
import { Engine } from "@llmgw/proto";
import { useState } from "preact/hooks";
import { cluster, describeError } from "../api.js";
import { codeWords, replicaState, retirementPhase, rolloutState } from "../format.js";
import { usePoll } from "../live.js";
import { Badge, ColumnHeads, Confirm, ConfirmedAction, ErrorLine, Loading } from "../ui.js";

const ENGINES: Record<Engine, string> = {
  [Engine.UNSPECIFIED]: "—",
  [Engine.VLLM]: "vLLM",
  [Engine.SGLANG]: "SGLang",
  [Engine.LLAMACPP]: "llama.cpp",
  [Engine.SIM]: "simulated",
};

/** "node-a GPU 0,1 · node-b GPU 0,1" */
export function whereItRuns(replica: Replica): string {
  return replica.ranks.map((r) => `${r.nodeId} GPU ${r.gpuIndices.join(",") || "—"}`).join(" · ");
}

function ReplicaRow({ replica }: { replica: Replica }) {
  const state = replicaState(replica.state);
  const retiring = replica.retirement;
  return (
    <tr data-replica={replica.replicaId}>
      <td>
        <a href={`#/replica/${encodeURIComponent(replica.replicaId)}`}>{replica.replicaId}</a>
      </td>
      <td>
        <Badge state={state} />
      </td>
      <td>{String(replica.revision)}</td>
      <td>{whereItRuns(replica) || "—"}</td>
      <td>{replica.endpoint || "—"}</td>
      <td>
        {retiring?.reason === undefined
          ? "—"
          : `${retirementPhase(retiring.phase)}: ${codeWords(retiring.reason.code)}`}
      </td>
    </tr>
  );
}

function Scale({ d, done }: { d: DeploymentStatus; done: () => void }) {
  const name = d.spec?.name ?? "";
  const [value, setValue] = useState(String(d.desiredReplicas));
  const [asking, setAsking] = useState<number | undefined>(undefined);
  const [error, setError] = useState<string | undefined>(undefined);
  const id = `scale-${name}`;
  return (
    <form
      class="inline"
      onSubmit={(e) => {
        e.preventDefault();
        const n = Number(value);
        if (!Number.isInteger(n) || n < 0 || n > 1000) {
          setError("replicas: a whole number from 0 to 1000");
          return;
        }
        setError(undefined);
        setAsking(n);
      }}
    >
      <label for={id}>Replicas</label>
      <input
        id={id}
        type="number"
        min={0}
        max={1000}
        value={value}
        onInput={(e) => setValue((e.target as HTMLInputElement).value)}
      />
      <button type="submit">Scale</button>
      <ErrorLine error={error} />
      {asking === undefined ? null : (
        <Confirm
          title={`Scale ${name}`}
          action={`Scale to ${asking}`}
          danger={asking < d.desiredReplicas}
          close={() => setAsking(undefined)}
          confirm={async () => {
            try {
              await cluster.scaleDeployment({ name, replicas: asking });
            } catch (e) {
              throw new Error(describeError(e));
            }
            done();
          }}
        >
          <p>
            {name} goes from {d.desiredReplicas} to {asking} replicas.
            {asking < d.desiredReplicas ? " Replicas that leave drain their requests first." : ""}
          </p>
        </Confirm>
      )}
    </form>
  );
}

function Undeploy({ d, done }: { d: DeploymentStatus; done: () => void }) {
  const name = d.spec?.name ?? "";
  return (
    <ConfirmedAction
      label="Undeploy"
      title={`Undeploy ${name}`}
      run={() => cluster.deleteDeployment({ name })}
      done={done}
    >
      <p>
        Every replica of {name} ({d.replicas.length}) drains and stops, and the model leaves the
        API.
      </p>
    </ConfirmedAction>
  );
}

function DeploymentCard({ d, refresh }: { d: DeploymentStatus; refresh: () => void }) {
  const spec = d.spec;
  const name = spec?.name ?? "";
  const ready = d.readyReplicas >= d.desiredReplicas && d.desiredReplicas > 0;
  const rollout = d.rollout;
  return (
    <article class="deployment" data-deployment={name} aria-label={`deployment ${name}`}>
      <header>
        <h2>{name}</h2>
        <Badge
          state={ready ? "ready" : d.desiredReplicas === 0 ? "quiet" : "loading"}
          label={`${d.readyReplicas}/${d.desiredReplicas} ready`}
        />
        <span class="quiet">
          {spec?.servedModelName || spec?.model} · {ENGINES[spec?.engine ?? Engine.UNSPECIFIED]} ·{" "}
          {spec?.gpuClass || "any GPU"} · TP {spec?.tensorParallel ?? 1} × PP{" "}
          {spec?.pipelineParallel ?? 1} · revision {String(spec?.revision ?? 0n)}
        </span>
      </header>
      {rollout === undefined ? null : (
        <p class="rollout">
          Rollout {String(rollout.fromRevision)} → {String(rollout.toRevision)}:{" "}
          <Badge state={rolloutState(rollout.state)} /> {rollout.message}
        </p>
      )}
      {d.unschedulable.length === 0 ? null : (
        <div class="reasons-box" data-unschedulable>
          <h3>Why replicas are not placed</h3>
          <ul>
            {d.unschedulable.map((r) => (
              <li key={r.code + r.message}>
                <strong>{codeWords(r.code)}</strong>: {r.message}
              </li>
            ))}
          </ul>
        </div>
      )}
      {d.failed.length === 0 ? null : (
        <div class="reasons-box bad" data-failed>
          <h3>Failed replicas</h3>
          <ul>
            {d.failed.map((r) => (
              <li key={r.message}>
                <pre>{r.message}</pre>
              </li>
            ))}
          </ul>
        </div>
      )}
      {d.avoided.length === 0 ? null : (
        <div class="reasons-box" data-avoided>
          <h3>Nodes its new replicas go to last</h3>
          <ul>
            {d.avoided.map((r) => (
              <li key={r.message}>{r.message}</li>
            ))}
          </ul>
        </div>
      )}
      {d.replicas.length === 0 ? (
        <p class="quiet">No replicas placed.</p>
      ) : (
        <table>
          <caption class="visually-hidden">Replicas of {name}</caption>
          <ColumnHeads
            names={["Replica", "State", "Revision", "Nodes and GPUs", "Endpoint", "Leaving"]}
          />
          <tbody>
            {d.replicas.map((r) => (
              <ReplicaRow key={r.replicaId} replica={r} />
            ))}
          </tbody>
        </table>
      )}
      <div class="actions">
        <Scale d={d} done={refresh} />
        <Undeploy d={d} done={refresh} />
      </div>
    </article>
  );
}

export function DeploymentsPage() {
  const polled = usePoll(
    async (signal) => (await cluster.listDeployments({}, { signal })).deployments,
    5_000,
    [],
    (e) => e.kind.startsWith("replica.") || e.kind.startsWith("deployment."),
  );
  return (
    <>
      <h1>Deployments</h1>
      <ErrorLine error={polled.error} />
      {polled.data === undefined ? <Loading what="deployments" /> : null}
      {polled.data?.length === 0 ? (
        <p class="quiet">
          Nothing deployed. <code>llmgw deploy FILE</code> applies a deployment.
        </p>
      ) : null}
      {(polled.data ?? []).map((d) => (
        <DeploymentCard key={d.spec?.name} d={d} refresh={polled.refresh} />
      ))}
    </>
  );
}
