"""`GET /`: a page where a moderator pastes a comment (or opens `/?text=...`) and sees each
attribute's score as a bar, with the model's version (one self-contained HTML page; it calls
the server's own API, sending the key it is given as the `X-Goog-Api-Key` header). The page
itself is static and holds nothing of the model, so it answers without a key; what it shows
comes from `/v1/model` and the API, which need one when the server has keys.

`HEADERS` go with it: a Content-Security-Policy that allows only its own inline script and
style (by their hashes) and calls to this server, no framing, no MIME sniffing, no referrer
(a `?key=` in the page's address stays on the page).
"""

import base64
import hashlib
import re

PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>jaxtpu serve</title>
<style>
 body { font: 15px/1.4 system-ui, sans-serif; max-width: 46rem; margin: 2rem auto;
        padding: 0 1rem; }
 textarea { width: 100%; height: 7rem; font: inherit; }
 .row { display: flex; align-items: center; margin: .35rem 0; }
 .name { width: 12rem; font-family: monospace; }
 .track { flex: 1; background: #eee; height: 1rem; margin: 0 .6rem; }
 .bar { display: block; background: #c0392b; height: 100%; width: 0; }
 .value { width: 4rem; text-align: right; font-family: monospace; }
 #version, #error { color: #555; font-size: 13px; }
 #error { color: #b00; }
</style>
</head>
<body>
<h1>Comment scores</h1>
<p id="version">model: loading...</p>
<textarea id="text" placeholder="Paste a comment"></textarea>
<p><input id="key" placeholder="API key (if the server needs one)" size="30">
<button id="score">Score</button></p>
<div id="scores"></div>
<p id="error"></p>
<script>
let attributes = [];
function keyed() {
  const key = document.getElementById("key").value;
  return key ? {"X-Goog-Api-Key": key} : {};
}
async function card() {
  const r = await fetch("v1/model", {headers: keyed()});
  const c = await r.json();
  if (c.error) {
    document.getElementById("version").textContent = "model: " + c.error.message;
    return false;
  }
  const models = c.models || [c];
  attributes = models.flatMap(m => m.attributes.map(a => a.name));
  document.getElementById("version").textContent =
    "model " + c.version + " - attributes: " + attributes.join(", ");
  return true;
}
async function score() {
  if (!attributes.length && !(await card())) return;
  const body = {comment: {text: document.getElementById("text").value},
                requestedAttributes: Object.fromEntries(attributes.map(a => [a, {}]))};
  const r = await fetch("v1alpha1/comments:analyze", {method: "POST", body: JSON.stringify(body),
                        headers: {"Content-Type": "application/json", ...keyed()}});
  const out = await r.json();
  const box = document.getElementById("scores");
  box.innerHTML = "";
  document.getElementById("error").textContent = out.error ? out.error.message : "";
  if (out.error) return;
  for (const a of attributes) {
    const v = out.attributeScores[a].summaryScore.value;
    const row = document.createElement("div");
    row.className = "row";
    row.dataset.attribute = a;
    row.innerHTML = '<span class="name"></span><span class="track"><span class="bar"></span>' +
                    '</span><span class="value"></span>';
    row.querySelector(".name").textContent = a;
    row.querySelector(".bar").style.width = (100 * v).toFixed(1) + "%";
    row.querySelector(".value").textContent = v.toFixed(3);
    box.appendChild(row);
  }
}
document.getElementById("score").addEventListener("click", score);
// ?text=... fills the box and scores it (a link to a comment's scores); ?key=... the key
const params = new URLSearchParams(location.search);
const given = params.get("text");
if (params.get("key")) document.getElementById("key").value = params.get("key");
card().then(() => { if (given) { document.getElementById("text").value = given; score(); } });
</script>
</body>
</html>
"""


def _digest(tag: str) -> str:
    """The CSP source of the page's one inline `<tag>` element: 'sha256-...' of its text."""
    body = re.search(rf"<{tag}>(.*?)</{tag}>", PAGE, re.S)
    assert body, tag
    return "'sha256-" + base64.b64encode(hashlib.sha256(body[1].encode()).digest()).decode() + "'"


HEADERS = {
    "Content-Security-Policy": (
        f"default-src 'none'; script-src {_digest('script')}; style-src {_digest('style')}; "
        "connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; "
        "frame-ancestors 'none'"
    ),
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}
