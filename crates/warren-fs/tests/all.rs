//! Integration tests of `warren-fs`: one binary, modules under `tests/suite/`.
//!
//! Every behavioural test runs once per [`warren_fs::Resolver`], so the `openat2` path and the
//! portable `O_NOFOLLOW` walk are held to the same contract.

mod suite;
