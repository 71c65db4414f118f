"use strict";
const POLL_MS = Number(document.body.dataset.pollMs || 2000);
const SVG = "http://www.w3.org/2000/svg";

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}
function time(ts) { return ts ? new Date(ts * 1000).toISOString().slice(11, 19) + "Z" : ""; }
function gb(n) { return (n / 1e9).toFixed(2) + " GB"; }
function fill(id, rows, cells) {
  const body = document.querySelector("#" + id + " tbody");
  body.replaceChildren(...rows.map((row) => {
    const tr = el("tr");
    tr.dataset.model = row.model || "";
    for (const value of cells(row)) {
      const td = el("td");
      if (value instanceof Node) td.appendChild(value); else td.textContent = value === null ? "" : String(value);
      tr.appendChild(td);
    }
    return tr;
  }));
}
function chart(demand, forecast) {
  const w = 24 * 6, h = 30, top = Math.max(1, ...demand, ...(forecast || []));
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("width", w); svg.setAttribute("height", h);
  demand.forEach((v, i) => {
    const r = document.createElementNS(SVG, "rect");
    const bh = (v / top) * h;
    r.setAttribute("x", i * 6); r.setAttribute("y", h - bh); r.setAttribute("width", 5);
    r.setAttribute("height", bh); r.setAttribute("fill", "#4a7bd0");
    svg.appendChild(r);
  });
  if (forecast && forecast.length) {
    const line = document.createElementNS(SVG, "polyline");
    line.setAttribute("points", forecast.map((v, i) => (i * 6 + 2.5) + "," + (h - (v / top) * h)).join(" "));
    line.setAttribute("fill", "none"); line.setAttribute("stroke", "#d04a4a"); line.setAttribute("stroke-width", 1.5);
    svg.appendChild(line);
  }
  const title = document.createElementNS(SVG, "title");
  title.textContent = "requests per hour: " + demand.join(", ") + (forecast ? " | forecast: " + forecast.join(", ") : "");
  svg.appendChild(title);
  return svg;
}
function bars(values) {
  const span = el("span"); const top = Math.max(1e-9, ...values);
  values.forEach((v) => { const b = el("span", null, "bar next"); b.style.height = Math.max(1, (v / top) * 24) + "px"; span.appendChild(b); });
  span.title = "expected requests per 10 min: " + values.join(", ");
  return span;
}
function where(tiers) { return Object.entries(tiers).map(([node, tier]) => node + ": " + tier).join(", "); }
function orderCells(o) { return [time(o.not_before), o.node, o.model, o.action, o.tier, o.reason, o.note]; }

function render(data) {
  document.getElementById("replica").textContent = data.active ? "active replica" : "standby replica";
  document.getElementById("updated").textContent = "updated " + time(data.at);
  document.getElementById("models-count").textContent =
    data.models.length + " of " + data.models_total + " models" + (data.demand_error ? " (demand: " + data.demand_error + ")" : "");
  fill("models", data.models, (m) => [m.model, where(m.tiers), m.hints, chart(m.demand_24h, m.forecast_24h), bars(m.forecast_next_2h)]);
  const nodes = document.getElementById("nodes");
  nodes.replaceChildren(...data.nodes.map((n) => {
    const div = el("div", null, "node"); div.dataset.node = n.node;
    div.appendChild(el("h3", n.node + " (" + n.device + ", reported " + time(n.at) + ")"));
    for (const g of n.gpus) div.appendChild(el("div", "GPU " + g.index + ": " + gb(g.used_bytes) + " of " + gb(g.capacity_bytes), "tier"));
    for (const t of n.tiers) {
      const held = t.resident.map((r) => r.model + (r.gpus.length ? " [GPU " + r.gpus.join(",") + "]" : "") + (r.prefetched ? " (prefetched, unused)" : "") + (r.leases ? " (leased)" : ""));
      div.appendChild(el("div", t.tier + " " + gb(t.used_bytes) + " / " + gb(t.capacity_bytes) + ": " + (held.join(", ") || "empty"), "tier"));
    }
    return div;
  }));
  fill("hints", data.hints, (h) => [h.model, h.source, h.eta_s + " s", h.ttl_s + " s", h.confidence]);
  fill("upcoming", data.upcoming, orderCells);
  fill("recent", data.recent, orderCells);
  fill("mispredictions", data.mispredictions, (o) => [time(o.not_before), o.node, o.model, o.tier, o.note]);
  fill("cold-starts", data.cold_starts, (c) => [time(c.minute), c.model, c.cold_starts, c.requests, c.wait_s]);
}

async function poll() {
  try {
    const response = await fetch("/status/data", { credentials: "same-origin", cache: "no-store" });
    if (response.status === 401 || response.status === 403) { window.location.assign("/status"); return; }
    if (!response.ok) throw new Error("HTTP " + response.status);
    render(await response.json());
    document.getElementById("error").textContent = "";
  } catch (err) {
    document.getElementById("error").textContent = "could not update: " + err.message;
  }
  setTimeout(poll, POLL_MS);
}
poll();
