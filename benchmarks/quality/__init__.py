"""What the models learn, on real comments: length buckets against padding, calibration, the
Jigsaw competitions and the rules task, a decoder learning, the community loop (a fine-tune
and a head), Perspective's scale, and the parity checks kept as reports."""
