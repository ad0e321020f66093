const KEYWORDS = new Set([
  "by",
  "without",
  "on",
  "ignoring",
  "group_left",
  "group_right",
  "and",
  "or",
  "unless",
  "bool",
  "offset",
  "inf",
  "nan",
  "le",
]);

/**
 * Metric names referenced by a PromQL expression (as written in dashboards and rules):
 * string literals, label matchers, range/subquery brackets, grouping lists and Grafana
 * variables are stripped; what remains that is not a function or keyword is a metric name.
 * Histogram `_bucket/_sum/_count` suffixes are stripped, so the result are family names.
 */
export function metricNamesInPromQL(expr: string): Set<string> {
  let e = expr;
  e = e.replace(/"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`/g, '""');
  e = e.replace(/\{[^}]*\}/g, " ");
  e = e.replace(/\[[^\]]*\]/g, " ");
  e = e.replace(/\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)/g, " ");
  e = e.replace(/\$\{[^}]*\}|\$[a-zA-Z_]\w*/g, " ");
  const names = new Set<string>();
  for (const m of e.matchAll(/[a-zA-Z_:][a-zA-Z0-9_:]*(?=\s*(\()?)/g)) {
    const word = m[0];
    if (m[1] === "(") continue; // function call
    if (KEYWORDS.has(word.toLowerCase())) continue;
    const before = e.slice(0, m.index);
    if (/[0-9.]$/.test(before)) continue; // tail of a number such as 1e3
    names.add(word.replace(/_(bucket|sum|count)$/, ""));
  }
  return names;
}

/**
 * Every PromQL expression of a Grafana dashboard JSON: panel (and row) targets' `expr`, and
 * the metric of `label_values(metric, label)` template variables (returned as an expression).
 */
export function promQLInDashboard(dashboard: unknown): string[] {
  const out: string[] = [];
  const walk = (node: unknown): void => {
    if (Array.isArray(node)) {
      for (const n of node) walk(n);
      return;
    }
    if (typeof node !== "object" || node === null) return;
    const o = node as Record<string, unknown>;
    if (typeof o.expr === "string") out.push(o.expr);
    if (typeof o.definition === "string") {
      const m = /label_values\(\s*([^,]+?)\s*,/.exec(o.definition);
      if (m) out.push(m[1]!);
    }
    for (const [k, v] of Object.entries(o))
      if (k !== "expr" && k !== "definition" && k !== "query") walk(v);
  };
  walk(dashboard);
  return out;
}
