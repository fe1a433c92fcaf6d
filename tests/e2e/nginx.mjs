// A real nginx (Debian's `nginx` package) for the hosting tests: started by the test as an
// unprivileged process (as `nobody` when the tests run as root) on a loopback port, with its own configuration, logs and temp
// folders in a temporary directory; no root, no system service. Its configuration is
// docs/hosting.md's, so what the docs tell users to write is what the tests run.
import { spawn, execFileSync } from "node:child_process";
import { mkdtempSync, mkdirSync, writeFileSync, readFileSync, existsSync, rmSync, chownSync, chmodSync, readdirSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { freePort, stopChild } from "./harness.mjs";

export const NGINX = process.env.NGINX || "/usr/sbin/nginx";

/** The model locations of docs/hosting.md: CORS for every origin (the files are public),
 * Range with multipart answers, long caching of the model files and a short one of the
 * manifest. `maxRanges` set to 1 makes this nginx answer a request for several ranges
 * with the whole file, as S3 and GCS do. */
function modelLocation(prefix, { maxRanges } = {}) {
  return `
    location ${prefix} {
      ${maxRanges ? `max_ranges ${maxRanges};` : ""}
      # CORS: pages of any origin may read the model (public files; no cookies).
      add_header Access-Control-Allow-Origin "*" always;
      add_header Access-Control-Expose-Headers "Content-Range, Content-Length, ETag, Accept-Ranges" always;
      add_header Cross-Origin-Resource-Policy "cross-origin" always;
      add_header Cache-Control "public, max-age=3600" always;
      # A request for several ranges has a Range header the browser does not send without
      # asking first (a CORS preflight): answer it.
      if ($request_method = OPTIONS) {
        add_header Access-Control-Allow-Origin "*";
        add_header Access-Control-Allow-Methods "GET, HEAD, OPTIONS";
        add_header Access-Control-Allow-Headers "Range";
        add_header Access-Control-Max-Age 86400;
        return 204;
      }
    }`;
}

/**
 * Starts nginx serving `root` on a free loopback port. `locations`: extra raw location
 * blocks; `pages` ({"/path": html}) are written under root. Resolves once it answers.
 * The access log has one line per request: `METHOD URI STATUS RANGE BYTES`.
 */
export async function startNginx({ root, extraLocations = "", headers = {} }) {
  if (!existsSync(NGINX)) throw new Error(`${NGINX} not found: apt-get install nginx (.ci/run does)`);
  const dir = mkdtempSync(join(tmpdir(), "colibri-nginx-"));
  for (const t of ["body", "proxy", "fastcgi", "uwsgi", "scgi"]) mkdirSync(join(dir, "tmp", t), { recursive: true });
  const port = await freePort();
  const pageHeaders = Object.entries(headers).map(([k, v]) => `add_header ${k} "${v}" always;`).join("\n      ");
  const conf = `
worker_processes 1;
pid ${dir}/nginx.pid;
error_log ${dir}/error.log warn;
events { worker_connections 64; }
http {
  types {
    text/html html;
    text/javascript js mjs;
    application/json json;
    application/wasm wasm;
    text/css css;
  }
  default_type application/octet-stream;
  log_format ranges '$request_method $uri $status "$http_range" $body_bytes_sent';
  access_log ${dir}/access.log ranges;
  client_body_temp_path ${dir}/tmp/body;
  proxy_temp_path ${dir}/tmp/proxy;
  fastcgi_temp_path ${dir}/tmp/fastcgi;
  uwsgi_temp_path ${dir}/tmp/uwsgi;
  scgi_temp_path ${dir}/tmp/scgi;
  sendfile on;
  server {
    listen 127.0.0.1:${port};
    root ${root};
    location / {
      ${pageHeaders}
    }
    ${modelLocation("/models/")}
    ${modelLocation("/one-range/", { maxRanges: 1 })}
    ${extraLocations}
  }
}
`;
  const confPath = join(dir, "nginx.conf");
  writeFileSync(confPath, conf);
  // Started as root (CI), nginx itself drops to `nobody`: its own folder becomes nobody's,
  // and what it serves must be readable by others (the caller's job: chmod 755).
  const asRoot = process.getuid?.() === 0;
  if (asRoot) chownTree(dir, NOBODY, NOBODY);
  const user = asRoot ? { uid: NOBODY, gid: NOBODY } : {};
  // -e: the error log before the configuration is read (nginx >= 1.19.5); -p: the prefix.
  execFileSync(NGINX, ["-t", "-q", "-p", dir, "-e", join(dir, "error.log"), "-c", confPath], { stdio: "pipe", ...user });
  const child = spawn(NGINX, ["-p", dir, "-e", join(dir, "error.log"), "-c", confPath, "-g", "daemon off;"], { stdio: ["ignore", "pipe", "pipe"], ...user });
  let out = "";
  child.stdout.on("data", (d) => (out += d));
  child.stderr.on("data", (d) => (out += d));
  const url = `http://127.0.0.1:${port}`;
  const log = join(dir, "access.log");
  for (let i = 0; i < 100; i++) {
    if (child.exitCode !== null) throw new Error(`nginx exited: ${out} ${readIf(join(dir, "error.log"))}`);
    try {
      await fetch(`${url}/`);
      return {
        url,
        port,
        conf,
        /** Access log lines so far: [{method, uri, status, range, bytes}]. */
        requests: () => readIf(log).split("\n").filter(Boolean).map(parseLine),
        stop: async () => {
          await stopChild(child, "SIGTERM"); // fast shutdown: keep-alive connections do not hold it
          rmSync(dir, { recursive: true, force: true });
        },
      };
    } catch (_) {}
    await new Promise((r) => setTimeout(r, 50));
  }
  child.kill("SIGKILL");
  throw new Error(`nginx did not come up: ${out}`);
}

const NOBODY = 65534;

function chownTree(p, uid, gid) {
  chownSync(p, uid, gid);
  for (const e of readdirSync(p, { withFileTypes: true })) {
    if (e.isDirectory()) chownTree(join(p, e.name), uid, gid);
    else chownSync(join(p, e.name), uid, gid);
  }
}

/** Makes `dirs` (temporary folders, created 0700) readable by an unprivileged nginx. */
export function readableByAll(...dirs) {
  for (const d of dirs) chmodSync(d, 0o755);
}

const readIf = (p) => (existsSync(p) ? readFileSync(p, "utf8") : "");

function parseLine(line) {
  const m = /^(\S+) (\S+) (\d+) "([^"]*)" (\d+)$/.exec(line);
  if (!m) return { line };
  return { method: m[1], uri: m[2], status: Number(m[3]), range: m[4] === "-" ? "" : m[4], bytes: Number(m[5]) };
}
