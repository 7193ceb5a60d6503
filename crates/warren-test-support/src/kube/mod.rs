//! Kubernetes for tests: the fake API server and simulated kubelet of `warren-kube-fake`
//! (re-exported here, so a test names one crate), and the real single-node cluster of
//! `scripts/k8s-cluster` ([`real`], issue 39).

pub use warren_kube_fake::*;

pub mod real;
