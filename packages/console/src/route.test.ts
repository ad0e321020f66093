import { describe, expect, it } from "vitest";
import { replicaIdOf, routeOf } from "./route.js";

describe("the console's routes", () => {
  it("read the page from the hash, the fleet by default", () => {
    expect(routeOf("")).toBe("fleet");
    expect(routeOf("#/")).toBe("fleet");
    expect(routeOf("#/events")).toBe("events");
  });

  it("read a replica id as the deployments page encodes it", () => {
    const id = "chat/r-1a2b c";
    expect(replicaIdOf(`replica/${encodeURIComponent(id)}`)).toBe(id);
    expect(replicaIdOf("events")).toBeUndefined();
  });

  it("take a link with a broken %-escape as a specific error, not a crash of the page", () => {
    // A shared link such as /ui/#/replica/% made decodeURIComponent throw while rendering,
    // which took the whole console down (no error boundary above the page).
    for (const bad of ["replica/%", "replica/%E0%A4%A", "replica/%zz"])
      expect(() => replicaIdOf(bad), bad).toThrow(/^not a replica link: /);
  });
});
