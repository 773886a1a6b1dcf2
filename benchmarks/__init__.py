"""Measurements, by what they measure: `training` (step time of both sides, epochs, data at
scale, the TPU estimates and tuning, checkpoints in a bucket), `serving` (the server and the
scorers: throughput, clients, hostile clients, languages, precision), `quality` (what the
models learn: buckets, calibration, competitions, rules, the community loop, Perspective's
scale, parity), `deploy` (installs and archives); `shared` holds what every benchmark uses
(the kept reports, the machine record, the real-comment runs)."""
