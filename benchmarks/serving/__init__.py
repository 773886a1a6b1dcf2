"""The server and the scorers: `jaxtpu serve` under load and against what users write instead,
every Perspective client, hostile clients, the language detector on real comments, scoring
speed and precision, ONNX profiles, scoring a run while it trains."""
