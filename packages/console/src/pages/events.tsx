/** The event log, live from `WatchEvents`, newest first, filterable by severity and text. */
import { useState } from "preact/hooks";
import { clock } from "../format.js";
import { events, useEvents } from "../live.js";
import { Badge, ColumnHeads } from "../ui.js";

/** Rows shown at most; the stream keeps more. */
const SHOWN = 500;

export function EventsPage() {
  const all = useEvents();
  const [severity, setSeverity] = useState("");
  const [text, setText] = useState("");
  const status = events.status();
  const t = text.trim().toLowerCase();
  const shown = [];
  for (let i = all.length - 1; i >= 0 && shown.length < SHOWN; i--) {
    const e = all[i];
    if (e === undefined) continue;
    if (severity !== "" && e.severity !== severity) continue;
    if (
      t !== "" &&
      !e.kind.toLowerCase().includes(t) &&
      !e.subject.toLowerCase().includes(t) &&
      !e.message.toLowerCase().includes(t)
    )
      continue;
    shown.push(e);
  }
  return (
    <>
      <h1>Events</h1>
      <p class="quiet" aria-live="polite">
        {status.connected ? "Live." : `Reconnecting… ${status.error ?? ""}`}
      </p>
      <div class="toolbar">
        <label>
          Severity{" "}
          <select
            value={severity}
            onChange={(e) => setSeverity((e.target as HTMLSelectElement).value)}
          >
            <option value="">all</option>
            <option value="info">info</option>
            <option value="warning">warning</option>
            <option value="error">error</option>
          </select>
        </label>
        <label>
          Search{" "}
          <input
            type="search"
            value={text}
            placeholder="kind, subject or message"
            onInput={(e) => setText((e.target as HTMLInputElement).value)}
          />
        </label>
      </div>
      <table class="events">
        <caption class="visually-hidden">Cluster events, newest first</caption>
        <ColumnHeads names={["Time", "Severity", "Kind", "Subject", "Message"]} />
        <tbody>
          {shown.map((e) => (
            <tr key={String(e.id)} data-event={e.kind}>
              <td>
                <time>{clock(e.atUnixMs)}</time>
              </td>
              <td>
                <Badge state={e.severity} />
              </td>
              <td>{e.kind}</td>
              <td>{e.subject}</td>
              <td>{e.message}</td>
            </tr>
          ))}
        </tbody>
      </table>
      {shown.length === 0 ? <p class="quiet">No events match.</p> : null}
    </>
  );
}
