/** The fleet: nodes by state, a GPU grid per node, fabric islands with free GPUs per class. */
import type { GetClusterStatusResponse } from "@llmgw/proto";
import { Component, createRef } from "preact";
import { useMemo, useRef, useState } from "preact/hooks";
import { cluster } from "../api.js";
import {
  createFleetReader,
  firstShown,
  type GpuView,
  groupNodes,
  type NodeView,
  nodeView,
} from "../fleet-model.js";
import { clock } from "../format.js";
import { usePoll } from "../live.js";
import { Badge, ColumnHeads, ErrorLine, Loading } from "../ui.js";

/**
 * Events after which the page reads the fleet at once rather than at its next poll: a node's
 * state, a GPU's or port's health or fault, a replica placed on GPUs or taken off them.
 */
const FLEET_EVENT = /^(node|gpu|port)\.|^replica\.(placed|removed)$/;

/** How often the page reads the fleet: the agents' default heartbeat interval. */
const POLL_MS = 2_000;

class GpuCell extends Component<{ gpu: GpuView }> {
  override shouldComponentUpdate(next: { gpu: GpuView }): boolean {
    return next.gpu.sig !== this.props.gpu.sig;
  }
  override render() {
    const g = this.props.gpu;
    const health = g.lost ? "lost" : g.healthy ? "healthy" : "unhealthy";
    return (
      <li class={`gpu ${g.healthy ? "" : "sick"}`} data-gpu={g.index} data-health={health}>
        <div class="gpu-head">
          <strong>GPU {g.index}</strong>
          <span class="gpu-class">{g.gpuClass}</span>
          <Badge state={g.healthy ? "ready" : "unhealthy"} label={health} />
        </div>
        <div class="meter" aria-hidden="true">
          {g.utilizationValue === undefined ? null : (
            <span style={{ width: `${Math.max(0, Math.min(100, g.utilizationValue))}%` }} />
          )}
        </div>
        <dl class="readings">
          <div>
            <dt>util</dt>
            <dd>{g.utilization}</dd>
          </div>
          <div>
            <dt>mem</dt>
            <dd>{g.memory}</dd>
          </div>
          <div>
            <dt>temp</dt>
            <dd>{g.temperature}</dd>
          </div>
          <div>
            <dt>power</dt>
            <dd>{g.power}</dd>
          </div>
        </dl>
        {g.reasons.length === 0 ? null : (
          <ul class="reasons" data-reasons>
            {g.reasons.map((r) => (
              <li key={r}>{r}</li>
            ))}
          </ul>
        )}
        {g.placed.length === 0 ? null : <p class="placed">{g.placed.join(", ")}</p>}
      </li>
    );
  }
}

/**
 * Cards within this distance of the viewport draw their GPUs. At 1,000 nodes × 8 GPUs the
 * full grid is ~200,000 elements, more than a browser builds in a second; a card out of view
 * shows its header and keeps the grid's place. Drawn once, a card stays drawn.
 */
const NEAR_MARGIN = "1200px 0px";
/** Cards drawn in the first render, before anything is measured: a first screenful. */
const EAGER_CARDS = 12;

/** One IntersectionObserver for every node card; `onNear` runs once, when the card comes near. */
const nearViewport = (() => {
  const waiting = new Map<Element, () => void>();
  let observer: IntersectionObserver | undefined;
  const forget = (el: Element) => {
    observer?.unobserve(el);
    waiting.delete(el);
  };
  return (el: Element, onNear: () => void): (() => void) => {
    observer ??= new IntersectionObserver(
      (entries) => {
        for (const e of entries) {
          if (!e.isIntersecting) continue;
          const near = waiting.get(e.target);
          forget(e.target);
          near?.();
        }
      },
      { rootMargin: NEAR_MARGIN },
    );
    waiting.set(el, onNear);
    observer.observe(el);
    return () => forget(el);
  };
})();

