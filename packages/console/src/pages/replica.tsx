/** One replica: its ranks' states, restarts, last exit, load signals, log tail and history. */
import type { ExitInfo, PlacedRank, Replica } from "@llmgw/proto";
import { cluster } from "../api.js";
import { ago, clock, count, fraction, replicaState } from "../format.js";
import { useEvents, useNow, usePoll } from "../live.js";
import { Badge, ErrorLine, Facts, Loading } from "../ui.js";
import { whereItRuns } from "./deployments.js";

function exitText(exit: ExitInfo | undefined): string {
  if (exit === undefined) return "—";
  const how =
    exit.signal !== undefined
      ? `signal ${exit.signal}`
      : exit.code !== undefined
        ? `exit code ${exit.code}`
        : "ended";
  return `${how}${exit.timedOut ? " (timed out)" : ""}${exit.forced ? " (forced)" : ""} at ${clock(exit.atUnixMs)}`;
}

function Rank({ rank, now }: { rank: PlacedRank; now: number }) {
  const s = rank.status;
  const load = s?.load;
  return (
    <section class="rank" aria-label={`rank ${rank.rank}`} data-rank={rank.rank}>
      <h2>
        Rank {rank.rank} on {rank.nodeId}{" "}
        <Badge state={s === undefined ? "pending" : replicaState(s.state)} />
      </h2>
      <Facts
        items={[
          ["GPUs", rank.gpuIndices.join(", ") || "—"],
          ["state since", s === undefined ? "—" : ago(s.stateSinceUnixMs, now)],
          ["message", s?.message || "—"],
          ["pid", count(s?.pid)],
          ["API port", count(s?.apiPort)],
          ["started", clock(s?.startedAtUnixMs)],
          ["restarts", s === undefined ? "—" : String(s.restarts)],
          ["last exit", exitText(s?.lastExit)],
          ["running", count(load?.running)],
          ["waiting", count(load?.waiting)],
          ["KV cache used", fraction(load?.kvCacheUsage)],
          ["prefix cache hits", fraction(load?.prefixCacheHitRate)],
          ["KV cache tokens", count(load?.kvCacheTokens)],
        ]}
      />
      <h3>Engine log</h3>
      {s === undefined || s.logTail.length === 0 ? (
        <p class="quiet">No log lines reported (agents send them when an engine fails).</p>
      ) : (
        <pre class="log" data-log-tail>
          {s.logTail.join("\n")}
        </pre>
      )}
    </section>
  );
}

export function ReplicaPage({ id }: { id: string }) {
  const now = useNow();
  const polled = usePoll(
    async (signal): Promise<Replica | null> =>
      (await cluster.listReplicas({}, { signal })).replicas.find((r) => r.replicaId === id) ?? null,
    3_000,
    [id],
    (e) => e.subject === id,
  );
  const history = useEvents().filter((e) => e.subject === id);
  const r = polled.data;
  return (
    <>
      <h1>
        Replica <code>{id}</code>
      </h1>
      <ErrorLine error={polled.error} />
      {r === undefined ? <Loading what="the replica" /> : null}
      {r === null ? <p>No replica {id} in the cluster now (it may have been removed).</p> : null}
      {r ? (
        <>
          <Facts
            items={[
              ["deployment", <a href="#/deployments">{r.deployment}</a>],
              ["state", <Badge state={replicaState(r.state)} />],
              ["revision", String(r.revision)],
              ["runs on", whereItRuns(r) || "—"],
              ["endpoint", r.endpoint || "—"],
              ["fabric", r.fabricId || "—"],
              ["created", clock(r.createdAtUnixMs)],
            ]}
          />
          {r.ranks.map((rank) => (
            <Rank key={rank.rank} rank={rank} now={now} />
          ))}
        </>
      ) : null}
      <section aria-labelledby="history">
        <h2 id="history">State history</h2>
        {history.length === 0 ? (
          <p class="quiet">No events about this replica in the recent log.</p>
        ) : (
          <ol class="history">
            {[...history].reverse().map((e) => (
              <li key={String(e.id)}>
                <time>{clock(e.atUnixMs)}</time> <Badge state={e.severity} label={e.kind} />{" "}
                {e.message}
              </li>
            ))}
          </ol>
        )}
      </section>
    </>
  );
}
