/** The console's built files (`pnpm build` writes them into dist/assets.js). */
export interface ConsoleAsset {
  /** Under `/ui/`, e.g. "index.html" or "assets/app-3F9C2A7B.js". */
  readonly path: string;
  readonly contentType: string;
  /** The file, base64. */
  readonly body: string;
  /** A content-hashed name, safe to cache for good. */
  readonly immutable: boolean;
}

export declare const assets: readonly ConsoleAsset[];
