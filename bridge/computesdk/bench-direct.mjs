// The baseline for `berth bench bridge`: the same ComputeSDK provider, built the same way as
// the sidecar builds it, driven directly from Node. Prints one JSON line:
// {"exec_ms": [...], "cycle_ms": [...]} — per exec of `true` in one sandbox (with the same
// one-variable environment Berth sends), and per create → runCommand → destroy cycle.
// Usage: node bench-direct.mjs VENDOR ITERATIONS

import { createRequire } from 'node:module';
import { performance } from 'node:perf_hooks';

import { VENDORS } from './vendors.mjs';

const require = createRequire(import.meta.url);
const [vendorName, iterationsText] = process.argv.slice(2);
const vendor = VENDORS[vendorName];
const iterations = Number.parseInt(iterationsText, 10);
if (!vendor || !(iterations > 0)) {
  process.stderr.write('usage: node bench-direct.mjs VENDOR ITERATIONS\n');
  process.exit(2);
}
const provider = vendor.make(require(vendor.pkg));

function check(result) {
  if (result.exitCode !== 0) throw new Error(`exit ${result.exitCode}: ${result.stderr}`);
}

const sandbox = await provider.sandbox.create({ name: 'bench-direct' });
// (just-bash, the vendor this is run with, has no network option: none is its only mode.)
const env = { BERTH_SANDBOX: sandbox.sandboxId };
check(await sandbox.runCommand('true', { env }));
const exec_ms = [];
for (let i = 0; i < iterations; i++) {
  const start = performance.now();
  check(await sandbox.runCommand('true', { env }));
  exec_ms.push(performance.now() - start);
}
await provider.sandbox.destroy(sandbox.sandboxId);

const cycle_ms = [];
for (let i = 0; i < iterations; i++) {
  const start = performance.now();
  const s = await provider.sandbox.create({ name: `bench-direct-${i}` });
  check(await s.runCommand('true', { env: { BERTH_SANDBOX: s.sandboxId } }));
  await provider.sandbox.destroy(s.sandboxId);
  cycle_ms.push(performance.now() - start);
}
process.stdout.write(`${JSON.stringify({ exec_ms, cycle_ms })}\n`);
