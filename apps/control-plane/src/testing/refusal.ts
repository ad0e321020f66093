import { ConnectError } from "@connectrpc/connect";

/** The Connect error `call` rejects with; throws when it does not reject. */
export async function refusal(call: Promise<unknown>): Promise<ConnectError> {
  try {
    await call;
  } catch (error) {
    return ConnectError.from(error);
  }
  throw new Error("expected the call to be refused");
}
