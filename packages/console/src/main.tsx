/**
 * The console's shell: login, navigation by `#/page` (nothing secret is ever in the URL),
 * and the control plane it talks to in the header.
 */
import { render } from "preact";
import { useEffect, useState } from "preact/hooks";
import { cluster, login, logout, onSessionExpired, resumeSession } from "./api.js";
import { events, usePoll } from "./live.js";
import { DeploymentsPage } from "./pages/deployments.js";
import { EventsPage } from "./pages/events.js";
import { FleetPage } from "./pages/fleet.js";
import { KeysPage } from "./pages/keys.js";
import { ReplicaPage } from "./pages/replica.js";
import { RoutersPage } from "./pages/routers.js";
import { TenantsPage } from "./pages/tenants.js";
import { replicaIdOf, routeOf } from "./route.js";
import { ErrorLine } from "./ui.js";

const PAGES = [
  ["fleet", "Fleet"],
  ["deployments", "Deployments"],
  ["events", "Events"],
  ["keys", "API keys"],
  ["tenants", "Tenants"],
  ["routers", "Routers"],
] as const;

function currentRoute(): string {
  return routeOf(window.location.hash);
}

function useRoute(): string {
  const [route, setRoute] = useState(currentRoute());
  useEffect(() => {
    const onHash = () => setRoute(currentRoute());
    window.addEventListener("hashchange", onHash);
    return () => window.removeEventListener("hashchange", onHash);
  }, []);
  return route;
}

function Login({ done }: { done: () => void }) {
  const [token, setToken] = useState("");
  const [error, setError] = useState<string | undefined>(undefined);
  const [busy, setBusy] = useState(false);
  return (
    <main class="login">
      <h1>llmgw console</h1>
      <form
        onSubmit={async (e) => {
          e.preventDefault();
          setBusy(true);
          try {
            await login(token);
            setToken("");
            done();
          } catch (err) {
            setError((err as Error).message);
          } finally {
            setBusy(false);
          }
        }}
      >
        <label for="token">Admin token</label>
        <input
          id="token"
          type="password"
          autocomplete="off"
          value={token}
          onInput={(e) => setToken((e.target as HTMLInputElement).value)}
        />
        <p class="quiet">
          Print it on the control plane's host with <code>llmgw control-plane token --admin</code>.
        </p>
        <button type="submit" class="primary" disabled={busy || token === ""}>
          Log in
        </button>
        <ErrorLine error={error} />
      </form>
    </main>
  );
}

function Header({ out }: { out: () => void }) {
  const route = useRoute();
  const status = usePoll(async (signal) => cluster.getClusterStatus({}, { signal }), 10_000);
  const s = status.data;
  const leader = s?.controlPlanes.find((c) => c.leader);
  return (
    <header class="top">
      <a class="brand" href="#/fleet">
        llmgw
      </a>
      <nav aria-label="pages">
        <ul>
          {PAGES.map(([id, label]) => (
            <li key={id}>
              <a
                href={`#/${id}`}
                aria-current={route === id || route.startsWith(`${id}/`) ? "page" : undefined}
              >
                {label}
              </a>
            </li>
          ))}
        </ul>
      </nav>
      <span class="quiet">
        {s === undefined
          ? ""
          : `${s.version} · ${s.store}${leader === undefined ? "" : ` · leader ${leader.url}`}`}
      </span>
      <button type="button" onClick={out}>
        Log out
      </button>
    </header>
  );
}

function Page() {
  const route = useRoute();
  let replica: string | undefined;
  try {
    replica = replicaIdOf(route);
  } catch (e) {
    return <ErrorLine error={(e as Error).message} />;
  }
  if (replica !== undefined) return <ReplicaPage id={replica} />;
  switch (route) {
    case "deployments":
      return <DeploymentsPage />;
    case "events":
      return <EventsPage />;
    case "keys":
      return <KeysPage />;
    case "routers":
      return <RoutersPage />;
    case "tenants":
      return <TenantsPage />;
    default:
      return <FleetPage />;
  }
}

/** Asked before the first render: the page's first calls wait for it. */
const resumed = resumeSession();

function App() {
  const [state, setState] = useState<"checking" | "out" | "in">("checking");
  useEffect(() => {
    resumed.then(
      (s) => setState(s === undefined ? "out" : "in"),
      () => setState("out"),
    );
    return onSessionExpired(() => setState("out"));
  }, []);
  useEffect(() => {
    if (state === "in") events.start();
    else events.stop();
  }, [state]);
  if (state === "checking") return <p class="quiet">Loading…</p>;
  if (state === "out") return <Login done={() => setState("in")} />;
  return (
    <>
      <Header
        out={() => {
          void logout().finally(() => setState("out"));
        }}
      />
      <main>
        <Page />
      </main>
    </>
  );
}

const root = document.getElementById("app");
if (root !== null) render(<App />, root);
