"""`GET /`: a page where a moderator pastes a comment (or opens `/?text=...`) and sees each
attribute's score as a bar, with the model's version (one self-contained HTML page; it calls
the server's own API)."""

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
async function card() {
  const r = await fetch("v1/model");
  const c = await r.json();
  const models = c.models || [c];
  attributes = models.flatMap(m => m.attributes.map(a => a.name));
  document.getElementById("version").textContent =
    "model " + c.version + " - attributes: " + attributes.join(", ");
}
async function score() {
  const key = document.getElementById("key").value;
  const body = {comment: {text: document.getElementById("text").value},
                requestedAttributes: Object.fromEntries(attributes.map(a => [a, {}]))};
  const url = "v1alpha1/comments:analyze" + (key ? "?key=" + encodeURIComponent(key) : "");
  const r = await fetch(url, {method: "POST", body: JSON.stringify(body),
                              headers: {"Content-Type": "application/json"}});
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
