"""A batch-invariance gate for other projects' CI: golden fingerprints and `check`.

- `fingerprint.fingerprint(GateConfig)` runs a gate's cases and records, per case, its verdict,
  the hash of every output alone and batched, the backend that ran and its rule's prediction;
- `golden.read` / `golden.write`: the versioned JSON file;
- `check.check_documents(golden, rerun)`: what moved (see `gdn_lab.gate.check`).

`gdn-lab fingerprint`, `gdn-lab check` and `gdn-lab compare` are the command line.
"""
