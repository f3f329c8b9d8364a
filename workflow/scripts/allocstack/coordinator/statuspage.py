"""The live status page the coordinator serves at ``/ui`` (read-only view token in the URL).

Self-contained: inline CSS, JavaScript and SVG, no external assets, so it works on
an air-gapped cluster through an SSH tunnel. It polls ``/status?history=1`` every
two seconds with the same view token and redraws: counts, a progress bar, a
throughput chart, one lane per worker, grouped by node (a header per node with
its workers and what they completed), and the stack's events (restarts, sockets beyond
loopback, failed gates: ``/status``'s ``events``). Elements carry ids (``done``, ``total``,
``pending``, ``leased``, ``rate``...) and data attributes (``data-worker``,
``data-node``) so tests can read them.
"""

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>allocstack run</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
 body{font:14px system-ui,sans-serif;margin:24px;color:#1a202c;background:#f7fafc}
 h1{font-size:20px;margin:0 0 4px} .sub{color:#718096;margin-bottom:16px}
 .cards{display:flex;gap:12px;flex-wrap:wrap;margin-bottom:16px}
 .card{background:#fff;border:1px solid #e2e8f0;border-radius:8px;padding:10px 14px;min-width:110px}
 .card b{display:block;font-size:22px} .card span{color:#718096;font-size:12px}
 .bar{height:14px;background:#e2e8f0;border-radius:7px;overflow:hidden;margin-bottom:18px}
 .bar div{height:100%;background:#2b6cb0}
 .panel{background:#fff;border:1px solid #e2e8f0;border-radius:8px;padding:12px;margin-bottom:16px}
 .panel h2{font-size:14px;margin:0 0 8px}
 .lane{display:flex;align-items:center;gap:8px;margin:3px 0;font-family:ui-monospace,monospace;font-size:12px}
 .lane .name{width:90px} .lane .track{flex:1;background:#edf2f7;height:12px;border-radius:6px;overflow:hidden}
 .lane .fill{height:100%;background:#38a169} .lane .num{width:220px;white-space:nowrap;text-align:right;color:#4a5568}
 .stale .fill{background:#d69e2e} #error{color:#c53030}
 .node{margin:10px 0 4px;font-size:13px;color:#2d3748} .node:first-child{margin-top:0}
 .event{font-family:ui-monospace,monospace;font-size:12px;color:#c53030;margin:2px 0}
</style></head><body>
<h1>allocstack run <span id="state">loading</span></h1>
<div class="sub">elapsed <span id="elapsed">-</span> s &middot; ready after <span id="ready">-</span> s
 &middot; updated <span id="updated">-</span> <span id="error"></span></div>
<div class="cards">
 <div class="card"><b id="done">-</b><span>done of <span id="total">-</span></span></div>
 <div class="card"><b id="pending">-</b><span>pending</span></div>
 <div class="card"><b id="leased">-</b><span>leased</span></div>
 <div class="card"><b id="failed">-</b><span>failed</span></div>
 <div class="card"><b id="rate">-</b><span>tasks/s (30 s)</span></div>
 <div class="card"><b id="eta">-</b><span>time left</span></div>
 <div class="card"><b id="expired">-</b><span>leases expired</span></div>
 <div class="card"><b id="rejected">-</b><span>results rejected</span></div>
</div>
<div class="bar"><div id="progress" style="width:0%"></div></div>
<div class="panel"><h2>Throughput (tasks/s)</h2><svg id="chart" width="100%" height="160" viewBox="0 0 800 160"
 preserveAspectRatio="none"></svg></div>
<div class="panel"><h2>Workers, by node</h2><div id="lanes"></div></div>
<div class="panel"><h2>Events of the stack's programs</h2><div id="events">none</div></div>
<script>
const token = new URLSearchParams(location.search).get("token") || "";
const fmt = n => n === null || n === undefined ? "-" : Number(n).toLocaleString("en-US");
function set(id, v) { document.getElementById(id).textContent = v; }
function chart(history) {
  const svg = document.getElementById("chart");
  if (history.length < 2) { svg.innerHTML = ""; return; }
  const pts = [];
  for (let i = 1; i < history.length; i++) {
    const dt = history[i][0] - history[i-1][0];
    pts.push([history[i][0], dt > 0 ? (history[i][1] - history[i-1][1]) / dt : 0]);
  }
  const t0 = pts[0][0], t1 = pts[pts.length-1][0] || 1, peak = Math.max(1, ...pts.map(p => p[1])), top = peak * 1.25;
  const xy = pts.map(p => [(p[0]-t0) / Math.max(1e-9, t1-t0) * 790 + 5, 150 - p[1] / top * 140]);
  svg.innerHTML = '<polyline fill="none" stroke="#2b6cb0" stroke-width="2" points="' +
    xy.map(p => p[0].toFixed(1) + "," + p[1].toFixed(1)).join(" ") + '"/>' +
    '<text x="6" y="14" font-size="11" fill="#718096">peak ' + fmt(Math.round(peak)) + '/s</text>';
}
function lanes(workers, nodes) {
  const names = Object.keys(workers), most = Math.max(1, ...names.map(n => workers[n].completed));
  const lane = n => {
    const w = workers[n], stale = w.lastSeenSecondsAgo > 10 ? " stale" : "";
    return '<div class="lane' + stale + '" data-worker="' + n + '" data-node="' + (w.node || "") +
      '" data-completed="' + w.completed + '">' +
      '<span class="name">' + n + '</span><span class="track"><span class="fill" style="display:block;width:' +
      (w.completed / most * 100).toFixed(1) + '%"></span></span><span class="num">' + fmt(w.completed) +
      ' done, seen ' + w.lastSeenSecondsAgo.toFixed(1) + ' s ago</span></div>';
  };
  const groups = Object.keys(nodes || {}).map(node => '<div class="node" data-node="' + node + '" data-workers="' +
    nodes[node].workers.length + '" data-completed="' + nodes[node].completed + '"><b>' + node + '</b> &middot; ' +
    nodes[node].workers.length + ' workers, ' + fmt(nodes[node].completed) + ' done</div>' +
    nodes[node].workers.map(lane).join(""));
  document.getElementById("lanes").innerHTML = (groups.length ? groups : names.map(lane)).join("") || "no worker yet";
}
function events(list) {
  const box = document.getElementById("events");
  box.textContent = list.length ? "" : "none";
  list.forEach(e => {
    const row = document.createElement("div");
    row.className = "event"; row.dataset.event = e.event;
    row.textContent = (e.t ? new Date(e.t * 1000).toLocaleTimeString() + "  " : "") + e.line;
    box.appendChild(row);
  });
}
async function refresh() {
  try {
    const r = await fetch("status?history=1&token=" + encodeURIComponent(token), {cache: "no-store"});
    if (!r.ok) throw new Error("HTTP " + r.status);
    const s = await r.json();
    set("state", s.complete ? "complete" : (s.draining ? "stopping" : "running"));
    ["done", "total", "pending", "leased", "failed"].forEach(k => set(k, fmt(s[k])));
    set("rate", fmt(Math.round(s.ratePerSecond))); set("eta", s.etaSeconds === null ? "-" : s.etaSeconds + " s");
    set("expired", fmt(s.expiredLeases)); set("rejected", fmt(s.rejected));
    set("elapsed", s.elapsedSeconds.toFixed(1)); set("ready", s.readySeconds === null ? "-" : s.readySeconds);
    set("updated", new Date().toLocaleTimeString()); set("error", "");
    document.getElementById("progress").style.width = (s.done / Math.max(1, s.total) * 100).toFixed(2) + "%";
    chart(s.history || []); lanes(s.workers, s.nodes); events(s.events || []);
  } catch (e) { set("error", "(" + e.message + ")"); }
}
refresh(); setInterval(refresh, 2000);
</script></body></html>
"""
