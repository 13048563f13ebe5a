// Berth's ComputeSDK bridge: one ComputeSDK provider per process, driven by Berth over stdio.
//
// Protocol `berth.computesdk-bridge/1` (docs/decisions/computesdk.md): JSON, one object per
// line. On start the sidecar writes a hello line; then each request line
// `{"id":N,"op":"…","args":{…}}` gets exactly one reply `{"id":N,"ok":{…}}` or
// `{"id":N,"err":{"name","message","status","code"}}`. Requests run concurrently; replies may
// come out of order. Closing stdin ends the process (Berth exiting, however, ends it too).
//
// The sidecar translates, it does not decide: no retries, no emulation, no interpretation of
// errors (Berth classifies them), no logging of arguments (they carry environment values).

import { createInterface } from 'node:readline';
import { createRequire } from 'node:module';
import { readFileSync } from 'node:fs';

import { VENDORS } from './vendors.mjs';

const PROTOCOL = 'berth.computesdk-bridge/1';
const require = createRequire(import.meta.url);

const vendorName = process.argv[2];
const vendor = VENDORS[vendorName];
if (!vendor) {
  process.stderr.write(`unknown ComputeSDK provider: ${JSON.stringify(vendorName)}\n`);
  process.exit(2);
}

// Read from the installed package itself (some packages do not export `package.json`).
function version(pkg) {
  const url = new URL(`./node_modules/${pkg}/package.json`, import.meta.url);
  return JSON.parse(readFileSync(url, 'utf8')).version;
}

function send(message) {
  process.stdout.write(`${JSON.stringify(message)}\n`);
}

let provider;
try {
  provider = vendor.make(require(vendor.pkg));
} catch (error) {
  send({ hello: PROTOCOL, error: describe(error) });
  process.exit(1);
}

// Sandboxes this process created or looked up, so an exec does not reconnect every time.
const sandboxes = new Map();
// The labels Berth gave each sandbox this process created. ComputeSDK reports no metadata back,
// so this is the only record: true exactly for sandboxes made here, absent for any other.
const createdLabels = new Map();

async function sandbox(id) {
  const known = sandboxes.get(id);
  if (known) return known;
  const found = await provider.sandbox.getById(id);
  if (!found) {
    const error = new Error(`sandbox ${id} not found`);
    error.code = 'BERTH_NOT_FOUND';
    throw error;
  }
  sandboxes.set(id, found);
  return found;
}

// At most `max` bytes of `text` (UTF-8), base64, and the whole length.
function capped(text, max) {
  const bytes = Buffer.from(typeof text === 'string' ? text : '', 'utf8');
  return { data: bytes.subarray(0, max).toString('base64'), total: bytes.length };
}

const ops = {
  async create(args) {
    const options = { name: args.name, metadata: args.metadata };
    if (args.network === 'none') Object.assign(options, vendor.noNetwork);
    if (args.image) {
      if (!vendor.imageOption) {
        const error = new Error(`${vendorName} has no images`);
        error.code = 'BERTH_INVALID';
        throw error;
      }
      options[vendor.imageOption] = args.image;
    }
    if (args.timeout_ms) options.timeout = args.timeout_ms;
    const created = await provider.sandbox.create(options);
    sandboxes.set(created.sandboxId, created);
    createdLabels.set(created.sandboxId, args.metadata ?? {});
    return { sandbox_id: created.sandboxId };
  },
  async get(args) {
    const found = await provider.sandbox.getById(args.sandbox_id);
    if (found) sandboxes.set(args.sandbox_id, found);
    else sandboxes.delete(args.sandbox_id);
    const labels = found ? createdLabels.get(args.sandbox_id) ?? null : null;
    return { found: Boolean(found), created_here_with_labels: labels };
  },
  async list() {
    const listed = await provider.sandbox.list();
    return { sandbox_ids: listed.map((s) => s.sandboxId) };
  },
  async destroy(args) {
    sandboxes.delete(args.sandbox_id);
    await provider.sandbox.destroy(args.sandbox_id);
    createdLabels.delete(args.sandbox_id);
    return {};
  },
  async exec(args) {
    const target = await sandbox(args.sandbox_id);
    const options = {};
    if (args.cwd) options.cwd = args.cwd;
    if (args.env && Object.keys(args.env).length > 0) options.env = args.env;
    if (args.timeout_ms) options.timeout = args.timeout_ms;
    const result = await target.runCommand(args.command, options);
    const max = args.max_output_bytes;
    const stdout = capped(result.stdout, max);
    const stderr = capped(result.stderr, max);
    return {
      exit_code: Number.isInteger(result.exitCode) ? result.exitCode : null,
      stdout: stdout.data,
      stdout_total: stdout.total,
      stderr: stderr.data,
      stderr_total: stderr.total,
      duration_ms: Number.isFinite(result.durationMs) ? result.durationMs : null,
    };
  },
};

function describe(error) {
  const status = error?.status ?? error?.statusCode ?? error?.response?.status;
  return {
    name: String(error?.name ?? 'Error').slice(0, 200),
    message: String(error?.message ?? error).slice(0, 4096),
    status: Number.isInteger(status) ? status : null,
    code: typeof error?.code === 'string' ? error.code.slice(0, 200) : null,
  };
}

async function handle(line) {
  let request;
  try {
    request = JSON.parse(line);
  } catch {
    send({ id: null, err: { name: 'ProtocolError', message: 'request is not JSON', status: null, code: 'BERTH_PROTOCOL' } });
    return;
  }
  const op = ops[request?.op];
  if (!op || !Number.isInteger(request.id)) {
    send({ id: request?.id ?? null, err: { name: 'ProtocolError', message: `unknown op ${JSON.stringify(request?.op)}`, status: null, code: 'BERTH_PROTOCOL' } });
    return;
  }
  try {
    send({ id: request.id, ok: await op(request.args ?? {}) });
  } catch (error) {
    send({ id: request.id, err: describe(error) });
  }
}

send({
  hello: PROTOCOL,
  provider: vendorName,
  node: process.version,
  packages: { computesdk: version('computesdk'), [vendor.pkg]: version(vendor.pkg) },
});

const input = createInterface({ input: process.stdin, crlfDelay: Infinity });
input.on('line', (line) => {
  handle(line);
});
input.on('close', () => process.exit(0));