/** The height a card's GPU grid will take (15rem columns, ~8.5rem rows), held while undrawn. */
function pendingGridHeight(gpus: number): string {
  const perRow = Math.max(1, Math.floor((window.innerWidth - 80) / 256));
  return `${Math.ceil(gpus / perRow) * 8.5}rem`;
}

interface NodeCardProps {
  readonly node: NodeView;
  readonly eager: boolean;
}

class NodeCard extends Component<NodeCardProps, { near: boolean }> {
  readonly #ref = createRef<HTMLElement>();
  #stopWatching: (() => void) | undefined;
  constructor(props: NodeCardProps) {
    super(props);
    this.state = { near: props.eager };
  }
  override componentDidMount() {
    const el = this.#ref.current;
    if (!this.state.near && el !== null)
      this.#stopWatching = nearViewport(el, () => this.setState({ near: true }));
  }
  override componentWillUnmount() {
    this.#stopWatching?.();
  }
  override shouldComponentUpdate(next: NodeCardProps, nextState: { near: boolean }): boolean {
    return next.node.sig !== this.props.node.sig || nextState.near !== this.state.near;
  }
  override render() {
    const n = this.props.node;
    // Out of view, or its GPUs still being read: the name, the state and the GPU count only.
    const drawn = this.state.near && !n.inventoryPending;
    return (
      <article
        ref={this.#ref}
        class="node"
        data-node={n.hostname}
        aria-label={`node ${n.hostname}`}
      >
        <header>
          <h4>{n.hostname}</h4>
          <Badge state={n.state} />
          {drawn ? <NodeFacts node={n} /> : null}
          <span class="quiet">{gpuSummary(n)}</span>
        </header>
        {!drawn ? (
          <div class="gpus-pending" style={{ height: pendingGridHeight(n.gpuCount) }}>
            {this.state.near ? <p class="quiet">Reading the GPUs…</p> : null}
          </div>
        ) : (
          <>
            {n.problems.length === 0 ? null : (
              <ul class="problems">
                {n.problems.map((p) => (
                  <li key={p}>{p}</li>
                ))}
              </ul>
            )}
            {n.gpus.length === 0 ? (
              <p class="quiet">no GPUs</p>
            ) : (
              <ul class="gpus">
                {n.gpus.map((g) => (
                  <GpuCell key={g.index} gpu={g} />
                ))}
              </ul>
            )}
          </>
        )}
      </article>
    );
  }
}

/** A drawn card's flags and facts, in its header. */
function NodeFacts({ node: n }: { node: NodeView }) {
  return (
    <>
      {n.cordoned ? <Badge state="quiet" label="cordoned" /> : null}
      {n.draining ? <Badge state="draining" label="draining" /> : null}
      {n.simulated ? <span class="quiet">simulated</span> : null}
      <span class="quiet">agent {n.agentVersion}</span>
      <span class="quiet">fabric {n.fabrics}</span>
      {n.state === "ready" ? null : (
        <span class="quiet">last heartbeat {clock(n.lastHeartbeatMs)}</span>
      )}
    </>
  );
}

/** "8 GPUs, 1 unhealthy": what a card says before (and beside) its grid. */
function gpuSummary(n: NodeView): string {
  const total = `${n.gpuCount} GPU${n.gpuCount === 1 ? "" : "s"}`;
  return n.unhealthyCount === 0 ? total : `${total}, ${n.unhealthyCount} unhealthy`;
}

function Islands({ status }: { status: GetClusterStatusResponse }) {
  if (status.classes.length === 0) return null;
  return (
    <section aria-labelledby="islands">
      <h2 id="islands">Fabric islands</h2>
      <table>
        <ColumnHeads names={["GPU class", "Fabric", "Free", "Allocated", "Unhealthy", "Total"]} />
        <tbody>
          {status.classes.map((c) => (
            <tr key={`${c.gpuClass}/${c.fabricId}`} data-island={`${c.gpuClass}/${c.fabricId}`}>
              <td>{c.gpuClass}</td>
              <td>{c.fabricId || "none"}</td>
              <td>{c.free}</td>
              <td>{c.allocated}</td>
              <td>{c.unhealthy}</td>
              <td>{c.total}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </section>
  );
}

export function FleetPage() {
  const refresh = useRef(() => {});
  const readNodes = useMemo(
    () =>
      createFleetReader(
        {
          list: async (omitInventory, signal, nodes = []) =>
            (await cluster.listNodes({ omitInventory, nodes: [...nodes] }, { signal })).nodes,
        },
        {
          firstShown: (nodes) => firstShown(nodes, EAGER_CARDS),
          inventoriesArrived: () => refresh.current(),
        },
      ),
    [],
  );
  const polled = usePoll(
    async (signal) => {
      const [nodes, status] = await Promise.all([
        readNodes(signal),
        cluster.getClusterStatus({}, { signal }),
      ]);
      return { nodes: nodes.map(nodeView), status };
    },
    POLL_MS,
    [],
    (e) => FLEET_EVENT.test(e.kind),
  );
  refresh.current = polled.refresh;
  const [filter, setFilter] = useState("");
  const [onlyProblems, setOnlyProblems] = useState(false);
  const groups = useMemo(() => {
    const nodes = polled.data?.nodes ?? [];
    const f = filter.trim().toLowerCase();
    const shown = nodes.filter(
      (n) =>
        (f === "" ||
          n.hostname.toLowerCase().includes(f) ||
          n.gpus.some((g) => g.gpuClass.toLowerCase().includes(f))) &&
        (!onlyProblems || n.state !== "ready" || n.problems.length > 0 || n.unhealthyCount > 0),
    );
    // Each group with the position of its first node on the page (for EAGER_CARDS).
    let first = 0;
    return groupNodes(shown).map((g) => {
      const at = first;
      first += g.nodes.length;
      return { ...g, first: at };
    });
  }, [polled.data, filter, onlyProblems]);

  const s = polled.data?.status;
  return (
    <>
      <h1>Fleet</h1>
      <ErrorLine error={polled.error} />
      {s === undefined ? (
        <Loading what="the fleet" />
      ) : (
        <>
          <ul class="summary" aria-label="cluster summary">
            <li>
              <strong data-summary="nodes">
                {s.nodesReady}/{s.nodesTotal}
              </strong>{" "}
              nodes ready
            </li>
            <li>
              <strong data-summary="gpus">
                {s.gpusAllocated}/{s.gpusTotal}
              </strong>{" "}
              GPUs allocated
            </li>
            <li>
              <strong data-summary="unhealthy">{s.gpusUnhealthy}</strong> GPUs unhealthy
            </li>
            <li>
              <strong>
                {s.replicasReady}/{s.replicasTotal}
              </strong>{" "}
              replicas ready
            </li>
          </ul>
          <Islands status={s} />
        </>
      )}
      <section aria-labelledby="nodes">
        <h2 id="nodes">Nodes</h2>
        <div class="toolbar">
          <label>
            Filter{" "}
            <input
              type="search"
              value={filter}
              placeholder="hostname or GPU class"
              onInput={(e) => setFilter((e.target as HTMLInputElement).value)}
            />
          </label>
          <label>
            <input
              type="checkbox"
              checked={onlyProblems}
              onChange={(e) => setOnlyProblems((e.target as HTMLInputElement).checked)}
            />{" "}
            only nodes with problems
          </label>
        </div>
        {polled.data !== undefined && groups.length === 0 ? <p class="quiet">No nodes.</p> : null}
        {groups.map((g) => (
          <section key={g.state} class="node-group" aria-label={`${g.state} nodes`}>
            <h3 class="group-title">
              {g.state} <span class="quiet">({g.nodes.length})</span>
            </h3>
            {g.nodes.map((n, i) => (
              <NodeCard key={n.id} node={n} eager={g.first + i < EAGER_CARDS} />
            ))}
          </section>
        ))}
      </section>
    </>
  );
}
