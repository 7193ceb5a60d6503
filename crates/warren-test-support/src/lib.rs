//! Shared test support: start a real `warren serve` process in a temporary data directory
//! and talk to it over real HTTP.
//!
//! Tests pass the path of the binary under test (`env!("CARGO_BIN_EXE_warren")`), so this
//! crate depends on no warren library and cannot drift from what users run.

#![deny(missing_docs)]

mod cleanup;
pub use cleanup::{reap_runtimes, unmount_under, unmount_workspace_volumes};
mod cli;
pub use cli::{output_within, run_to_exit};
mod cluster;
pub use cluster::ClusterFiles;
mod docker_backend;
pub use docker_backend::{
    docker, docker_containers, docker_instance, docker_networks, remove_docker_runtimes,
    require_docker, DOCKER_TEST_IMAGE,
};
mod e2b;
pub use e2b::{E2bServer, E2B_UIDS};
mod mcp;
pub use mcp::{mcp_messages, McpSession};
mod postgres;
pub use postgres::PostgresServer;
mod redis;
pub use redis::RedisServer;
mod rootfs;
pub use rootfs::minimal_rootfs_tar;
mod s3;
pub use s3::S3Server;
mod server;
pub use server::TestServer;
pub mod deerflow_tree;
pub mod kube;
pub mod latency;
pub mod workload;

/// A token long enough for `warren serve` (I13).
pub const TEST_TOKEN: &str = "test-token-0123456789abcdef0123456789abcdef";
