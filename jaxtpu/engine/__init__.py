"""The JAX engine that every command drives: building the model, optimizer and state for a run
(`build`), placing and compiling the steps (`placement`, `steps`, `parallel`), the backend the
shared loop calls (`backend`), checkpoints, hosts, ahead-of-time programs, and loading a trained
model to score with (`scoring`). Nothing here parses a command line, and no module here
imports a command."""
