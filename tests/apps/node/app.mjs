// A user's workflow app, written with the service's official JavaScript SDK
// (@upstash/workflow) as its documentation shows: at /workflow three `context.run` steps,
// the second failing while a switch is on, and a failure function; at /sleepy a step, a
// one-second `context.sleep`, and a step. The tests run it as a process of its own
// (tests/apps/support.py): `node app.mjs`, after `npm ci`.
//
// Served by node:http and the SDK's core `serve`, not its express adapter: that one
// re-serialises the JSON body before the signature is checked, so the body hash would hold
// only for JSON written as JSON.stringify writes it.
//
// The SDK reads QSTASH_URL (the service: the emulator), QSTASH_TOKEN, and
// QSTASH_CURRENT_SIGNING_KEY with QSTASH_NEXT_SIGNING_KEY (both set: every request to the
// workflow endpoint must be signed). PORT is the loopback port to listen on.
//
// What the tests read back, GET /steps: how often each step ran, every delivery to
// /workflow or /sleepy (when it came, in Unix seconds, its path, its headers, the status
// answered, the steps run while it was served) and every call of the failure function.
// POST /switch {"fail": true|false} turns step two's failure on or off. POST /trigger
// starts a run through the service with the SDK's Client.trigger (the JavaScript SDK
// takes a run's retries and failure URL there): {"body", "retries", "retryDelay",
// "failureUrl", "workflowRunId", "path"}, each optional ("path": the endpoint, /workflow
// unless given).

import { AsyncLocalStorage } from "node:async_hooks";
import http from "node:http";
import { Client, serve } from "@upstash/workflow";

const WORKFLOW = "/workflow";
const SLEEPY = "/sleepy";
const state = {
  fail: false,
  runs: { "step-1": 0, "step-2": 0, "step-3": 0 },
  deliveries: [],
  failures: [],
};
// The delivery being served, so that a step can say it ran during it.
const delivery = new AsyncLocalStorage();

function ran(step) {
  state.runs[step] = (state.runs[step] ?? 0) + 1; // /sleepy's steps: once they run
  delivery.getStore()?.steps.push(step);
}

const workflow = serve(
  async (context) => {
    const first = await context.run("step-1", () => {
      ran("step-1");
      return { n: 1 };
    });
    const second = await context.run("step-2", () => {
      ran("step-2");
      if (state.fail) {
        throw new Error("step 2 is switched to fail");
      }
      return first.n + 1;
    });
    await context.run("step-3", () => {
      ran("step-3");
      return second + 1;
    });
  },
  {
    failureFunction: async ({ context, failStatus, failResponse, failHeaders }) => {
      state.failures.push({
        workflowRunId: context.workflowRunId,
        status: failStatus,
        response: failResponse,
        headers: failHeaders,
      });
    },
  },
);

const sleepy = serve(async (context) => {
  await context.run("before", () => {
    ran("before");
  });
  await context.sleep("nap", 1); // seconds
  await context.run("after", () => {
    ran("after");
  });
});
const handlers = { [WORKFLOW]: workflow.handler, [SLEEPY]: sleepy.handler };

async function readBody(req) {
  const chunks = [];
  for await (const chunk of req) {
    chunks.push(chunk);
  }
  return Buffer.concat(chunks);
}

function answer(res, status, value) {
  res.writeHead(status, { "content-type": "application/json" });
  res.end(JSON.stringify(value));
}

// The request as the SDK's core `serve` takes it (a fetch Request), body untouched.
async function toWorkflow(handler, req, body) {
  const headers = new Headers();
  for (let i = 0; i < req.rawHeaders.length; i += 2) {
    headers.append(req.rawHeaders[i], req.rawHeaders[i + 1]);
  }
  const record = {
    at: Date.now() / 1000,
    path: new URL(req.url, "http://app").pathname,
    headers: { ...req.headers },
    status: null,
    steps: [],
  };
  state.deliveries.push(record);
  const request = new Request(`http://${req.headers.host}${req.url}`, {
    method: req.method,
    headers,
    body: req.method === "GET" || req.method === "HEAD" ? undefined : body,
  });
  const response = await delivery.run(record, () => handler(request));
  record.status = response.status;
  return response;
}

async function trigger(req, body) {
  const { path = WORKFLOW, ...options } = body.length ? JSON.parse(body.toString()) : {};
  const client = new Client({ baseUrl: process.env.QSTASH_URL, token: process.env.QSTASH_TOKEN });
  return client.trigger({ url: `http://${req.headers.host}${path}`, ...options });
}

async function route(req, res) {
  const path = new URL(req.url, "http://app").pathname;
  const body = await readBody(req);
  if (Object.hasOwn(handlers, path)) {
    const response = await toWorkflow(handlers[path], req, body);
    res.writeHead(response.status, Object.fromEntries(response.headers));
    res.end(Buffer.from(await response.arrayBuffer()));
  } else if (path === "/switch" && req.method === "POST") {
    const { fail } = JSON.parse(body.toString());
    if (typeof fail !== "boolean") {
      answer(res, 422, { error: "fail must be true or false" });
      return;
    }
    state.fail = fail;
    answer(res, 200, { fail: state.fail });
  } else if (path === "/steps" && req.method === "GET") {
    answer(res, 200, state);
  } else if (path === "/trigger" && req.method === "POST") {
    answer(res, 200, await trigger(req, body));
  } else {
    answer(res, 404, { error: "not found" });
  }
}

const server = http.createServer((req, res) => {
  route(req, res).catch((error) => {
    console.error(error);
    if (!res.headersSent) {
      answer(res, 500, { error: String(error) });
    }
  });
});
server.listen(Number(process.env.PORT), "127.0.0.1", () => {
  console.error(`listening on http://127.0.0.1:${server.address().port}`);
});
