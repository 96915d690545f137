// Shared by the browser tests: start and stop a real `millrace serve`, launch Debian's Chromium.
//
// MILLRACE_BIN and MILLRACE_STATIC_DIR name the binary and dist/ (scripts/test passes them);
// CHROMIUM_PATH the browser.
import { spawn } from 'node:child_process';
import { createServer } from 'node:net';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const here = dirname(fileURLToPath(import.meta.url));
export const root = resolve(here, '..', '..');
export const outDir = join(here, 'out');
export const bin = process.env.MILLRACE_BIN ? resolve(root, process.env.MILLRACE_BIN) : join(root, 'target', 'debug', 'millrace');
const staticDir = process.env.MILLRACE_STATIC_DIR ? resolve(root, process.env.MILLRACE_STATIC_DIR) : join(root, 'dist');
const chromiumPath = process.env.CHROMIUM_PATH ?? '/usr/bin/chromium';

/** A free TCP port on 127.0.0.1. */
export function freePort() {
  return new Promise((ok, fail) => {
    const srv = createServer();
    srv.unref();
    srv.on('error', fail);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => ok(port));
    });
  });
}

/** Starts `millrace serve` and resolves once /healthz answers. */
export async function startServer(port, extraArgs = [], extraEnv = {}) {
  // A fresh data directory per server: the default (`data/` in the working directory) is for users.
  const dataDir = mkdtempSync(join(tmpdir(), 'millrace-smoke-'));
  const child = spawn(bin, ['serve', '--addr', `127.0.0.1:${port}`, '--static-dir', staticDir, '--data-dir', dataDir, ...extraArgs], {
    cwd: root,
    stdio: ['ignore', 'inherit', 'pipe'],
    env: { ...process.env, RUST_LOG: process.env.RUST_LOG ?? 'info', ...extraEnv },
  });
  let log = '';
  child.stderr.on('data', (d) => { log += d; process.stderr.write(d); });
  const exited = new Promise((ok) => child.on('exit', (code) => ok(code)));
  const deadline = Date.now() + 15_000;
  for (;;) {
    const code = await Promise.race([exited, new Promise((ok) => setTimeout(() => ok('wait'), 100))]);
    if (code !== 'wait') throw new Error(`millrace exited with ${code} before serving:\n${log}`);
    try {
      const res = await fetch(`http://127.0.0.1:${port}/healthz`);
      if (res.ok) return { child, exited };
    } catch { /* not listening yet */ }
    if (Date.now() > deadline) {
      child.kill('SIGKILL');
      throw new Error(`millrace did not answer /healthz within 15 s:\n${log}`);
    }
  }
}

export function launchBrowser() {
  return chromium.launch({
    executablePath: chromiumPath,
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
}

/** Stops a server from startServer: SIGTERM, then SIGKILL after 5 s. */
export async function stopServer(server) {
  if (server.child.exitCode !== null || server.child.signalCode !== null) return;
  server.child.kill('SIGTERM');
  const timer = setTimeout(() => server.child.kill('SIGKILL'), 5_000);
  await server.exited;
  clearTimeout(timer);
}


/**
 * Starts a server (stopped after the test) and a browser (closed after the test) for test `t`:
 * `{ base, port, server, browser }`.
 */
export async function serverAndBrowser(t, extraArgs = [], extraEnv = {}) {
  const port = await freePort();
  const base = `http://127.0.0.1:${port}`;
  const server = await startServer(port, extraArgs, extraEnv);
  t.after(() => stopServer(server));
  const browser = await launchBrowser();
  t.after(() => browser.close());
  return { base, port, server, browser };
}
