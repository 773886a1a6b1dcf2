"""The proof that the port computes the same thing: outputs, gradients, loss trajectories and
metrics of the two sides compared, the layer-by-layer bisection, and the report."""
