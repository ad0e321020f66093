import { create } from "@bufbuild/protobuf";
import {
  Code,
  ConnectError,
  createClient,
  createRouterTransport,
  type HandlerContext,
  type Transport,
} from "@connectrpc/connect";
import { ClusterService, GetClusterStatusResponseSchema } from "@llmgw/proto";
import { describe, expect, it } from "vitest";
import { createFailoverTransport, splitControlPlaneUrls } from "./failover.js";

/** An instance that leads (answers with its name) or follows (refuses, naming `leader`). */
function instance(name: string, role: { leads: true } | { leader?: string }): Transport {
  return createRouterTransport(({ service }) => {
    service(ClusterService, {
      getClusterStatus: () => {
        if ("leads" in role) return create(GetClusterStatusResponseSchema, { version: name });
        throw new ConnectError("a follower", Code.Unavailable, {
          "llmgw-error-code": "LLMGW_CONTROL_PLANE_NOT_LEADER",
          ...(role.leader === undefined ? {} : { "llmgw-leader": role.leader }),
        });
      },
      listEvents: async function* () {},
    } as never);
  });
}

/** A follower answering reads from its copy (version `name`), naming `leader`. */
function readingFollower(name: string, leader: string): Transport {
  return createRouterTransport(({ service }) => {
    service(ClusterService, {
      getClusterStatus: (_req: unknown, ctx: HandlerContext) => {
        ctx.responseHeader.set("llmgw-served-by", "follower");
        ctx.responseHeader.set("llmgw-leader", leader);
        return create(GetClusterStatusResponseSchema, { version: name });
      },
    } as never);
  });
}

/** An instance that is down: every call fails as a refused connection does. */
const down: Transport = {
  unary: () =>
    Promise.reject(
      new ConnectError("connect ECONNREFUSED", Code.Unavailable, undefined, undefined, {
        code: "ECONNREFUSED",
      }),
    ),
  stream: () => Promise.reject(new Error("down")),
};

function clientOver(map: Record<string, Transport>, moves: string[] = []) {
  const transport = createFailoverTransport({
    urls: Object.keys(map),
    transportFor: (url) => map[url] as Transport,
    onMove: (from, to, why) => moves.push(`${from}→${to} (${why})`),
  });
  return { client: createClient(ClusterService, transport), transport };
}

describe("createFailoverTransport", () => {
  it("asks the leader again when a follower answered a read from its copy, and stays there", async () => {
    const moves: string[] = [];
    const { client, transport } = clientOver(
      {
        "http://a": readingFollower("a's copy", "http://b/"),
        "http://b": instance("b", { leads: true }),
      },
      moves,
    );
    expect((await client.getClusterStatus({})).version).toBe("b");
    expect(transport.current).toBe("http://b");
    expect(moves).toEqual(["http://a→http://b (a follower's copy)"]);
  });

  it("moves on from a refused connection reported as internal, with the code only in its message", async () => {
    const refusedAsInternal: Transport = {
      unary: () =>
        Promise.reject(new ConnectError("connect ECONNREFUSED 127.0.0.1:7070", Code.Internal)),
      stream: () => Promise.reject(new Error("down")),
    };
    const { client, transport } = clientOver({
      "http://a": refusedAsInternal,
      "http://b": instance("b", { leads: true }),
    });
    expect((await client.getClusterStatus({})).version).toBe("b");
    expect(transport.current).toBe("http://b");
  });

  it("keeps a follower's read when the leader it names is down or not listed", async () => {
    const named = clientOver({
      "http://a": readingFollower("a's copy", "http://b"),
      "http://b": down,
    });
    expect((await named.client.getClusterStatus({})).version).toBe("a's copy");
    expect(named.transport.current).toBe("http://a");
    const unlisted = clientOver({ "http://a": readingFollower("a's copy", "http://evil") });
    expect((await unlisted.client.getClusterStatus({})).version).toBe("a's copy");
  });

  it("follows a follower's hint to the leader and stays there", async () => {
    const moves: string[] = [];
    const { client, transport } = clientOver(
      {
        "http://a": instance("a", { leader: "http://c" }),
        "http://b": instance("b", {}),
        "http://c": instance("c", { leads: true }),
      },
      moves,
    );
    expect((await client.getClusterStatus({})).version).toBe("c");
    expect(transport.current).toBe("http://c");
    expect((await client.getClusterStatus({})).version).toBe("c");
    expect(moves).toEqual(["http://a→http://c (a follower)"]);
  });

  it("skips an instance that is down, and a hint naming one already tried", async () => {
    const { client, transport } = clientOver({
      "http://a": down,
      "http://b": instance("b", { leader: "http://a" }),
      "http://c": instance("c", { leads: true }),
    });
    expect((await client.getClusterStatus({})).version).toBe("c");
    expect(transport.current).toBe("http://c");
  });

  it("never follows a hint to a URL it was not given", async () => {
    const { client } = clientOver({
      "http://a": instance("a", { leader: "http://evil" }),
      "http://b": instance("b", { leads: true }),
    });
    expect((await client.getClusterStatus({})).version).toBe("b");
  });

  it("with no leader anywhere, fails once every instance was asked", async () => {
    const { client } = clientOver({ "http://a": instance("a", {}), "http://b": down });
    await expect(client.getClusterStatus({})).rejects.toThrow(/ECONNREFUSED|a follower/);
  });

  it("does not retry an answer that is the leader's own (not a refusal)", async () => {
    let calls = 0;
    const refusing = createRouterTransport(({ service }) => {
      service(ClusterService, {
        getClusterStatus: () => {
          calls++;
          throw new ConnectError("no", Code.PermissionDenied);
        },
      } as never);
    });
    const { client } = clientOver({
      "http://a": refusing,
      "http://b": instance("b", { leads: true }),
    });
    await expect(client.getClusterStatus({})).rejects.toThrow("no");
    expect(calls).toBe(1);
  });

  it("a connection broken mid-call fails that call (it may have run) and moves the next one", async () => {
    const reset: Transport = {
      unary: () =>
        Promise.reject(
          new ConnectError("read ECONNRESET", Code.Internal, undefined, undefined, {
            code: "ECONNRESET",
          }),
        ),
      stream: () => Promise.reject(new Error("reset")),
    };
    const { client, transport } = clientOver({
      "http://a": reset,
      "http://b": instance("b", { leads: true }),
    });
    await expect(client.getClusterStatus({})).rejects.toThrow("ECONNRESET");
    expect(transport.current).toBe("http://b");
    expect((await client.getClusterStatus({})).version).toBe("b");
  });

  it("splits a URL list, dropping blanks and trailing slashes", () => {
    expect(splitControlPlaneUrls(" http://a:7070/, ,https://b:7070")).toEqual([
      "http://a:7070",
      "https://b:7070",
    ]);
  });
});
