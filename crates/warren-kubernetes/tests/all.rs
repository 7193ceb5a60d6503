//! Integration tests of `warren-kubernetes`: one binary, modules under `tests/suite/`.
//!
//! Every manifest warren generates is validated offline against the real Kubernetes JSON
//! schemas (`kubernetes-validate --strict`, PyPI), and the pod's root init step runs on
//! real directories (as root, as in CI). No API server, scheduler or kubelet is involved:
//! admission and what a node does with these objects are not exercised here.

mod suite;
