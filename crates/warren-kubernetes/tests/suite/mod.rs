//! Test modules.

mod deploy;
mod manifests;
mod prepare;
mod support;
mod validate;
