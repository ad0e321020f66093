/**
 * Builds the release artefacts of llmgw from this checkout:
 *
 *   llmgw-<version>.tgz      an npm package: `npm install -g ./llmgw-<version>.tgz` on a machine
 *                            with only Node.js gives a working `llmgw`. Every workspace package
 *                            is compiled into the bundle; what it still imports from npm is its
 *                            whole dependency list, checked here against the bundle itself.
 *   llmgw_<version>_<arch>.deb   (with --deb) the same install under /usr/lib/llmgw, with
 *                            /usr/bin/llmgw, the systemd units, /etc/llmgw/*.env as conffiles
 *                            and an `llmgw` system user.
 *
 *   npx tsx scripts/package.ts [--out DIR] [--deb [--installed DIR]] [--no-build]
 *
 *   --installed DIR   lay out the .deb from this `npm install --global` of the tarball
 *                     (`<prefix>/lib/node_modules/llmgw`) instead of installing it again
 *
 * Prints the path of each artefact on its own line of stdout; progress goes to stderr.
 */
import { execFileSync } from "node:child_process";
import {
  chmodSync,
  copyFileSync,
  cpSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { builtinModules } from "node:module";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import { gzipSync } from "node:zlib";

const root = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const cliDir = join(root, "apps", "cli");
const say = (msg: string) => process.stderr.write(`package: ${msg}\n`);

interface CliManifest {
  name: string;
  version: string;
  description: string;
  type: string;
  license: string;
  engines: Record<string, string>;
  bin: Record<string, string>;
  dependencies: Record<string, string>;
}

/** The npm package a bare import specifier names (`@scope/name/sub` → `@scope/name`). */
export function packageOf(specifier: string): string {
  const parts = specifier.split("/");
  return specifier.startsWith("@") ? parts.slice(0, 2).join("/") : (parts[0] as string);
}

/**
 * The npm packages the bundle imports, from esbuild's metafile: every external import that is
 * neither relative nor a Node.js builtin.
 */
export function bundleImports(metafile: {
  outputs: Record<string, { imports: { path: string; external?: boolean }[] }>;
}): string[] {
  const builtins = new Set(builtinModules);
  const found = new Set<string>();
  for (const output of Object.values(metafile.outputs)) {
    for (const i of output.imports) {
      if (!i.external || i.path.startsWith(".") || i.path.startsWith("node:")) continue;
      if (builtins.has(i.path) || builtins.has(packageOf(i.path))) continue;
      found.add(packageOf(i.path));
    }
  }
  return [...found].sort();
}

/** Why the dependency list and the bundle disagree, or an empty list when they match. */
export function dependencyMismatches(imports: string[], dependencies: string[]): string[] {
  const deps = new Set(dependencies);
  const used = new Set(imports);
  return [
    ...imports
      .filter((p) => !deps.has(p))
      .map((p) => `the bundle imports ${p}, which apps/cli/package.json does not depend on`),
    ...dependencies
      .filter((p) => !used.has(p))
      .map((p) => `apps/cli/package.json depends on ${p}, which the bundle never imports`),
  ];
}

function run(cmd: string, args: string[], cwd: string, env?: NodeJS.ProcessEnv): string {
  return execFileSync(cmd, args, {
    cwd,
    encoding: "utf8",
    env: env ?? process.env,
    stdio: ["ignore", "pipe", "pipe"],
    maxBuffer: 64 * 1024 * 1024,
  });
}

/** Stages the npm package's files and packs them; returns the tarball's path. */
function packTarball(manifest: CliManifest, out: string, work: string): string {
  const stage = join(work, "llmgw");
  mkdirSync(join(stage, "dist"), { recursive: true });
  const dist = join(cliDir, "dist");
  for (const f of readdirSync(dist)) {
    if (f.endsWith(".js") || f.endsWith(".js.map"))
      copyFileSync(join(dist, f), join(stage, "dist", f));
  }
  chmodSync(join(stage, "dist", "main.js"), 0o755);
  for (const f of ["README.md", "LICENSE", "CHANGELOG.md"])
    copyFileSync(join(root, f), join(stage, f));
  // The units and environment examples travel with the package, for the .deb and for operators
  // installing with npm.
  cpSync(join(root, "deploy", "systemd"), join(stage, "systemd"), { recursive: true });
  const published = {
    name: manifest.name,
    version: manifest.version,
    description: manifest.description,
    type: manifest.type,
    license: manifest.license,
    engines: manifest.engines,
    bin: manifest.bin,
    files: ["dist", "systemd", "CHANGELOG.md"],
    dependencies: manifest.dependencies,
  };
  writeFileSync(join(stage, "package.json"), `${JSON.stringify(published, null, 2)}\n`);
  mkdirSync(out, { recursive: true });
  const packed = JSON.parse(
    run("npm", ["pack", "--json", "--pack-destination", out], stage, {
      ...process.env,
      npm_config_loglevel: "error",
    }),
  ) as { filename: string; size: number; unpackedSize: number; entryCount: number }[];
  const info = packed[0];
  if (!info) throw new Error("npm pack reported nothing");
  say(
    `${info.filename}: ${(info.size / 1e6).toFixed(1)} MB (${(info.unpackedSize / 1e6).toFixed(1)} MB unpacked, ${info.entryCount} files)`,
  );
  return join(out, info.filename);
}

/**
 * `npm install --global` of the tarball into `prefix`, the way an operator runs it (README).
 * npm ≥ 11 runs install scripts of global packages only when allowed: better-sqlite3 builds its
 * native module in one (zeromq's only picks its shipped prebuilt binary).
 */
export function npmInstallArgs(tarball: string, prefix: string): string[] {
  return [
    "install",
    "--global",
    "--prefix",
    prefix,
    "--no-audit",
    "--no-fund",
    "--loglevel=error",
    "--allow-scripts=better-sqlite3,zeromq",
    tarball,
  ];
}

/** Where {@link npmInstallArgs} puts the package. */
export function installedPackageDir(prefix: string): string {
  return join(prefix, "lib", "node_modules", "llmgw");
}

/** Text set verbatim in roff: backslashes escaped, and no line may start a request. */
function roffVerbatim(text: string): string {
  return text
    .replace(/\\/g, "\\e")
    .split("\n")
    .map((l) => (/^[.']/.test(l) ? `\\&${l}` : l))
    .join("\n");
}

/**
 * llmgw(1), from the CLI's own help: the overview, then each command's `--help`, so the page
 * says exactly what the installed binary does.
 */
export function manPage(main: string, version: string, date: string): string {
  const help = (args: string[]) =>
    execFileSync(process.execPath, [main, ...args, "--help"], { encoding: "utf8" }).trimEnd();
  const overview = help([]);
  const commands = (overview.split("Commands:")[1] ?? "")
    .split("\n")
    .map((l) => l.trim())
    .filter((l) => l !== "");
  return [
    `.TH LLMGW 1 "${date}" "llmgw ${version}" "User Commands"`,
    ".SH NAME",
    "llmgw \\- one LLM-serving cluster from a fleet of GPU machines",
    ".SH SYNOPSIS",
    ".B llmgw",
    "\\fICOMMAND\\fR [\\fIoptions\\fR]",
    ".SH DESCRIPTION",
    ".nf",
    roffVerbatim(overview),
    ".fi",
    ".SH COMMANDS",
    ...commands.flatMap((c) => [
      `.SS "llmgw ${c}"`,
      ".nf",
      roffVerbatim(help(c.split(" "))),
      ".fi",
    ]),
    ".SH FILES",
    ".TP",
    ".I /etc/llmgw/agent.env, /etc/llmgw/control-plane.env, /etc/llmgw/router.env",
    "Environment of the llmgw-agent, llmgw-control-plane and llmgw-router units (0600: tokens).",
    ".TP",
    ".I /var/lib/llmgw",
    "State: the node identity, engine logs, the cluster store and its backups.",
    ".SH SEE ALSO",
    "/usr/lib/llmgw/README.md, /usr/lib/llmgw/CHANGELOG.md",
    "",
  ].join("\n");
}

const MAINTAINER = "llmgw developers <llmgw@llmgw.dev>";

const CONTROL = (v: {
  version: string;
  arch: string;
  nodeMajor: number;
  installedKb: number;
}) => `Package: llmgw
Version: ${v.version}
Architecture: ${v.arch}
Maintainer: ${MAINTAINER}
Installed-Size: ${v.installedKb}
Depends: nodejs (>= ${v.nodeMajor}), nodejs (<< ${v.nodeMajor + 1}), libc6, libstdc++6, adduser
Section: net
Priority: optional
Homepage: https://github.com/llmgw/llmgw
Description: LLM-serving cluster from a fleet of GPU machines
 llmgw turns a fleet of GPU machines into one LLM-serving cluster, without
 Kubernetes. One command, llmgw, runs the node agent (GPU and fabric
 discovery, engine supervision), the control plane (scheduling, state,
 metrics) and the OpenAI-compatible router.
 .
 The systemd units llmgw-agent, llmgw-control-plane and llmgw-router are
 installed but neither enabled nor started.
`;

const POSTINST = `#!/bin/sh
# Creates the llmgw system user and its owner-only state directory. Never starts or restarts a
# unit: an upgraded agent takes effect when the operator restarts it, and then adopts the
# engines that kept running (KillMode=process), so no upgrade ever stops a serving model.
set -e
if [ "$1" = configure ]; then
  if ! getent passwd llmgw >/dev/null; then
    adduser --system --group --home /var/lib/llmgw --no-create-home --quiet llmgw
  fi
  install -d -o llmgw -g llmgw -m 0700 /var/lib/llmgw
  if [ -d /run/systemd/system ]; then systemctl daemon-reload >/dev/null 2>&1 || true; fi
  if [ -n "$2" ]; then
    echo "llmgw: upgraded from $2; running units keep the old version until restarted" >&2
  fi
fi
exit 0
`;

const PRERM = `#!/bin/sh
# On removal, stops the units; on upgrade, touches nothing. Stopping llmgw-agent never stops
# its engines (KillMode=process); \`llmgw agent --stop-engines\` does that on purpose.
set -e
if [ "$1" = remove ] && [ -d /run/systemd/system ]; then
  systemctl stop llmgw-router.service llmgw-control-plane.service llmgw-agent.service >/dev/null 2>&1 || true
fi
exit 0
`;

const POSTRM = `#!/bin/sh
# Purging removes the configuration dpkg owns; the state in /var/lib/llmgw (node identity,
# cluster store) is kept: it is the operator's to delete.
set -e
if [ "$1" = remove ] || [ "$1" = purge ]; then
  if [ -d /run/systemd/system ]; then systemctl daemon-reload >/dev/null 2>&1 || true; fi
fi
exit 0
`;

/**
 * Drops what the installed modules carry for other machines or for building: zeromq's prebuilt
 * addons other than the one this Node.js loads (found by loading it), better-sqlite3's sources
 * and object files, npm's dotfiles and `.bin` links. The addons left are stripped and 0644,
 * like any shared library in a Debian package.
 */
function pruneModules(modules: string): void {
  const zmqBuild = join(modules, "zeromq", "build");
  if (existsSync(zmqBuild)) {
    const loaded = run(
      process.execPath,
      [
        "-e",
        `require(${JSON.stringify(join(modules, "zeromq"))});` +
          `const m = require("fs").readFileSync("/proc/self/maps", "utf8").split("\\n")` +
          `.map((l) => l.split(/\\s+/).pop()).find((f) => f && f.endsWith("addon.node"));` +
          "console.log(m ?? '')",
      ],
      modules,
    ).trim();
    if (!loaded.startsWith(`${zmqBuild}/`))
      throw new Error(`zeromq loaded no addon from ${zmqBuild}`);
    const keep = dirname(loaded).slice(zmqBuild.length + 1);
    const manifestFile = join(zmqBuild, "manifest.json");
    const manifest = JSON.parse(readFileSync(manifestFile, "utf8")) as Record<string, string>;
    writeFileSync(
      manifestFile,
      JSON.stringify(
        Object.fromEntries(Object.entries(manifest).filter(([, f]) => f.startsWith(`${keep}/`))),
      ),
    );
    const prune = (dir: string, rel: string) => {
      for (const entry of readdirSync(dir)) {
        const r = rel === "" ? entry : `${rel}/${entry}`;
        if (r === "manifest.json" || r === keep) continue;
        if (keep.startsWith(`${r}/`)) prune(join(dir, entry), r);
        else rmSync(join(dir, entry), { recursive: true, force: true });
      }
    };
    prune(zmqBuild, "");
    for (const f of ["src", "script", "CMakeLists.txt", "vcpkg.json"]) {
      rmSync(join(modules, "zeromq", f), { recursive: true, force: true });
    }
  }
  const sqlite = join(modules, "better-sqlite3");
  const release = join(sqlite, "build", "Release");
  if (existsSync(join(release, "better_sqlite3.node"))) {
    for (const f of ["deps", "src"]) rmSync(join(sqlite, f), { recursive: true, force: true });
    for (const f of readdirSync(join(sqlite, "build"))) {
      if (f !== "Release") rmSync(join(sqlite, "build", f), { recursive: true, force: true });
    }
    for (const f of readdirSync(release)) {
      if (f !== "better_sqlite3.node") rmSync(join(release, f), { recursive: true, force: true });
    }
  }
  const walk = (dir: string) => {
    for (const entry of readdirSync(dir, { withFileTypes: true })) {
      const p = join(dir, entry.name);
      if (entry.name.startsWith(".")) rmSync(p, { recursive: true, force: true });
      else if (entry.isDirectory()) walk(p);
      else if (entry.isFile() && entry.name.endsWith(".node")) {
        run("strip", ["--strip-unneeded", p], modules);
        chmodSync(p, 0o644);
      }
    }
  };
  walk(modules);
}

/** Builds the Debian package from an installed copy of the tarball; returns its path. */
function buildDeb(
  manifest: CliManifest,
  tarball: string,
  out: string,
  work: string,
  installedDir: string | undefined,
): string {
  const arch = run("dpkg", ["--print-architecture"], root).trim();
  let installed = installedDir;
  if (installed === undefined) {
    say("installing the package to lay out the .deb (npm install --global, builds better-sqlite3)");
    const prefix = join(work, "prefix");
    run("npm", npmInstallArgs(tarball, prefix), root);
    installed = installedPackageDir(prefix);
  }
  const version = (
    JSON.parse(readFileSync(join(installed, "package.json"), "utf8")) as { version: string }
  ).version;
  if (version !== manifest.version) {
    throw new Error(`${installed} holds llmgw ${version}, not ${manifest.version}`);
  }
  const pkg = join(work, "deb");
  const lib = join(pkg, "usr", "lib", "llmgw");
  mkdirSync(dirname(lib), { recursive: true });
  cpSync(installed, lib, { recursive: true, verbatimSymlinks: true });
  rmSync(join(lib, "systemd"), { recursive: true, force: true });
  pruneModules(join(lib, "node_modules"));
  mkdirSync(join(pkg, "usr", "bin"), { recursive: true });
  symlinkSync("../lib/llmgw/dist/main.js", join(pkg, "usr", "bin", "llmgw"));
  const units = join(pkg, "lib", "systemd", "system");
  const etc = join(pkg, "etc", "llmgw");
  mkdirSync(units, { recursive: true });
  mkdirSync(etc, { recursive: true });
  const conffiles: string[] = [];
  for (const f of readdirSync(join(root, "deploy", "systemd")).sort()) {
    const from = join(root, "deploy", "systemd", f);
    if (f.endsWith(".service")) copyFileSync(from, join(units, f));
    if (f.endsWith(".env.example")) {
      const name = f.replace(/\.example$/, "");
      copyFileSync(from, join(etc, name));
      // Join tokens and HF tokens go in these: root only.
      chmodSync(join(etc, name), 0o600);
      conffiles.push(`/etc/llmgw/${name}`);
    }
  }
  const man = join(pkg, "usr", "share", "man", "man1");
  mkdirSync(man, { recursive: true });
  const manDate = run("git", ["log", "-1", "--format=%cs"], root).trim();
  writeFileSync(
    join(man, "llmgw.1.gz"),
    gzipSync(manPage(join(lib, "dist", "main.js"), manifest.version, manDate), { level: 9 }),
  );
  const doc = join(pkg, "usr", "share", "doc", "llmgw");
  mkdirSync(doc, { recursive: true });
  writeFileSync(
    join(doc, "copyright"),
    `Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\nUpstream-Name: llmgw\n\nFiles: *\nCopyright: 2026 llmgw developers\nLicense: Apache-2.0\n On Debian systems the full text is in /usr/share/common-licenses/Apache-2.0.\n`,
  );
  // A native package's changelog, in Debian's format, pointing at the project's own.
  const date = run("git", ["log", "-1", "--format=%aD"], root).trim();
  writeFileSync(
    join(doc, "changelog.gz"),
    gzipSync(
      `llmgw (${manifest.version}) unstable; urgency=medium\n\n  * Release ${manifest.version}; what changed is in /usr/lib/llmgw/CHANGELOG.md.\n\n -- ${MAINTAINER}  ${date}\n`,
      { level: 9 },
    ),
  );
  const debian = join(pkg, "DEBIAN");
  mkdirSync(debian, { recursive: true });
  const installedKb = Number(run("du", ["-sk", "--exclude=DEBIAN", pkg], root).split("\t")[0]);
  writeFileSync(
    join(debian, "control"),
    CONTROL({
      version: manifest.version,
      arch,
      nodeMajor: Number(process.versions.node.split(".")[0]),
      installedKb,
    }),
  );
  writeFileSync(join(debian, "conffiles"), `${conffiles.join("\n")}\n`);
  for (const [name, text] of [
    ["postinst", POSTINST],
    ["prerm", PRERM],
    ["postrm", POSTRM],
  ] as const) {
    writeFileSync(join(debian, name), text);
    chmodSync(join(debian, name), 0o755);
  }
  const deb = join(out, `llmgw_${manifest.version}_${arch}.deb`);
  // Owned by root in the archive whoever builds it.
  run("dpkg-deb", ["--root-owner-group", "-Zxz", "--build", pkg, deb], root);
  say(
    `${deb.split("/").pop()}: ${(Number(run("stat", ["-c", "%s", deb], root)) / 1e6).toFixed(1)} MB`,
  );
  return deb;
}

function main(): void {
  const { values } = parseArgs({
    options: {
      out: { type: "string", default: join(root, "dist") },
      deb: { type: "boolean", default: false },
      "no-build": { type: "boolean", default: false },
      installed: { type: "string" },
    },
  });
  const out = resolve(values.out as string);
  if (!values["no-build"]) {
    say("building the llmgw bundle (tsup)");
    run("pnpm", ["--filter", "llmgw", "build"], root);
  }
  const manifest = JSON.parse(readFileSync(join(cliDir, "package.json"), "utf8")) as CliManifest;
  const metafile = join(cliDir, "dist", "metafile-esm.json");
  if (!existsSync(metafile)) throw new Error(`${metafile} is missing: build apps/cli first`);
  const mismatches = dependencyMismatches(
    bundleImports(JSON.parse(readFileSync(metafile, "utf8"))),
    Object.keys(manifest.dependencies),
  );
  if (mismatches.length > 0) {
    for (const m of mismatches) say(m);
    process.exit(1);
  }
  const work = mkdtempSync(join(tmpdir(), "llmgw-package-"));
  try {
    const tarball = packTarball(manifest, out, work);
    process.stdout.write(`${tarball}\n`);
    if (values.deb)
      process.stdout.write(
        `${buildDeb(manifest, tarball, out, work, values.installed && resolve(values.installed))}\n`,
      );
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) main();
