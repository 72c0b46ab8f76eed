"""What every layer above the engine does on this machine: run commands (hooks), keep the state
file (store), and bound a socket's reads in time (deadline, watched). Below coordination/,
observe/ and runtime/, which all use it, so none of them imports another through it."""
