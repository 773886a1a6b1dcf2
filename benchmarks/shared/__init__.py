"""What every benchmark uses: its kept report and the docs' measured tables (`measured`), the
machine it ran on (`machine`), and the checks and runs of those that train on the real
comments (`trainruns`)."""
