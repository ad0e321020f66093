/** Small pieces every page uses. */
import type { ComponentChildren } from "preact";
import { useEffect, useRef, useState } from "preact/hooks";
import { describeError } from "./api.js";
import { tone } from "./format.js";

export function Badge({ state, label }: { state: string; label?: string }) {
  return <span class={`badge ${tone(state)}`}>{label ?? state}</span>;
}

export function ErrorLine({ error }: { error: string | undefined }) {
  if (error === undefined) return null;
  return (
    <p class="error" role="alert">
      {error}
    </p>
  );
}

export function Loading({ what }: { what: string }) {
  return <p class="quiet">Loading {what}…</p>;
}

/**
 * A modal that asks before a change: `confirm` runs on its button, and an error it throws is
 * shown in the dialog, which stays open.
 */
export function Confirm(props: {
  title: string;
  children: ComponentChildren;
  action: string;
  danger?: boolean;
  confirm: () => Promise<void>;
  close: () => void;
}) {
  const ref = useRef<HTMLDialogElement>(null);
  const [error, setError] = useState<string | undefined>(undefined);
  const [busy, setBusy] = useState(false);
  useEffect(() => {
    ref.current?.showModal();
  }, []);
  const run = async () => {
    setBusy(true);
    try {
      await props.confirm();
      props.close();
    } catch (e) {
      setError((e as Error).message);
      setBusy(false);
    }
  };
  return (
    <dialog ref={ref} aria-labelledby="confirm-title" onClose={props.close} onCancel={props.close}>
      <h2 id="confirm-title">{props.title}</h2>
      <div>{props.children}</div>
      <ErrorLine error={error} />
      <div class="buttons">
        <button type="button" onClick={props.close}>
          Cancel
        </button>
        <button
          type="button"
          class={props.danger ? "danger" : "primary"}
          disabled={busy}
          onClick={() => void run()}
        >
          {props.action}
        </button>
      </div>
    </dialog>
  );
}

/**
 * A danger button that asks first: the dialog's own button (the same label) runs `run`, whose
 * failure is shown in the dialog in words, and then `done`.
 */
export function ConfirmedAction(props: {
  label: string;
  title: string;
  children: ComponentChildren;
  run: () => Promise<unknown>;
  done: () => void;
}) {
  const [asking, setAsking] = useState(false);
  return (
    <>
      <button type="button" class="danger" onClick={() => setAsking(true)}>
        {props.label}
      </button>
      {asking ? (
        <Confirm
          title={props.title}
          action={props.label}
          danger
          close={() => setAsking(false)}
          confirm={async () => {
            try {
              await props.run();
            } catch (e) {
              throw new Error(describeError(e));
            }
            props.done();
          }}
        >
          {props.children}
        </Confirm>
      ) : null}
    </>
  );
}

/** `<dt>`/`<dd>` pairs. */
export function Facts({ items }: { items: readonly (readonly [string, ComponentChildren])[] }) {
  return (
    <dl class="facts">
      {items.map(([k, v]) => (
        <div key={k}>
          <dt>{k}</dt>
          <dd>{v}</dd>
        </div>
      ))}
    </dl>
  );
}

/** A table's column headings. */
export function ColumnHeads({ names }: { names: readonly string[] }) {
  return (
    <thead>
      <tr>
        {names.map((n) => (
          <th key={n} scope="col">
            {n}
          </th>
        ))}
      </tr>
    </thead>
  );
}
