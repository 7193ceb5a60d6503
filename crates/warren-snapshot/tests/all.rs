//! The integration tests of warren-snapshot, in one binary: the engine on real trees, and
//! the behaviour every store must have, run against the local store and a real S3 server.

mod suite;
