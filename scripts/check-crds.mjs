// Validates prometheus-operator objects (ServiceMonitor, PrometheusRule, monitoring.coreos.com/v1)
// against the JSON schemas of @kubernetes-models/prometheus-operator, which
// scripts/install-deploy-checks.sh installs under ROOT.
//
//   node scripts/check-crds.mjs ROOT < objects.json
//
// Standard input is a JSON array of objects, each with a `source` (a name for messages) and the
// `object` itself. Prints one line per object; exits 1 when any is invalid, 2 when an object is
// of a kind this check has no schema for (so nothing goes unchecked silently).
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const root = process.argv[2];
if (!root) {
  console.error("usage: node scripts/check-crds.mjs ROOT < objects.json");
  process.exit(2);
}
const models = join(root, "npm/node_modules/@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1");
const kinds = {};
for (const kind of ["ServiceMonitor", "PrometheusRule"]) {
  kinds[kind] = (await import(pathToFileURL(join(models, `${kind}.js`)).href))[kind];
}

let status = 0;
for (const { source, object } of JSON.parse(readFileSync(0, "utf8"))) {
  const name = `${source}: ${object.kind}/${object.metadata?.name}`;
  const Model = object.apiVersion === "monitoring.coreos.com/v1" ? kinds[object.kind] : undefined;
  if (!Model) {
    console.log(`NO SCHEMA ${name} (${object.apiVersion})`);
    status = Math.max(status, 2);
    continue;
  }
  try {
    new Model(object).validate();
    console.log(`VALID ${name}`);
  } catch (e) {
    console.log(`INVALID ${name}: ${e.message}`);
    status = Math.max(status, 1);
  }
}
process.exit(status);
