// k6 scenarios of the gateway comparison (bench/peers.py; docs/benchmarks.md, "Beside LiteLLM and
// sglang-router"). Every request is a streaming chat completion from REQUESTS (a JSON list written by
// bench/peers.py from the Mooncake trace sample: tenant key, tier, body), taken in order.
//
//   SCENARIO=saturation  VUS closed-loop virtual users for DUR seconds (requests/s at saturation)
//   SCENARIO=mix         open loop: RATE requests/s for DUR seconds, plus bursts of BURST x RATE
//                        lasting BURST_S seconds every PERIOD_S seconds (multi-tenant tier mix)
//
// k6 reads the whole stream: http_req_duration is the total time of a stream, http_req_waiting the
// time to its first byte (the response head; per-chunk timing comes from bench/peers.py's client).
// The summary (handleSummary) goes to OUT as JSON, with a TTFB and a total-time trend per tier.
import http from 'k6/http';
import exec from 'k6/execution';
import { SharedArray } from 'k6/data';
import { Counter, Trend } from 'k6/metrics';

const REQS = new SharedArray('requests', () => JSON.parse(open(__ENV.REQUESTS)));
const URLS = __ENV.URL.split(',');  // several: spread in turn (the no-gateway baseline)
const TIERS = ['free', 'pro', 'enterprise'];
const ttfb = {};
const total = {};
for (const t of TIERS) {
  ttfb[t] = new Trend(`ttfb_${t}`, true);
  total[t] = new Trend(`total_${t}`, true);
}
const ok = new Counter('ok_streams');
const rejected = new Counter('rejected');

function scenarios() {
  const dur = Number(__ENV.DUR || 5);
  if ((__ENV.SCENARIO || 'saturation') === 'saturation') {
    return { saturation: { executor: 'constant-vus', vus: Number(__ENV.VUS || 16), duration: `${dur}s` } };
  }
  const rate = Number(__ENV.RATE || 10);
  const vus = Number(__ENV.MAX_VUS || 200);
  const out = {
    base: { executor: 'constant-arrival-rate', rate: rate, timeUnit: '1s', duration: `${dur}s`,
            preAllocatedVUs: Math.min(vus, 50), maxVUs: vus },
  };
  const period = Number(__ENV.PERIOD_S || 4);
  const burstS = Number(__ENV.BURST_S || 1);
  const extra = Math.max(0, Number(__ENV.BURST || 3) - 1) * rate;
  for (let start = period / 2, i = 0; extra > 0 && start + burstS <= dur; start += period, i++) {
    out[`burst${i}`] = { executor: 'constant-arrival-rate', rate: extra, timeUnit: '1s',
                         duration: `${burstS}s`, startTime: `${start}s`,
                         preAllocatedVUs: Math.min(vus, 50), maxVUs: vus };
  }
  return out;
}

export const options = {
  scenarios: scenarios(),
  discardResponseBodies: true,
  summaryTrendStats: ['avg', 'med', 'p(99)', 'count'],
  noConnectionReuse: false,
};

export default function () {
  const i = exec.scenario.iterationInTest;
  const r = REQS[i % REQS.length];
  const res = http.post(URLS[i % URLS.length], r.body, {
    headers: { 'content-type': 'application/json', authorization: `Bearer ${r.key}` },
    timeout: '60s',
    tags: { tier: r.tier },
  });
  if (res.status === 200) {
    ok.add(1);
    ttfb[r.tier].add(res.timings.waiting);
    total[r.tier].add(res.timings.duration);
  } else {
    rejected.add(1);
  }
}

export function handleSummary(data) {
  return { [__ENV.OUT]: JSON.stringify(data) };
}
