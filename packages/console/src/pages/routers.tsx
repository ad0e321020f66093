/** The routers the control plane feeds, and how fresh their routing state is. */
import { cluster } from "../api.js";
import { ago, duration } from "../format.js";
import { useNow, usePoll } from "../live.js";
import { Badge, ColumnHeads, ErrorLine, Loading } from "../ui.js";

export function RoutersPage() {
  const now = useNow();
  const polled = usePoll(
    async (signal) => (await cluster.listRouters({}, { signal })).routers,
    3_000,
  );
  return (
    <>
      <h1>Routers</h1>
      <ErrorLine error={polled.error} />
      {polled.data === undefined ? <Loading what="routers" /> : null}
      {polled.data?.length === 0 ? <p class="quiet">No router has connected.</p> : null}
      {polled.data?.length ? (
        <table>
          <ColumnHeads
            names={[
              "Router",
              "Address",
              "Version",
              "Stream",
              "Routing state age",
              "Connected",
              "Last seen",
              "Cache isolation",
            ]}
          />
          <tbody>
            {polled.data.map((r) => (
              <tr key={r.id} data-router={r.id}>
                <td>
                  {r.id}
                  {r.inProcess ? <span class="quiet"> (in-process)</span> : null}
                </td>
                <td>{r.address || "—"}</td>
                <td>{r.version || "—"}</td>
                <td>
                  <Badge
                    state={r.connected ? "ready" : "unreachable"}
                    label={r.connected ? "open" : "closed"}
                  />
                </td>
                <td>{duration(r.stateAgeMs)}</td>
                <td>{ago(r.connectedAtUnixMs, now)}</td>
                <td>{ago(r.lastSeenUnixMs, now)}</td>
                <td data-isolation>{r.cacheIsolation || "—"}</td>
              </tr>
            ))}
          </tbody>
        </table>
      ) : null}
    </>
  );
}
